package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

// ErrClosed is returned by Publish and Subscribe after Close. A Publish
// refused for it is transient: the message was not attempted.
var ErrClosed = errors.New("redis transport: closed")

// classify marks err transient when it says Redis could not be reached or
// could not take the command for now; any other error keeps its class. See
// isTransient for the list.
func classify(err error) error {
	if err == nil || !isTransient(err) {
		return err
	}
	return bus.Transient(err)
}

// isTransient reports whether err is an outage rather than a refusal of
// this command: an attempt must not be spent on it. It covers every error
// go-redis v9 defines (error.go, internal/proto/redis_errors.go):
//
//   - Redis unreachable or the connection lost: network errors (refused,
//     reset, timeouts), EOF, an exhausted or timed-out pool, a closed
//     client, a context deadline or cancellation of a call that did not
//     get to Redis (Publish's own wait classifies its message's deadline as
//     counted, see contextEnded), this transport closed;
//     TLS failing to verify the server (an operator fixes certificates, the
//     message is not at fault).
//   - Redis there but not taking writes for now: OOM (maxmemory), LOADING,
//     READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY (a script running),
//     NOREPLICAS, max number of clients, MOVED and ASK that outlived the
//     cluster client's redirects.
//   - Redis refusing our credentials or ACL: NOAUTH, WRONGPASS, NOPERM. A
//     relay then stops spending attempts until the ACL is fixed, and nothing
//     is lost.
//
// Replies that refuse this command for a reason of its own stay counted:
// WRONGTYPE, NOSCRIPT, NOGROUP, BUSYGROUP, CROSSSLOT, EXECABORT, a value
// over the server's proto-max-bulk-len ("ERR Protocol error"), and any
// other error. A message that can never be written then runs out of
// attempts instead of holding its key forever.
func isTransient(err error) bool {
	var (
		netErr    net.Error
		certErr   *tls.CertificateVerificationError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		alert     tls.AlertError
	)
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled),
		errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, redis.ErrClosed),
		errors.Is(err, ErrClosed),
		errors.As(err, &certErr),
		errors.As(err, &authority),
		errors.As(err, &hostname),
		errors.As(err, &invalid),
		errors.As(err, &record),
		errors.As(err, &alert),
		redis.IsOOMError(err),
		redis.IsLoadingError(err),
		redis.IsReadOnlyError(err),
		redis.IsMasterDownError(err),
		redis.IsClusterDownError(err),
		redis.IsTryAgainError(err),
		redis.IsNoReplicasError(err),
		redis.IsMaxClientsError(err),
		redis.IsAuthError(err),
		redis.IsPermissionError(err),
		isBusyError(err),
		isRedirect(err):
		return true
	}
	return false
}

// refusedCredentials reports an error of the credentials or the TLS
// certificates: Redis refusing the user or password (NOAUTH, WRONGPASS,
// NOPERM), or the server's certificate failing verification.
func refusedCredentials(err error) bool {
	var (
		certErr   *tls.CertificateVerificationError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	return redis.IsAuthError(err) || redis.IsPermissionError(err) ||
		errors.As(err, &certErr) || errors.As(err, &authority) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// isBusyError reports a BUSY reply (a script or function runs past its time
// limit). go-redis has no typed error for it; the reply's error code is the
// protocol's way to say it. "BUSYGROUP" does not match.
func isBusyError(err error) bool {
	return redis.HasErrorPrefix(err, "BUSY ")
}

func isRedirect(err error) bool {
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	_, ok := redis.IsAskError(err)
	return ok
}

// allTransient reports whether every error joined in err (or err itself)
// is transient: a multi-entry Publish is an outage only if each of its
// failed entries failed for one.
func allTransient(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !allTransient(e) {
				return false
			}
		}
		return true
	}
	return isTransient(err)
}
