package redisurl

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/human"
)

// PingTimeoutDefault is how long Ping waits for an answer when given no timeout.
const PingTimeoutDefault = 2 * time.Second

// ErrUnreachable is matched (errors.Is) by every error Ping returns for a
// server that cannot be used.
var ErrUnreachable = errors.New("redis unreachable")

// UnreachableError says, in one line, why the server at Where cannot be
// used and what to do: "cannot reach Redis at 127.0.0.1:6390: connection
// refused; is redis-server running? set --redis or SLUICE_REDIS_URL".
type UnreachableError struct {
	Where  string // the address(es), see URL.Where
	Reason string // short: "connection refused", "no answer within 2s", …
	Hint   string // what to do
	Err    error  // the client's error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach Redis at %s: %s; %s", e.Where, e.Reason, e.Hint)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnreachable) match.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

const setURL = "set --redis or " + EnvVar

// Ping checks that the server(s) of u answer client (made by u.NewClient)
// within timeout (PingTimeoutDefault when 0). A failure is an
// *UnreachableError naming the address, the reason and the fix, in place of
// the client's stack of retries; a cancelled ctx is returned as it is.
func (u *URL) Ping(ctx context.Context, client redis.UniversalClient, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = PingTimeoutDefault
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	if u.Kind == KindSentinel {
		// The failover client retries the Sentinels until the deadline and
		// then reports only that; ask them directly to say why.
		err = u.pingSentinels(pctx)
	}
	if err == nil && u.Kind != KindSentinel {
		err = u.probe(pctx)
	}
	if err == nil {
		err = client.Ping(pctx).Err()
	}
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return u.explain(err, time.Since(start))
}

// probe opens a connection to each address until one accepts: a
// refused connection is known at once, where the client would dial again
// several times (about 1.5 s) before saying so. It returns nil when any
// address accepts, else the first error.
func (u *URL) probe(ctx context.Context) error {
	var first error
	var d net.Dialer
	for _, addr := range u.Addrs {
		c, err := d.DialContext(ctx, cmp.Or(u.Network, "tcp"), addr)
		if err == nil {
			_ = c.Close()
			return nil
		}
		first = cmp.Or(first, err)
	}
	return first
}

// pingSentinels returns nil when any Sentinel answers, else the first error.
func (u *URL) pingSentinels(ctx context.Context) error {
	var first error
	for _, addr := range u.Addrs {
		sc := redis.NewSentinelClient(&redis.Options{
			Addr:        addr,
			Username:    u.SentinelUsername,
			Password:    u.SentinelPassword,
			TLSConfig:   u.tlsConfig(),
			DialTimeout: u.DialTimeout,
			MaxRetries:  -1,
		})
		err := sc.Ping(ctx).Err()
		_ = sc.Close()
		if err == nil {
			return nil
		}
		first = cmp.Or(first, err)
	}
	return first
}

// explain turns a client error into an UnreachableError; waited is how
// long the server was waited for.
func (u *URL) explain(err error, waited time.Duration) *UnreachableError {
	e := &UnreachableError{Where: u.Where(), Err: err, Reason: oneLine(err.Error()), Hint: "check the URL; " + setURL}
	running := "is redis-server running? " + setURL
	switch u.Kind {
	case KindMemory:
		running = fmt.Sprintf("is a worker started with --redis memory://%s running? %s", u.Addrs[0], setURL)
	case KindSentinel:
		running = "are the Sentinels running? " + setURL
	}
	var (
		dnsErr   *net.DNSError
		recErr   tls.RecordHeaderError
		certErr  *tls.CertificateVerificationError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		redisErr redis.Error
	)
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		e.Reason, e.Hint = "connection refused", running
	case u.Network == "unix" && errors.Is(err, syscall.ENOENT):
		e.Reason, e.Hint = "no socket at that path", "is redis-server running with unixsocket "+u.Addrs[0]+"? "+setURL
	case u.Network == "unix" && errors.Is(err, syscall.EACCES):
		e.Reason, e.Hint = "permission denied", "let this user reach the socket (redis-server's unixsocketperm, the directory's permissions)"
	case errors.As(err, &dnsErr):
		e.Reason, e.Hint = fmt.Sprintf("host %q not found", dnsErr.Name), "check the host name; "+setURL
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		e.Reason = fmt.Sprintf("no answer within %s", human.Duration(waited.Round(10*time.Millisecond)))
		e.Hint = "is the address right and the server up (a firewall may drop the packets)? " + setURL
		if u.TLS {
			e.Hint = "is the address right, the server up and speaking TLS (use redis:// for a server without TLS)? " + setURL
		}
	case errors.As(err, &recErr):
		e.Reason, e.Hint = "the server did not answer in TLS", "use redis:// (without the s) for a server without TLS"
	case errors.As(err, &certErr) || errors.As(err, &authErr) || errors.As(err, &hostErr):
		e.Reason = "the server's TLS certificate is not trusted (" + oneLine(msg) + ")"
		e.Hint = "install its CA in the system's trust store, or add ?skip_verify=true for a test server only"
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		e.Reason = "the server closed the connection"
		if !u.TLS {
			e.Hint = "if the server expects TLS use rediss://; otherwise check it accepts connections from here"
		} else {
			e.Hint = "check the server accepts connections from here"
		}
	case strings.Contains(msg, "all sentinels specified in configuration are unreachable") && errors.Is(err, redis.Nil):
		e.Reason = fmt.Sprintf("the Sentinels know no master named %q", u.MasterName)
		e.Hint = "check MASTER in redis+sentinel://HOST:PORT/MASTER (redis-cli -p 26379 SENTINEL MASTERS lists them)"
	case strings.Contains(msg, "all sentinels specified in configuration are unreachable"):
		e.Reason, e.Hint = "no Sentinel answered", running
	case errors.As(err, &redisErr) || strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS"):
		switch {
		case strings.HasPrefix(msg, "NOAUTH"):
			e.Reason, e.Hint = "the server requires a password", "add USER:PASSWORD@ to the URL (redis://USER:PASSWORD@HOST:PORT)"
		case strings.HasPrefix(msg, "WRONGPASS"), strings.Contains(msg, "invalid password"), strings.Contains(msg, "invalid username-password"):
			e.Reason, e.Hint = "user name or password rejected", "check USER:PASSWORD in the URL"
		case strings.Contains(msg, "cluster support disabled"):
			e.Reason, e.Hint = "the server is not part of a Redis Cluster", "use redis://HOST:PORT for a single server"
		case strings.Contains(msg, "DB index is out of range"), strings.Contains(msg, "invalid DB index"):
			e.Reason, e.Hint = "the server has no database "+fmt.Sprint(u.DB), "use a smaller /DB in the URL"
		default:
			e.Reason, e.Hint = "the server answered "+oneLine(msg), "check the URL and the server's configuration"
		}
	}
	return e
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
