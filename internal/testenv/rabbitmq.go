package testenv

import (
	"os"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultRabbitMQURL is used when OMNIBUS_TEST_RABBITMQ_URL is not set.
const DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"

// RabbitMQURL returns the URL of the RabbitMQ server tests use.
func RabbitMQURL() string {
	if u := os.Getenv("OMNIBUS_TEST_RABBITMQ_URL"); u != "" {
		return u
	}
	return DefaultRabbitMQURL
}

var (
	rabbitOnce sync.Once
	rabbitErr  error
)

// RabbitMQ returns the server's URL after checking, once per test binary,
// that it is reachable; it fails the test with how to start it when not.
func RabbitMQ(t testing.TB) string {
	t.Helper()
	rabbitOnce.Do(func() {
		conn, err := amqp.Dial(RabbitMQURL())
		if err != nil {
			rabbitErr = err
			return
		}
		_ = conn.Close()
	})
	if rabbitErr != nil {
		t.Fatalf("RabbitMQ is not reachable at %s: %v\n"+
			"Start it with `make services` (or set OMNIBUS_TEST_RABBITMQ_URL to a server you run).",
			strings.Replace(RabbitMQURL(), "guest:guest@", "guest:***@", 1), rabbitErr)
	}
	return RabbitMQURL()
}

// RabbitMQPrefix returns an exchange prefix unique to the test
// ("omnibus.test.<name>.").
func RabbitMQPrefix(t testing.TB) string {
	t.Helper()
	RabbitMQ(t)
	return "omnibus.test." + Name(t) + "."
}
