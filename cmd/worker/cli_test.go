package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// bins are the binaries the tests run, built once per test binary.
type bins struct{ worker, enqueue, sluice string }

// TestCLI builds worker, enqueue and sluice once and runs the worker's
// tests against a private Redis.
func TestCLI(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/worker", "./cmd/enqueue", "./cmd/sluice")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	b := &bins{worker: filepath.Join(dir, "worker"), enqueue: filepath.Join(dir, "enqueue"), sluice: filepath.Join(dir, "sluice")}

	for name, fn := range map[string]func(*testing.T, *bins){
		"Help":          testHelp,
		"BadUsage":      testBadUsage,
		"Unreachable":   testUnreachable,
		"AddressInUse":  testAddressInUse,
		"ProcessDrain":  testProcessAndDrain,
		"HandBack":      testHandBack,
		"Memory":        testMemory,
		"JSONLogLevels": testJSONLogLevels,
		"HTTPJobs":      testHTTPJobs,
		"FailingJobs":   testFailingJobs,
		"Probe":         testProbeAndRegistry,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

type result struct {
	code           int
	stdout, stderr string
}

// runBin runs a binary to its end with only the given environment.
func runBin(t *testing.T, bin string, env map[string]string, args ...string) result {
	t.Helper()
	code, stdout, stderr := clitest.Run(t, bin, nil, env, args...)
	return result{code: code, stdout: stdout, stderr: stderr}
}

func testHelp(t *testing.T, b *bins) {
	r := runBin(t, b.worker, nil, "--help")
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stderr)
	clitest.Golden(t, "help", r.stdout)
	require.Equal(t, r, runBin(t, b.worker, nil, "-h"))
	v := runBin(t, b.worker, nil, "--version")
	require.Equal(t, 0, v.code)
	require.Regexp(t, `^worker \S+ go1\.\S+ \w+/\w+\n$`, v.stdout)
}

func testBadUsage(t *testing.T, b *bins) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--bogus"}, nil, "unknown flag --bogus"},
		{[]string{"--queues"}, nil, "flag --queues needs a value"},
		{[]string{"extra"}, nil, `unexpected argument "extra": the worker takes only flags`},
		{[]string{"--queues", ""}, nil, `--queues "": empty queue name; write NAME=PRIORITY[,NAME=PRIORITY...], e.g. default=1,critical=6`},
		{[]string{"--queues", "a=0"}, nil, `--queues "a=0": queue "a": priority "0" must be a whole number of at least 1`},
		{[]string{"--queues", "a=x,b"}, nil, `--queues "a=x,b": queue "a": priority "x" must be a whole number of at least 1`},
		{[]string{"--queues", "a,b=2,a=3"}, nil, `--queues "a,b=2,a=3": queue "a" is given twice`},
		{[]string{"--queues", "=3"}, nil, `--queues "=3": "=3" has no queue name; e.g. default=1`},
		{[]string{"--concurrency", "0"}, nil, "--concurrency 0: must be at least 1 (default 100)"},
		{[]string{"--concurrency", "many"}, nil, `invalid value "many" for flag --concurrency: want a whole number`},
		{[]string{"--shutdown-timeout", "0s"}, nil, "--shutdown-timeout 0s: must be positive, e.g. 8s or 1m"},
		{[]string{"--shutdown-timeout", "5"}, nil, `invalid value "5" for flag --shutdown-timeout: want a duration such as 30s or 5m`},
		{[]string{"--recover-lease", "500ms"}, nil, "--recover-lease 500ms: must be between 1s and 10m, e.g. 15s"},
		{[]string{"--log-format", "xml"}, nil, `--log-format "xml": want text or json`},
		{[]string{"--log-level", "loud"}, nil, `--log-level "loud": want debug, info, warn or error`},
		{[]string{"--admin", "9464"}, nil, `--admin "9464": want HOST:PORT such as 127.0.0.1:9464 (port 0 picks a free one), or "off"`},
		{[]string{"--prefix", "a{b}"}, nil, `--prefix "a{b}": must be non-empty and without { or }; use the prefix your producers and sluice use (default "sluice")`},
		{[]string{"--redis", "foo"}, nil, `--redis: Redis URL "foo": no scheme; write it as a URL, e.g. redis://foo; accepted forms: `},
		{[]string{"--redis", "memory://127.0.0.1:6379/1"}, nil, `--redis: Redis URL "memory://127.0.0.1:6379/1": memory:// takes only an address`},
		{nil, map[string]string{"SLUICE_REDIS_URL": "http://x"}, `SLUICE_REDIS_URL: Redis URL "http://x": unknown scheme "http"`},
		{nil, map[string]string{"SLUICE_WORKER_ADMIN": "9464"}, `SLUICE_WORKER_ADMIN "9464": want HOST:PORT such as 127.0.0.1:9464 (port 0 picks a free one), or "off"`},
		{[]string{"--advertise", "0.0.0.0:9464"}, nil, `--advertise "0.0.0.0:9464": want the HOST:PORT at which other machines reach this worker's admin endpoints, such as 10.0.3.7:9464`},
		{[]string{"--advertise", "10.0.0.1"}, nil, `--advertise "10.0.0.1": want the HOST:PORT`},
		{[]string{"--advertise", "10.0.0.1:9464", "--admin", "off"}, nil, `--advertise "10.0.0.1:9464": the admin endpoints are off (--admin off); give them an address with --admin`},
		{[]string{"--probe", "metrics"}, nil, `--probe "metrics": want healthz or readyz, the admin endpoint to ask`},
		{[]string{"--probe", "healthz", "--admin", "off"}, nil, `--probe healthz: the admin endpoints are off (--admin off); give the worker's --admin address`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runBin(t, b.worker, tt.env, tt.args...)
			require.Equal(t, 2, r.code, r.stderr)
			require.Empty(t, r.stdout)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			require.Len(t, lines, 3, r.stderr)
			require.True(t, strings.HasPrefix(lines[0], "worker: "+tt.want), "got  %q\nwant %q", lines[0], "worker: "+tt.want)
			require.Equal(t, "usage: worker [--redis URL] [--queues Q=1,...] [--concurrency N] [FLAGS]", lines[1])
			require.Equal(t, "run 'worker --help' for the flags", lines[2])
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := redistest.FreePort()
	require.NoError(t, err)
	return "127.0.0.1:" + strconv.Itoa(port)
}

func testUnreachable(t *testing.T, b *bins) {
	addr := freeAddr(t)
	start := time.Now()
	r := runBin(t, b.worker, map[string]string{"SLUICE_REDIS_URL": "redis://" + addr}, "--admin", "off")
	require.Equal(t, result{code: 1, stderr: "worker: cannot reach Redis at " + addr + ": connection refused; is redis-server running? set --redis or SLUICE_REDIS_URL\n"}, r)
	require.Less(t, time.Since(start), 10*time.Second)
}

func testAddressInUse(t *testing.T, b *bins) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	taken := ln.Addr().String()

	r := runBin(t, b.worker, nil, "--redis", redistest.URL(t), "--admin", taken, "--queues", qname(t))
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "worker: --admin "+taken+": cannot listen: address already in use; choose another address with --admin HOST:PORT (port 0 picks a free one) or turn the endpoints off with --admin off\n", r.stderr)

	r = runBin(t, b.worker, nil, "--redis", "memory://"+taken, "--admin", "off")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	host, _, _ := net.SplitHostPort(taken)
	require.Equal(t, "worker: cannot start the embedded Redis on "+taken+": address already in use; another Redis or worker may be listening there: pick another port, e.g. --redis memory://"+host+":6380\n", r.stderr)
}

// qname is a queue name no other test uses: asynq's keys cannot be
// prefixed, so each test has its own queues.
func qname(t *testing.T) string {
	return strings.ReplaceAll(redistest.Prefix(t), ":", ".")
}

// proc is a worker process under test.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout *clitest.SyncBuffer
	stderr *clitest.SyncBuffer
	exited chan struct{}
	err    error
}

// startWorker starts the worker binary; it is killed when the test ends if
// it is still running.
func startWorker(t *testing.T, b *bins, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(b.worker, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	p := &proc{t: t, cmd: cmd, stdout: &clitest.SyncBuffer{}, stderr: &clitest.SyncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("worker stdout:\n%s\nworker stderr:\n%s", p.stdout, p.stderr)
		}
	})
	return p
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var adminRE = regexp.MustCompile(`admin=http://(\S+)|"admin":"http://([^"]+)"`)

// admin waits for the "worker started" line and returns the admin address
// ("" with --admin off).
func (p *proc) admin() string {
	p.t.Helper()
	var addr string
	waitFor(p.t, "the worker to start", 20*time.Second, func() bool {
		select {
		case <-p.exited:
			p.t.Fatalf("worker exited: %v\n%s", p.err, p.stderr)
		default:
		}
		out := p.stderr.String()
		if !strings.Contains(out, "worker started") {
			return false
		}
		if m := adminRE.FindStringSubmatch(out); m != nil {
			addr = m[1] + m[2]
		}
		return true
	})
	return addr
}

// signal sends sig and returns the exit code.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) int {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.t.Fatalf("worker did not exit within %s of %s", timeout, sig)
	}
	return p.cmd.ProcessState.ExitCode()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// metric reads one sample of the worker's /metrics, 0 when absent.
func metric(t *testing.T, admin, series string) float64 {
	t.Helper()
	_, body := get(t, "http://"+admin+"/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return 0
}

func setPolicy(t *testing.T, client redis.UniversalClient, prefix, tenant, text string) *throttle.Limiter {
	t.Helper()
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close() })
	p, err := throttle.ParsePolicy(text)
	require.NoError(t, err)
	require.NoError(t, lim.Policies().Set(context.Background(), tenant, p))
	return lim
}

// testProcessAndDrain: the worker processes jobs enqueued by enqueue,
// serves its admin endpoints, and on SIGTERM lets running jobs finish,
// releases their slots and exits 0.
func testProcessAndDrain(t *testing.T, b *bins) {
	url, prefix, q := redistest.URL(t), redistest.Prefix(t), qname(t)
	client := redistest.Client(t)
	lim := setPolicy(t, client, prefix, "acme", "concurrency=2")

	w := startWorker(t, b, "--redis", url, "--prefix", prefix, "--queues", q+"=1", "--concurrency", "10", "--admin", "127.0.0.1:0")
	admin := w.admin()
	code, body := get(t, "http://"+admin+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = get(t, "http://"+admin+"/readyz")
	require.Equal(t, http.StatusOK, code, body)

	env := map[string]string{"SLUICE_REDIS_URL": url}
	r := runBin(t, b.enqueue, env, "--prefix", prefix, "--queue", q, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":20}`, "--count", "20", "--quiet")
	require.Equal(t, 0, r.code, r.stderr)
	success := `sluice_worker_handler_outcomes_total{outcome="success"}`
	waitFor(t, "20 jobs done", 30*time.Second, func() bool { return metric(t, admin, success) == 20 })

	_, body = get(t, "http://"+admin+"/metrics")
	for _, want := range []string{
		"go_goroutines ", "process_cpu_seconds_total ", `sluice_worker_decisions_total{rule="",scope="",verdict="allowed"} 20`, `sluice_build_info{asynq_version="v0.26.0",`,
		`sluice_queue_tasks{queue="` + q + `",state="completed"} 0`, `sluice_queue_tasks{queue="` + q + `",state="pending"} 0`,
	} {
		require.Contains(t, body, want)
	}

	// Two long jobs running, more waiting: SIGTERM lets the running ones
	// finish within --shutdown-timeout (8s), and hands the waiting ones back.
	r = runBin(t, b.enqueue, env, "--prefix", prefix, "--queue", q, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":1500}`, "--count", "5", "--quiet")
	require.Equal(t, 0, r.code, r.stderr)
	ctx := context.Background()
	insp := asynq.NewInspectorFromRedisClient(client)
	waitFor(t, "2 jobs running", 20*time.Second, func() bool {
		info, err := insp.GetQueueInfo(q)
		require.NoError(t, err)
		return info.Active == 2
	})
	require.Equal(t, 0, w.stop(syscall.SIGTERM, 30*time.Second), w.stderr.String())
	require.Contains(t, w.stderr.String(), "msg=\"worker stopped\" jobs_processed=")
	st, err := lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "every slot released")

	info, err := asynq.NewInspectorFromRedisClient(client).GetQueueInfo(q)
	require.NoError(t, err)
	require.Zero(t, info.Active)
	require.Zero(t, info.Archived)
	require.Equal(t, 22, info.Processed, "the 20 short jobs and the 2 running long ones finished")
	require.Equal(t, 3, info.Pending+info.Scheduled+info.Retry, "the 3 waiting jobs are back in the queue")
}

// testHandBack: jobs still running when --shutdown-timeout runs out go back
// to the queue, and their slots are released.
func testHandBack(t *testing.T, b *bins) {
	url, prefix, q := redistest.URL(t), redistest.Prefix(t), qname(t)
	client := redistest.Client(t)
	lim := setPolicy(t, client, prefix, "slow", "concurrency=3")
	w := startWorker(t, b, "--redis", url, "--prefix", prefix, "--queues", q, "--admin", "off", "--shutdown-timeout", "300ms")
	w.admin()
	r := runBin(t, b.enqueue, map[string]string{"SLUICE_REDIS_URL": url}, "--prefix", prefix, "--queue", q, "--tenant", "slow", "--type", "sleep", "--payload", `{"ms":60000}`, "--count", "3")
	require.Equal(t, 0, r.code, r.stderr)
	ctx := context.Background()
	insp := asynq.NewInspectorFromRedisClient(client)
	waitFor(t, "3 jobs running", 20*time.Second, func() bool {
		info, err := insp.GetQueueInfo(q)
		require.NoError(t, err)
		return info.Active == 3
	})
	start := time.Now()
	require.Equal(t, 0, w.stop(syscall.SIGINT, 20*time.Second), w.stderr.String())
	require.Less(t, time.Since(start), 15*time.Second)
	st, err := lim.Stats(ctx, "slow")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "every slot released")
	info, err := asynq.NewInspectorFromRedisClient(client).GetQueueInfo(q)
	require.NoError(t, err)
	require.Equal(t, 3, info.Pending, "the running jobs are back in the queue")
	require.Zero(t, info.Archived)
}

// testMemory: a worker with an embedded Redis, reached by enqueue and
// sluice through memory://ADDR.
func testMemory(t *testing.T, b *bins) {
	addr := freeAddr(t)
	mem := "memory://" + addr
	w := startWorker(t, b, "--redis", mem, "--admin", "127.0.0.1:0", "--queues", "default=1")
	admin := w.admin()
	require.Equal(t, "embedded Redis (miniredis, in memory: its data ends with this process) listening on "+addr+"\n"+
		"in other terminals: export SLUICE_REDIS_URL="+mem+"\n", w.stdout.String())

	env := map[string]string{"SLUICE_REDIS_URL": mem}
	r := runBin(t, b.sluice, env, "policy", "set", "acme", "rate=50/s concurrency=2")
	require.Equal(t, result{stdout: "set policy acme: rate=50/s concurrency=2\n"}, r)
	r = runBin(t, b.enqueue, env, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":10}`, "--count", "10")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^enqueued 10 of 10 jobs for tenant acme in `, r.stdout)
	waitFor(t, "10 jobs done", 30*time.Second, func() bool {
		return metric(t, admin, `sluice_worker_handler_outcomes_total{outcome="success"}`) == 10
	})
	r = runBin(t, b.sluice, env, "stats", "acme", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var stats struct {
		Tenants []struct {
			Tenant  string `json:"tenant"`
			Started int64  `json:"started"`
		} `json:"tenants"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &stats), r.stdout)
	require.Len(t, stats.Tenants, 1)
	require.Equal(t, "acme", stats.Tenants[0].Tenant)
	require.EqualValues(t, 10, stats.Tenants[0].Started)

	require.Equal(t, 0, w.stop(syscall.SIGTERM, 20*time.Second))
	// The embedded Redis ends with the worker.
	r = runBin(t, b.sluice, env, "policy", "list")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is a worker started with --redis "+mem+" running?")
}

// testJSONLogLevels: --log-format json writes one JSON object per line,
// and --log-level warn leaves out the info lines.
func testJSONLogLevels(t *testing.T, b *bins) {
	url, q := redistest.URL(t), qname(t)
	w := startWorker(t, b, "--redis", url, "--queues", q, "--admin", "127.0.0.1:0", "--log-format", "json")
	w.admin()
	require.Equal(t, 0, w.stop(syscall.SIGTERM, 20*time.Second))
	sc := bufio.NewScanner(strings.NewReader(w.stderr.String()))
	msgs := []string{}
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), sc.Text())
		msgs = append(msgs, fmt.Sprint(rec["msg"]))
	}
	require.Contains(t, msgs, "worker started")
	require.Contains(t, msgs, "worker stopped")

	w = startWorker(t, b, "--redis", url, "--queues", q, "--admin", "off", "--log-level", "warn")
	// A quiet worker logs nothing at start: wait for its asynq server to
	// show up in Redis instead.
	inspector := asynq.NewInspectorFromRedisClient(redistest.Client(t))
	waitFor(t, "the worker to take jobs", 20*time.Second, func() bool {
		servers, err := inspector.Servers()
		require.NoError(t, err)
		for _, s := range servers {
			if _, ok := s.Queues[q]; ok && s.PID == w.cmd.Process.Pid {
				return true
			}
		}
		return false
	})
	require.Equal(t, 0, w.stop(syscall.SIGTERM, 20*time.Second))
	require.Empty(t, w.stderr.String())
}

// testHTTPJobs: the built-in http handler calls the URL of the payload; a
// 429 with Retry-After pauses the tenant and the job runs again after it.
func testHTTPJobs(t *testing.T, b *bins) {
	url, prefix, q := redistest.URL(t), redistest.Prefix(t), qname(t)
	var okCalls, busyCalls atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			require.Equal(t, http.MethodPost, r.Method)
			require.Equal(t, "yes", r.Header.Get("X-Test"))
			okCalls.Add(1)
		case "/busy":
			if busyCalls.Add(1) == 1 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
		}
	}))
	defer api.Close()
	w := startWorker(t, b, "--redis", url, "--prefix", prefix, "--queues", q, "--admin", "127.0.0.1:0")
	admin := w.admin()
	env := map[string]string{"SLUICE_REDIS_URL": url}
	for _, payload := range []string{
		`{"method":"POST","url":"` + api.URL + `/ok","headers":{"X-Test":"yes"},"body":"hi","timeout_ms":5000}`,
		`{"url":"` + api.URL + `/busy"}`,
	} {
		r := runBin(t, b.enqueue, env, "--prefix", prefix, "--queue", q, "--tenant", "acme", "--type", "http", "--payload", payload, "--max-retry", "0")
		require.Equal(t, 0, r.code, r.stderr)
	}
	waitFor(t, "both http jobs done", 30*time.Second, func() bool {
		return metric(t, admin, `sluice_worker_handler_outcomes_total{outcome="success"}`) == 2
	})
	require.EqualValues(t, 1, okCalls.Load())
	require.EqualValues(t, 2, busyCalls.Load(), "the 429 job ran again after the cooldown")
	require.EqualValues(t, 1, metric(t, admin, `sluice_worker_handler_outcomes_total{outcome="cooldown"}`))
	require.Equal(t, 0, w.stop(syscall.SIGTERM, 20*time.Second))
	info, err := asynq.NewInspectorFromRedisClient(redistest.Client(t)).GetQueueInfo(q)
	require.NoError(t, err)
	require.Zero(t, info.Archived, "a 429 at MaxRetry(0) is not archived")
}

// testFailingJobs: a typo in a job's type and a handler's error are in
// sight: the worker logs the unknown type once, archives its jobs at once
// with the reason, logs a handler's error with the job's id, type and
// tenant, and sluice jobs shows both with their last error.
func testFailingJobs(t *testing.T, b *bins) {
	url, prefix, q := redistest.URL(t), redistest.Prefix(t), qname(t)
	api := httptest.NewServer(http.NotFoundHandler())
	defer api.Close()
	w := startWorker(t, b, "--redis", url, "--prefix", prefix, "--queues", q, "--admin", "127.0.0.1:0")
	admin := w.admin()
	env := map[string]string{"SLUICE_REDIS_URL": url}
	var ids []string
	for _, args := range [][]string{
		{"--type", "slep", "--payload", `{"ms":300}`},
		{"--type", "slep", "--payload", `{"ms":300}`},
		{"--type", "http", "--payload", `{"url":"` + api.URL + `/missing"}`},
	} {
		r := runBin(t, b.enqueue, env, append([]string{"--prefix", prefix, "--queue", q, "--tenant", "acme"}, args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		ids = append(ids, strings.Fields(r.stdout)[2])
	}
	waitFor(t, "the three jobs archived", 30*time.Second, func() bool {
		info, err := asynq.NewInspectorFromRedisClient(redistest.Client(t)).GetQueueInfo(q)
		return err == nil && info.Archived == 3
	})
	require.EqualValues(t, 2, metric(t, admin, `sluice_worker_unknown_types_total{type="slep"}`))
	logs := w.stderr.String()
	require.Equal(t, 1, strings.Count(logs, `msg="no handler for task type" type=slep handles="http, sleep"`), logs)
	require.Contains(t, logs, `level=ERROR msg="job failed for good" task=`+ids[2]+` type=http tenant=acme queue=`+q+` retried=0 max_retry=25 err="http task: GET `+api.URL+`/missing: status 404: 404 page not found (retrying would get the same answer)`)

	r := runBin(t, b.sluice, env, "--prefix", prefix, "jobs", "acme", "--queue", q, "--state", "archived")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `\n`+ids[0]+`\s+acme\s+slep\s+`+q+`\s+archived\s+0/25\s+-\s+no handler for task type "slep" on this worker \(it handles http, sleep\): archiv…\n`, r.stdout)
	require.Regexp(t, `\n`+ids[2]+`\s+acme\s+http\s+`+q+`\s+archived\s+0/25\s+-\s+http task: GET http://127\.0\.0\.1:\d+/missing: status 404: 404 page not found \(…\n`, r.stdout)
	require.Equal(t, 0, w.stop(syscall.SIGTERM, 20*time.Second))
}

// testProbeAndRegistry: --probe asks a running worker's admin endpoint and
// says so in its exit code (the image's health check), and the worker
// records the address of its metrics in the fleet's registry for sluice
// dashboard: the one it listens on, or --advertise's.
func testProbeAndRegistry(t *testing.T, b *bins) {
	url, prefix, q := redistest.URL(t), redistest.Prefix(t), qname(t)
	w := startWorker(t, b, "--redis", url, "--prefix", prefix, "--queues", q, "--admin", "127.0.0.1:0")
	admin := w.admin()
	other := startWorker(t, b, "--redis", url, "--prefix", prefix, "--queues", q, "--admin", "127.0.0.1:0", "--advertise", "worker-2.example:9464")
	other.admin()
	for _, endpoint := range []string{"healthz", "readyz"} {
		r := runBin(t, b.worker, nil, "--admin", admin, "--probe", endpoint)
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, "http://"+admin+"/"+endpoint+": ok\n", r.stdout)
	}
	reg := fleet.New(redistest.Client(t), prefix)
	waitFor(t, "both workers registered", 10*time.Second, func() bool {
		list, err := reg.List(context.Background())
		require.NoError(t, err)
		return len(list) == 2
	})
	list, err := reg.List(context.Background())
	require.NoError(t, err)
	var addrs []string
	for _, m := range list {
		require.True(t, m.Up(), m.ID)
		addrs = append(addrs, m.Admin)
	}
	require.ElementsMatch(t, []string{admin, "worker-2.example:9464"}, addrs)

	require.Equal(t, 0, w.stop(syscall.SIGTERM, 20*time.Second))
	r := runBin(t, b.worker, nil, "--admin", admin, "--probe", "healthz")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "worker: --probe healthz: ")
	require.Contains(t, r.stderr, "(is the worker running with --admin "+admin+"?)")
	require.Equal(t, 0, other.stop(syscall.SIGTERM, 20*time.Second))
}
