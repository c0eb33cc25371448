// Package prom holds what omnibus's metrics share: registering a collector
// on a registry that may already hold an equal one.
package prom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it. If reg already holds an
// equal collector (same names, labels and help: another component built on
// the same registry registered it first), that one is returned instead, so
// that several components of one process share their metrics.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	var zero T
	return zero, fmt.Errorf("register metrics: %w", err)
}
