package nats

import (
	"net/url"
	"strings"
)

// redactURL is a server URL (or a comma-separated list of them) without
// credentials: a user:password or a token before the host shows as "***".
func redactURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		u, err := url.Parse(p)
		if err != nil {
			parts[i] = "(a NATS URL that does not parse)"
			continue
		}
		if u.User != nil {
			u.User = url.User("***")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}
