// Package redistest starts private redis-server processes for sluice's tests:
// single servers and Redis Clusters.
//
// Every test binary gets its own server on a free loopback port, with no
// persistence and a temporary working directory that is removed afterwards.
// Tests share it through isolated key prefixes (Prefix) and never flush it.
// A test that needs to stop, freeze or restart Redis starts a server of its
// own with NewServer. Setting REDIS_URL points the shared client at an
// existing server instead; redistest never connects to a server it did not
// start unless told to.
//
// Typical use:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		client, prefix := redistest.Client(t), redistest.Prefix(t)
//		...
//	}
//
// # Redis Cluster
//
// NewCluster starts a private Cluster: three masters (ClusterOptions.Masters)
// with ClusterOptions.Replicas replicas each, every node a redis-server
// --cluster-enabled yes process in its own directory on a free loopback port
// whose bus port (port+10000) is free too. The slots are split evenly with
// CLUSTER ADDSLOTSRANGE, the nodes joined with CLUSTER MEET, the replicas
// attached with CLUSTER REPLICATE, and NewCluster returns once every node
// reports cluster_state:ok and all agree on the slot map. Node(i) is a
// *Server, so a test can Kill, Freeze, Thaw or Restart any node, then call
// Wait for the Cluster to settle (a replica's promotion, a node's return):
//
//	c := redistest.NewCluster(t, &redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Second})
//	client := c.Client(t)         // *redis.ClusterClient; c.URL() is redis+cluster://…
//	c.MasterOf(slot).Kill()       // its replica takes over after NodeTimeout
//	c.Wait(t, 10*time.Second)
//
// Like the shared server, one shared Cluster per test binary is started on
// first use (ClusterClient, ClusterURL; REDIS_CLUSTER_URL names an existing
// one instead) and stopped by Main.
//
// # The Cluster pass
//
// With SLUICE_TEST_CLUSTER=1 (ClusterMode), UniversalClient and
// ExampleClient return a client of the shared Cluster instead of the shared
// server, so a suite written against redis.UniversalClient runs unchanged
// on a Cluster; `make test-cluster` runs the packages that opt in this way.
// Whatever must see the whole data set (SCAN, KEYS, INFO) goes through
// ForEachMaster. A test about single-node behaviour calls SkipOnCluster with
// the reason; Client and NewServer always give a single server.
//
//	func TestSomething(t *testing.T) {
//		client, prefix := redistest.UniversalClient(t), redistest.Prefix(t)
//		...
//	}
//
// Every process redistest starts is killed by its pid when the test (or
// Main) ends, and dies with the test binary if that is killed (Pdeathsig).
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Binary is the redis-server program started by this package; override with
// REDIS_SERVER.
func Binary() string {
	if b := os.Getenv("REDIS_SERVER"); b != "" {
		return b
	}
	return "redis-server"
}

var (
	shared     *Server
	sharedURL  string
	sharedOnce sync.Once
	sharedErr  error
	prefixSeq  atomic.Int64
)

// Main runs the tests, stops the shared server if one was started, and
// checks that no test left a goroutine running (goleak options may name
// goroutines to ignore). Call it from TestMain. When REDIS_URL is set the
// tests use that server instead of starting one.
func Main(m *testing.M, leakOpts ...goleak.Option) {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	if sharedCluster != nil {
		sharedCluster.stop()
	}
	if code == 0 {
		if err := goleak.Find(leakOpts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// URL returns the redis:// URL of the shared server, starting it on first use.
func URL(tb testing.TB) string {
	tb.Helper()
	u, err := sharedServerURL()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return u
}

func sharedServerURL() (string, error) {
	sharedOnce.Do(func() {
		if u := os.Getenv("REDIS_URL"); u != "" {
			sharedURL = u
			return
		}
		shared, sharedErr = start(Options{})
		if sharedErr == nil {
			sharedURL = shared.URL()
		}
	})
	return sharedURL, sharedErr
}

// ExampleClient is UniversalClient and Prefix for Example functions, which
// have no testing.TB: it returns a new client of the shared server (of the
// shared Cluster in the Cluster pass) and a key prefix no other caller uses.
// The caller closes the client; Main stops the server. It panics when no
// server can be reached, which only ever happens inside go test, where a
// panicking example fails.
func ExampleClient() (redis.UniversalClient, string) {
	prefix := fmt.Sprintf("t%d.%d.example", os.Getpid(), prefixSeq.Add(1))
	if ClusterMode() {
		addrs, err := sharedClusterAddrs()
		if err != nil {
			panic(fmt.Sprintf("redistest: %v", err))
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}), prefix
	}
	u, err := sharedServerURL()
	if err != nil {
		panic(fmt.Sprintf("redistest: %v", err))
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		panic(fmt.Sprintf("redistest: REDIS_URL: %v", err))
	}
	return redis.NewClient(opt), prefix
}

// Client returns a client of the shared server, closed when the test ends.
func Client(tb testing.TB) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(URL(tb))
	if err != nil {
		tb.Fatalf("redistest: REDIS_URL: %v", err)
	}
	opt.PoolSize = 128
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix no other test of this process uses.
func Prefix(tb testing.TB) string {
	tb.Helper()
	name := strings.NewReplacer("/", ".", " ", "_", "{", "(", "}", ")", ":", ".").Replace(tb.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return fmt.Sprintf("t%d.%d.%s", os.Getpid(), prefixSeq.Add(1), name)
}

// Options configure a private server.
type Options struct {
	// AppendOnly turns on AOF with appendfsync everysec, so data survives Restart.
	AppendOnly bool
	// Args are extra redis-server arguments, e.g. {"--maxmemory", "10mb"}.
	Args []string
	// Port is the port to listen on; 0 picks a free one.
	Port int
}

// Server is a redis-server process owned by a test.
type Server struct {
	opts Options
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *strings.Builder
	frozen bool
}

// NewServer starts a private server that only this test uses; it is stopped
// and its directory removed when the test ends.
func NewServer(tb testing.TB, opts *Options) *Server {
	tb.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	s, err := start(o)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(s.stop)
	return s
}

func start(opts Options) (*Server, error) {
	if _, err := exec.LookPath(Binary()); err != nil {
		return nil, fmt.Errorf("%s not found on PATH: install Redis 7 or newer (apt-get install redis-server) or set REDIS_URL", Binary())
	}
	dir, err := os.MkdirTemp("", "sluice-redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, dir: dir, port: opts.Port}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if opts.Port == 0 {
			if s.port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
		if opts.Port != 0 {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// FreePort returns a loopback TCP port that was free a moment ago, never 6379.
func FreePort() (int, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		// Cluster nodes also bind port+10000 for their bus.
		if port != 6379 && port+10000 <= 65535 {
			return port, nil
		}
	}
}

func (s *Server) args() []string {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--daemonize", "no",
		"--protected-mode", "yes",
		"--logfile", "",
		"--loglevel", "warning",
	}
	if s.opts.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--appendonly", "no")
	}
	return append(args, s.opts.Args...)
}

func (s *Server) launch() error {
	cmd := exec.Command(Binary(), s.args()...)
	out := &strings.Builder{}
	cmd.Stdout = &lockedWriter{b: out}
	cmd.Stderr = cmd.Stdout
	// The server dies with the test binary even when the binary is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", Binary(), err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited at start: %s", s.port, out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s: %v; output: %s", s.port, err, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.mu.Lock()
	s.cmd, s.exited, s.out, s.frozen = cmd, exited, out, false
	s.mu.Unlock()
	return nil
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Dir is the server's working directory (AOF files live here).
func (s *Server) Dir() string { return s.dir }

// Pid is the process id of the running server, 0 when stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Client returns a new client of this server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 64})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Freeze stops the server process (SIGSTOP): connections stay open and
// nothing answers, as with a Redis stuck behind a long fork or a full disk.
func (s *Server) Freeze() error { return s.signal(syscall.SIGSTOP, true) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() error { return s.signal(syscall.SIGCONT, false) }

// Frozen reports whether the server is frozen (Freeze without Thaw).
func (s *Server) Frozen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frozen
}

// running reports whether the process runs and is not frozen.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil && !s.frozen
}

// probe is a short-lived client of this server for redistest's own checks.
func (s *Server) probe() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
}

func (s *Server) signal(sig syscall.Signal, frozen bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return err
	}
	s.frozen = frozen
	return nil
}

// Kill stops the server at once (SIGKILL), without saving anything.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.frozen = nil, false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart kills the server and starts it again on the same port and
// directory; with AppendOnly the data written up to a second ago survives.
func (s *Server) Restart() error {
	s.Kill()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.launch(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Output is what the server printed so far.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

func (s *Server) stop() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}

// CPU is the CPU time (user and system, in seconds) the server c talks to
// has used since it started, from INFO: what benchmarks charge per job.
func CPU(tb testing.TB, c redis.Cmdable) float64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatalf("redistest: read Redis's CPU time: %v", err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("redistest: INFO cpu: %s: %v", line, err)
			}
			total += f
		}
	}
	return total
}

// ProcessCPU is the CPU time (user and system, in seconds) this process
// has used: a benchmark's own share beside Redis's (CPU).
func ProcessCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// Median is the median of a benchmark's rounds' figures (the upper one of
// an even count).
func Median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// ReportSideBySide reports a benchmark's rounds of plain asynq and of
// sluice side by side: each one's median jobs/s, their ratio, and the
// median CPU time per job of Redis and of this process, which who names
// ("worker", "producer"). Each side holds its rounds' jobs/s, Redis µs
// per job and process µs per job, in that order.
func ReportSideBySide(b *testing.B, plain, sluice [3][]float64, who string) {
	p, s := Median(plain[0]), Median(sluice[0])
	b.ReportMetric(p, "asynq-jobs/s")
	b.ReportMetric(s, "sluice-jobs/s")
	b.ReportMetric(s/p, "ratio")
	b.ReportMetric(Median(plain[1]), "asynq-redis-µs/job")
	b.ReportMetric(Median(sluice[1]), "sluice-redis-µs/job")
	b.ReportMetric(Median(plain[2]), "asynq-"+who+"-µs/job")
	b.ReportMetric(Median(sluice[2]), "sluice-"+who+"-µs/job")
	b.ReportMetric(0, "ns/op")
}
