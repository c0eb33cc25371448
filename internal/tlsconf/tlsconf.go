// Package tlsconf builds the TLS settings of a broker connection from its
// configuration keys, for every transport alike.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
)

// FromFiles returns base (nil for none) with the certificate authorities of
// caFile (a PEM file, instead of the system roots) and serverName (checked
// against the server's certificate) applied. It returns nil when all three
// are unset: TLS off. The error names the file and says what is wrong
// with it.
func FromFiles(base *tls.Config, caFile, serverName string) (*tls.Config, error) {
	if base == nil && caFile == "" && serverName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		cfg = base.Clone()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%q holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if serverName != "" {
		cfg.ServerName = serverName
	}
	return cfg, nil
}

// CheckServerName reports a TLS server name that is not a bare host name
// (it has a port, a scheme or a space); "" is fine (unset).
func CheckServerName(n string) error {
	if n == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(n); err == nil || strings.ContainsAny(n, " \t/") {
		return fmt.Errorf("%q is not a host name (no port, scheme or spaces)", n)
	}
	return nil
}
