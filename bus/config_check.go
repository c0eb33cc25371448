package bus

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Check collects the invalid keys of a configuration: Config.Validate uses
// it, and so do the transports' section validators (Transport.Validate),
// so that a rule and its wording exist once. Each problem is a *ConfigError
// naming its key; values are quoted with Quote (credentials masked).
type Check struct {
	errs    []error
	secrets []string // scrubbed from every reason
}

// Fail records that field is invalid, for the reason format makes of args.
func (c *Check) Fail(field, format string, args ...any) {
	c.errs = append(c.errs, &ConfigError{Field: field, Reason: scrub(fmt.Sprintf(format, args...), c.secrets)})
}

// Err returns the problems recorded, joined (nil when none).
func (c *Check) Err() error { return errors.Join(c.errs...) }

// Quote quotes a value for a message, credentials masked: a value that is
// not meant to hold a secret may hold one by mistake (redis://u:pw@host).
func Quote(value string) string { return strconv.Quote(redactValue(value)) }

// OneOf checks that value is one of accepted.
func (c *Check) OneOf(field, value string, accepted ...string) {
	if !slices.Contains(accepted, value) {
		c.Fail(field, "%s is not one of %s", Quote(value), strings.Join(accepted, ", "))
	}
}

// NotNegative checks n >= 0.
func (c *Check) NotNegative(field string, n int64) {
	if n < 0 {
		c.Fail(field, "must not be negative, got %d", n)
	}
}

// UpTo checks 0 <= n <= limit: the limit is what the value is stored in
// (an int32 column, a pool size) or what a sane process can allocate.
func (c *Check) UpTo(field string, n, limit int64) {
	c.NotNegative(field, n)
	if n > limit {
		c.Fail(field, "at most %d, got %d", limit, n)
	}
}

// NotNegativeDuration checks d >= 0.
func (c *Check) NotNegativeDuration(field string, d time.Duration) {
	if d < 0 {
		c.Fail(field, "must not be negative, got %s", d)
	}
}

// HostPort checks that addr is host:port with a port from 0 to 65535.
func (c *Check) HostPort(field, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		c.Fail(field, "%s is not host:port", Quote(addr))
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		c.Fail(field, "%s: port %s is not a number from 0 to 65535", Quote(addr), Quote(port))
	}
}

// sectionErrors records the errors of a section's Validate under the
// section's key: a *ConfigError's Field is prefixed with key, any other
// error becomes one on key itself.
func (c *Check) sectionErrors(key string, err error) {
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		field, reason := key, err.Error()
		if ce := (*ConfigError)(nil); errors.As(err, &ce) {
			reason = ce.Reason
			if ce.Field != "" {
				field = key + "." + ce.Field
			}
		}
		c.Fail(field, "%s", reason)
	}
	if err != nil {
		walk(err)
	}
}

// PartitionInterval checks a partition interval: 0 (one table), or between
// MinPartitionInterval and MaxPartitionInterval in whole minutes.
func (c *Check) PartitionInterval(field string, d time.Duration) {
	switch {
	case d == 0:
	case d < MinPartitionInterval || d > MaxPartitionInterval:
		c.Fail(field, "must be 0 (one table) or from %s to %s (31 days), got %s", MinPartitionInterval, MaxPartitionInterval, d)
	case d%time.Minute != 0:
		c.Fail(field, "must be a whole number of minutes, got %s", d)
	}
}
