package redisurl

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// ping parses raw, connects and pings with a short timeout.
func ping(t *testing.T, raw string, timeout time.Duration) error {
	t.Helper()
	u, err := Parse(raw)
	require.NoError(t, err)
	c := u.NewClient()
	defer c.Close()
	return u.Ping(context.Background(), c, timeout)
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := redistest.FreePort()
	require.NoError(t, err)
	return p
}

func requireUnreachable(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, ErrUnreachable)
	var ue *UnreachableError
	require.ErrorAs(t, err, &ue)
	require.NotNil(t, ue.Err)
	require.Equal(t, want, err.Error())
}

func TestPingOK(t *testing.T) {
	t.Parallel()
	url := redistest.URL(t)
	require.NoError(t, ping(t, url, 0))
	// memory:// connects to whatever serves that address (a worker's embedded Redis).
	require.NoError(t, ping(t, "memory://"+strings.TrimPrefix(url, "redis://"), 0))
}

func TestPingAsynqOptReachesTheSameServer(t *testing.T) {
	t.Parallel()
	u, err := Parse(redistest.URL(t))
	require.NoError(t, err)
	c, ok := u.AsynqOpt().MakeRedisClient().(redis.UniversalClient)
	require.True(t, ok)
	defer c.Close()
	require.NoError(t, c.Ping(context.Background()).Err())
}

func TestPingConnectionRefused(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// the client counts its dials: the probe finds the refusal first, so
	// the client, which would dial again for about 1.5 s, never dials
	u, err := Parse("redis://" + addr)
	require.NoError(t, err)
	var dials atomic.Int32
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, a)
	}})
	defer c.Close()
	err = u.Ping(context.Background(), c, 5*time.Second)
	requireUnreachable(t, err, "cannot reach Redis at "+addr+": connection refused; is redis-server running? set --redis or SLUICE_REDIS_URL")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Zero(t, dials.Load(), "a refused connection is reported at once, not after the client's dial retries")

	err = ping(t, "memory://"+addr, 0)
	requireUnreachable(t, err, "cannot reach Redis at "+addr+": connection refused; is a worker started with --redis memory://"+addr+" running? set --redis or SLUICE_REDIS_URL")

	err = ping(t, "redis+sentinel://"+addr+"/mymaster", 0)
	requireUnreachable(t, err, "cannot reach Redis at Sentinel "+addr+" (master mymaster): connection refused; are the Sentinels running? set --redis or SLUICE_REDIS_URL")

	err = ping(t, "redis+cluster://"+addr, 0)
	requireUnreachable(t, err, "cannot reach Redis at Cluster "+addr+": connection refused; is redis-server running? set --redis or SLUICE_REDIS_URL")
}

func TestPingNoAnswer(t *testing.T) {
	t.Parallel()
	// A listener that accepts connections and never answers, like a frozen server.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range conns {
					_ = c.Close()
				}
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { _ = l.Close(); <-done })
	u, err := Parse("redis://" + l.Addr().String())
	require.NoError(t, err)
	// An interactive client gives up at the deadline.
	c := u.NewInteractiveClient()
	defer c.Close()
	start := time.Now()
	err = u.Ping(context.Background(), c, 300*time.Millisecond)
	took := time.Since(start)
	require.Less(t, took, 2*time.Second)
	// the message says how long it waited: the deadline, or a little more
	// on a busy machine
	var ue *UnreachableError
	require.ErrorAs(t, err, &ue)
	said, perr := time.ParseDuration(strings.TrimPrefix(ue.Reason, "no answer within "))
	require.NoError(t, perr, ue.Reason)
	require.GreaterOrEqual(t, said, 300*time.Millisecond, ue.Reason)
	require.LessOrEqual(t, said, took+10*time.Millisecond, "waited %s, said %q", took, ue.Reason)
	requireUnreachable(t, err, "cannot reach Redis at "+l.Addr().String()+": "+ue.Reason+"; is the address right and the server up (a firewall may drop the packets)? set --redis or SLUICE_REDIS_URL")

	// go-redis's own client waits out its read timeout: the message says
	// how long it really waited, not the deadline it was given.
	c2 := u.NewClient()
	defer c2.Close()
	start = time.Now()
	err = u.Ping(context.Background(), c2, 300*time.Millisecond)
	took = time.Since(start)
	require.ErrorAs(t, err, &ue)
	said, perr = time.ParseDuration(strings.TrimPrefix(ue.Reason, "no answer within "))
	require.NoError(t, perr, ue.Reason)
	require.InDelta(t, took.Seconds(), said.Seconds(), 0.2, "waited %s, said %q", took, ue.Reason)
}

func TestPingUnknownHost(t *testing.T) {
	t.Parallel()
	err := ping(t, "redis://no-such-host.invalid:6379", time.Second)
	require.ErrorIs(t, err, ErrUnreachable)
	var ue *UnreachableError
	require.ErrorAs(t, err, &ue)
	// Resolvers differ in how they fail (no such host, or no answer without DNS).
	require.Contains(t, []string{`host "no-such-host.invalid" not found`, "no answer within 1s"}, ue.Reason)
}

func TestPingCancelled(t *testing.T) {
	t.Parallel()
	u, err := Parse("redis://127.0.0.1:" + strconv.Itoa(freePort(t)))
	require.NoError(t, err)
	c := u.NewClient()
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, u.Ping(ctx, c, 0), context.Canceled)
}

func TestPingAuth(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	ctx := context.Background()
	user := "sluice-" + strconv.Itoa(freePort(t))
	require.NoError(t, client.Do(ctx, "ACL", "SETUSER", user, "on", ">p@ss:word", "~*", "+@all").Err())
	t.Cleanup(func() { _ = client.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	addr := strings.TrimPrefix(redistest.URL(t), "redis://")

	require.NoError(t, ping(t, "redis://"+user+":p%40ss%3Aword@"+addr, 0))
	err := ping(t, "redis://"+user+":wrong@"+addr, 0)
	requireUnreachable(t, err, "cannot reach Redis at "+addr+": user name or password rejected; check USER:PASSWORD in the URL")

	// A server that requires a password and gets none.
	srv := startRedis(t, "--requirepass", "secret")
	err = ping(t, "redis://"+srv, 0)
	requireUnreachable(t, err, "cannot reach Redis at "+srv+": the server requires a password; add USER:PASSWORD@ to the URL (redis://USER:PASSWORD@HOST:PORT)")
	require.NoError(t, ping(t, "redis://:secret@"+srv, 0))
}

func TestPingTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeCert(t, dir)
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	startRedisAt(t, port, true,
		"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "cert.pem"),
		"--tls-key-file", filepath.Join(dir, "key.pem"),
		"--tls-ca-cert-file", filepath.Join(dir, "cert.pem"),
		"--tls-auth-clients", "no")

	require.NoError(t, ping(t, "rediss://"+addr+"?skip_verify=true", 0))

	err := ping(t, "rediss://"+addr, 0)
	require.ErrorIs(t, err, ErrUnreachable)
	require.True(t, strings.HasPrefix(err.Error(), "cannot reach Redis at "+addr+": the server's TLS certificate is not trusted ("), err.Error())
	require.True(t, strings.HasSuffix(err.Error(), "install its CA in the system's trust store, or add ?skip_verify=true for a test server only"), err.Error())

	err = ping(t, "redis://"+addr, time.Second)
	require.ErrorIs(t, err, ErrUnreachable)
	var ue *UnreachableError
	require.ErrorAs(t, err, &ue)
	require.Contains(t, []string{"the server closed the connection", "no answer within 1s"}, ue.Reason)

	// TLS spoken to a plain server.
	plain := strings.TrimPrefix(redistest.URL(t), "redis://")
	// Redis answers the TLS hello only when its random bytes hold a newline.
	err = ping(t, "rediss://"+plain+"?skip_verify=true", time.Second)
	require.ErrorIs(t, err, ErrUnreachable)
	require.Contains(t, []string{
		"cannot reach Redis at " + plain + ": the server did not answer in TLS; use redis:// (without the s) for a server without TLS",
		"cannot reach Redis at " + plain + ": no answer within 1s; is the address right, the server up and speaking TLS (use redis:// for a server without TLS)? set --redis or SLUICE_REDIS_URL",
	}, err.Error())
}

func TestPingSentinel(t *testing.T) {
	t.Parallel()
	master := strings.TrimPrefix(redistest.URL(t), "redis://")
	host, port, err := net.SplitHostPort(master)
	require.NoError(t, err)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	sport := freePort(t)
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(
		"port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster %s %s 1\n", sport, dir, host, port)), 0o600))
	saddr := startRedisAt(t, sport, false, conf, "--sentinel")

	u, err := Parse("redis+sentinel://" + saddr + "/mymaster")
	require.NoError(t, err)
	c := u.NewClient()
	defer c.Close()
	require.NoError(t, u.Ping(context.Background(), c, 0))
	key := "redisurl-sentinel-" + strconv.Itoa(sport)
	require.NoError(t, c.Set(context.Background(), key, "via sentinel", time.Minute).Err())
	got, err := redistest.Client(t).Get(context.Background(), key).Result()
	require.NoError(t, err)
	require.Equal(t, "via sentinel", got)

	ac, ok := u.AsynqOpt().MakeRedisClient().(redis.UniversalClient)
	require.True(t, ok)
	defer ac.Close()
	require.NoError(t, ac.Ping(context.Background()).Err())

	// asynq's form of the same
	require.NoError(t, ping(t, "redis-sentinel://"+saddr+"?master=mymaster", 0))

	err = ping(t, "redis+sentinel://"+saddr+"/nosuchmaster", time.Second)
	requireUnreachable(t, err, "cannot reach Redis at Sentinel "+saddr+" (master nosuchmaster): the Sentinels know no master named \"nosuchmaster\"; check MASTER in redis+sentinel://HOST:PORT/MASTER (redis-cli -p 26379 SENTINEL MASTERS lists them)")
}

func TestPingCluster(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t, &redistest.Options{Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}})
	ctx := context.Background()
	node := srv.Client(t)
	require.NoError(t, node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := node.ClusterInfo(ctx).Result()
		require.NoError(t, err)
		if strings.Contains(info, "cluster_state:ok") {
			break
		}
		require.True(t, time.Now().Before(deadline), "cluster did not become ok: %s", info)
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, ping(t, "redis+cluster://"+srv.Addr(), 0))

	u, err := Parse("redis+cluster://" + srv.Addr())
	require.NoError(t, err)
	ac, ok := u.AsynqOpt().MakeRedisClient().(*redis.ClusterClient)
	require.True(t, ok)
	defer ac.Close()
	require.NoError(t, ac.Ping(ctx).Err())

	// The Cluster form pointed at a server that is not a Cluster.
	plain := strings.TrimPrefix(redistest.URL(t), "redis://")
	err = ping(t, "redis+cluster://"+plain, 0)
	requireUnreachable(t, err, "cannot reach Redis at Cluster "+plain+": the server is not part of a Redis Cluster; use redis://HOST:PORT for a single server")
}

// startRedis runs a redis-server of this test's own on a free port.
func startRedis(t *testing.T, args ...string) string {
	t.Helper()
	port := freePort(t)
	return startRedisAt(t, port, false, append([]string{"--port", strconv.Itoa(port)}, args...)...)
}

// startRedisAt runs redis-server with args (a config file, if any, first)
// and waits until port accepts connections; the process is killed when the
// test ends.
func startRedisAt(t *testing.T, port int, tls bool, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	base := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", ""}
	if len(args) > 0 && !strings.HasPrefix(args[0], "--") {
		base = append([]string{args[0]}, base...)
		args = args[1:]
	}
	cmd := exec.Command(redistest.Binary(), append(base, args...)...)
	out := &clitest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return addr
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("redis-server %v exited: %v: %s", args, err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s: %s", addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 and its key.
func writeCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
}

// TestPingUnixSocket: unix:// and asynq's redis-socket:// reach a server
// through its unix socket, with the database of ?db=, from go-redis and
// from asynq alike; a missing socket is named.
func TestPingUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "redis.sock")
	srv := redistest.NewServer(t, &redistest.Options{Args: []string{"--unixsocket", sock, "--unixsocketperm", "700"}})
	tcp := redis.NewClient(&redis.Options{Addr: srv.Addr(), DB: 2})
	defer tcp.Close()
	ctx := context.Background()
	for _, raw := range []string{"unix://" + sock + "?db=2", "redis-socket://" + sock + "?db=2"} {
		u, err := Parse(raw)
		require.NoError(t, err)
		c := u.NewClient()
		require.NoError(t, u.Ping(ctx, c, 0), raw)
		require.NoError(t, c.Set(ctx, "via", raw, time.Minute).Err())
		require.NoError(t, c.Close())
		got, err := tcp.Get(ctx, "via").Result()
		require.NoError(t, err)
		require.Equal(t, raw, got, "the socket's database 2 is the server's")

		ac, ok := u.AsynqOpt().MakeRedisClient().(redis.UniversalClient)
		require.True(t, ok)
		got, err = ac.Get(ctx, "via").Result()
		require.NoError(t, ac.Close())
		require.NoError(t, err)
		require.Equal(t, raw, got)
	}
	missing := filepath.Join(t.TempDir(), "none.sock")
	err := ping(t, "unix://"+missing, time.Second)
	requireUnreachable(t, err, "cannot reach Redis at unix socket "+missing+": no socket at that path; is redis-server running with unixsocket "+missing+"? set --redis or SLUICE_REDIS_URL")
}
