package rabbitmq

import "net/url"

// redactURL is url without its password, for errors and logs.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an AMQP URL that does not parse)"
	}
	return u.Redacted()
}
