package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// call makes one request of tenant ti for job ji and returns its status
// and Retry-After header.
func call(t *testing.T, url string, ti, ji int) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Tenant", strconv.Itoa(ti))
	req.Header.Set("X-Job", strconv.Itoa(ji))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

func TestDownstreamEnforcesAndRecords(t *testing.T) {
	t.Parallel()
	w := &workload{
		tenants: []tenant{
			{id: 0, rate: 1, burst: 1},                           // one per second
			{id: 1, conc: 1, hold: 300 * time.Millisecond},       // one at a time
			{id: 2, rate: 1000, burst: 1000, hold: 0, conc: 100}, // never limited here
		},
		jobs: make([]job, 10),
	}
	ds, err := startDownstream(w, 0, time.Now())
	require.NoError(t, err)
	t.Cleanup(ds.close)

	code, _ := call(t, ds.url, 0, 0)
	require.Equal(t, http.StatusOK, code)
	code, retry := call(t, ds.url, 0, 1)
	require.Equal(t, http.StatusTooManyRequests, code, "second request within the second")
	require.Equal(t, "1", retry)

	// Tenant 1: a request held for 300 ms, and another while it runs.
	held := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, ds.url, nil)
		req.Header.Set("X-Tenant", "1")
		req.Header.Set("X-Job", "2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- 0
			return
		}
		_ = resp.Body.Close()
		held <- resp.StatusCode
	}()
	require.Eventually(t, func() bool {
		ds.tenants[1].mu.Lock()
		defer ds.tenants[1].mu.Unlock()
		return ds.tenants[1].running == 1
	}, 5*time.Second, time.Millisecond)
	code, _ = call(t, ds.url, 1, 3)
	require.Equal(t, http.StatusTooManyRequests, code, "over the concurrency cap")
	require.Equal(t, http.StatusOK, <-held)

	// The same job twice is recorded as served twice.
	for range 2 {
		code, _ = call(t, ds.url, 2, 4)
		require.Equal(t, http.StatusOK, code)
	}
	code, _ = call(t, ds.url, 7, 0)
	require.Equal(t, http.StatusBadRequest, code, "unknown tenant")
	code, _ = call(t, ds.url, 0, 99)
	require.Equal(t, http.StatusBadRequest, code, "unknown job")

	arr := ds.snapshot()
	require.Equal(t, []uint8{accepted, rejectedRate}, statuses(arr[0]))
	for _, a := range arr[0] {
		require.Equal(t, unknownDelay, a.delay, "no X-Started header: the delay is not known")
	}
	// The replay finds the refusal as the downstream did: early by the
	// rest of the second.
	ref := refusals(arr[0], 1, 1, 0)
	require.Len(t, ref, 1)
	require.Positive(t, ref[0].early)
	require.LessOrEqual(t, ref[0].early, time.Second)
	require.Equal(t, []uint8{accepted, rejectedConc}, statuses(arr[1]))
	require.Equal(t, int32(2), arr[1][1].conc, "the refused request counts itself")
	require.Equal(t, uint32(2), ds.served[4].Load())
	require.Equal(t, int64(3), ds.done.Load(), "jobs 0, 2 and 4")
}

// TestDeliveryDelay sends requests through the workers' transport: one
// whose context notes its handler's start carries it to the downstream,
// which records the delay; one without arrives with the delay unknown.
func TestDeliveryDelay(t *testing.T) {
	t.Parallel()
	w := &workload{tenants: []tenant{{id: 0}}, jobs: make([]job, 3)}
	ds, err := startDownstream(w, 0, time.Now())
	require.NoError(t, err)
	t.Cleanup(ds.close)
	client := &http.Client{Transport: stampStart{http.DefaultTransport}}
	t.Cleanup(client.CloseIdleConnections)
	send := func(ctx context.Context, ji int) *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ds.url, nil)
		require.NoError(t, err)
		req.Header.Set("X-Tenant", "0")
		req.Header.Set("X-Job", strconv.Itoa(ji))
		resp, err := client.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return req
	}
	began := time.Now()
	req := send(withStart(context.Background(), began.Add(-50*time.Millisecond)), 0)
	require.Empty(t, req.Header.Get(startedHeader), "the caller's request is left as it was")
	took := time.Since(began)
	send(context.Background(), 1)

	arr := ds.snapshot()[0]
	require.Len(t, arr, 2)
	require.GreaterOrEqual(t, arr[0].delay, 50*time.Millisecond)
	require.LessOrEqual(t, arr[0].delay, 50*time.Millisecond+took)
	require.Equal(t, unknownDelay, arr[1].delay)
	for _, a := range arr {
		require.Equal(t, unknownDelay, a.sinceAdmit, "no gate: no X-Admitted header")
	}
}

func statuses(arr []arrival) []uint8 {
	var out []uint8
	for _, a := range arr {
		out = append(out, a.status)
	}
	return out
}

// deliveryRecorded checks that every request of r's run said when its
// handler started, and that every refusal over a rate is accounted for.
func deliveryRecorded(t *testing.T, r *result) {
	t.Helper()
	require.Positive(t, r.requests, r.setup)
	d := r.delivery
	require.Equal(t, r.requests, d.n, "%s: a delivery delay for every request", r.setup)
	require.Zero(t, d.unknown, r.setup)
	require.Positive(t, d.p50, r.setup)
	require.LessOrEqual(t, d.p50, d.p99, r.setup)
	require.LessOrEqual(t, d.p99, d.p999, r.setup)
	require.LessOrEqual(t, d.p999, d.max, r.setup)
	require.Less(t, d.max, time.Minute, r.setup)
	if r.setup == setupSluice {
		// every request of sluice's says when the gate admitted its job
		a := r.admitToStart
		require.Equal(t, r.requests, a.n, r.setup)
		require.Less(t, a.max, time.Minute, r.setup)
	} else {
		require.Zero(t, r.admitToStart.n, "%s: no gate, no admissions", r.setup)
	}
	require.Equal(t, r.rejRate, r.explained+r.unexplainedUnknown+r.startedEarly+r.startConformed, r.setup)
	require.LessOrEqual(t, r.admittedEarly+r.admittedInTime, r.startedEarly, r.setup)
	if r.rejRate > 0 {
		require.Positive(t, r.earlyP50, r.setup)
	}
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-config", "huge"},
		{"-setups", "xrate,celery"},
		{"-workers", "-1"},
		{"-allowance", "5s"},
		{"-flood-concurrency", "10"}, // the small saturation fleet's own 10 slots: it would bind
		{"-e2e-policy", "rate=fast"},
		{"-cpuprofile", "/dev/null/profiles"},
		{"-out", "/dev/null/report"},
		{"-nope"},
	} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, runMain(args, &stdout, &stderr), "%v", args)
		require.NotEmpty(t, stderr.String(), "%v says why", args)
	}
}

// TestTinyRun runs the smallest configuration end to end: for each
// scenario a private redis-server, two worker processes per set-up (this
// test binary, see TestMain), the three set-ups; then the report of them
// all and its plots. The scenarios run side by side to keep the test short.
func TestTinyRun(t *testing.T) {
	// The asynq set-ups stop at the tiny preset's deadline; sluice, whose
	// every job must be done, gets a minute in case the machine is busy.
	base := options{cfg: presets["tiny"], setups: setups, allowance: 20 * time.Millisecond, log: io.Discard,
		drain: map[string]time.Duration{kindFleet + "/" + setupSluice: time.Minute}}
	if testing.Verbose() {
		base.log = os.Stderr
	}
	run := func(t *testing.T, kind string, opts ...func(*options)) *benchmark {
		o := base
		o.scenarios = []string{kind}
		for _, f := range opts {
			f(&o)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		b, err := bench(ctx, o)
		require.NoError(t, err)
		return b
	}
	var b, sat *benchmark
	var e2e []e2eRound
	t.Run("scenarios", func(t *testing.T) {
		t.Run(kindFleet, func(t *testing.T) {
			t.Parallel()
			b = run(t, kindFleet)
			require.Len(t, b.results, 3)
			for _, r := range b.results {
				require.Equal(t, r.jobs, r.enqueued, "%s: every job enqueued (%s)", r.setup, r.firstErr)
				require.Positive(t, r.completed, r.setup)
				require.Positive(t, r.deliveries, r.setup)
				require.Positive(t, r.redisCPU+r.redisPeak, r.setup)
				require.Empty(t, r.problems, r.setup) // the refusals' replay among them
				deliveryRecorded(t, r)
			}
			s := b.resultOf(setupSluice)
			require.Equal(t, s.jobs, s.completed, "sluice completes every job")
			require.Zero(t, s.lost)
			require.Zero(t, s.unfinished)
			require.Zero(t, s.duplicates)
			require.Zero(t, s.tenantsOverCap, "sluice never exceeds a cap")
			require.NotEmpty(t, s.waits)
			require.NotNil(t, b.runOf(setupSluice).profile, "Redis profiled")
			require.Positive(t, b.runOf(setupSluice).cmdStats["evalsha"].Calls)
		})
		t.Run(kindEndToEnd, func(t *testing.T) {
			t.Parallel()
			prof := t.TempDir()
			e := run(t, kindEndToEnd, func(o *options) { o.cpuprofile = prof })
			// every worker process wrote its CPU profile (-cpuprofile):
			// gzipped protobuf, as runtime/pprof writes it
			for _, s := range []string{setupPlain, setupSluice} {
				for _, h := range e2eHandlers {
					files, err := filepath.Glob(filepath.Join(prof, fmt.Sprintf("worker-%s-%s-*.pprof", s, h)))
					require.NoError(t, err)
					require.GreaterOrEqual(t, len(files), base.cfg.workers, "%s %s: a profile per worker process", s, h)
					for _, f := range files {
						data, err := os.ReadFile(f)
						require.NoError(t, err)
						require.True(t, bytes.HasPrefix(data, []byte{0x1f, 0x8b}), "%s: a gzipped profile", f)
					}
				}
			}
			sums := summarizeE2E(e.e2e)
			require.Len(t, sums, len(e2eHandlers))
			for _, s := range sums {
				require.Positive(t, s.plainJPS, s.handler)
				require.Positive(t, s.sluiceJPS, s.handler)
			}
			for _, r := range e.e2e {
				require.Empty(t, r.Problems)
				require.Zero(t, r.EnqErrs)
			}
			e2e = e.e2e
		})
		t.Run(kindEndToEnd+"-no-policy", func(t *testing.T) {
			// the waiting room's own path: no tenant has a policy
			t.Parallel()
			e := run(t, kindEndToEnd, func(o *options) { o.e2ePolicy = e2eNoPolicy })
			for _, s := range summarizeE2E(e.e2e) {
				require.Positive(t, s.sluiceJPS, s.handler)
			}
			for _, r := range e.e2e {
				require.Empty(t, r.Problems)
				require.Zero(t, r.EnqErrs)
			}
			var md bytes.Buffer
			e.e2eMarkdown(&md)
			require.Contains(t, md.String(), "sluice's tenants have no policy")
			for _, tg := range e.e2eTargets() {
				require.Contains(t, tg.name, "(policy `none`)")
			}
		})
		t.Run(kindSaturation, func(t *testing.T) {
			t.Parallel()
			sat = run(t, kindSaturation)
			require.Empty(t, sat.runs, "only the saturation scenario ran")
			require.Len(t, sat.sat.results, 3)
			for _, r := range sat.sat.results {
				require.Equal(t, r.jobs, r.enqueued, "%s: every job enqueued (%s)", r.setup, r.firstErr)
				require.NotEmpty(t, r.waits, r.setup)
				require.Empty(t, r.problems, r.setup)
				require.True(t, r.slotsOK, "%s: the worker processes timed their slots", r.setup)
				require.Greater(t, r.slots.handler, sat.sat.w.sat.hold, "%s: a job's handler holds the downstream's time at least", r.setup)
				require.Positive(t, r.slots.busy, r.setup)
				require.LessOrEqual(t, r.slots.busy, 1.0, r.setup)
			}
			s := sat.sat.resultOf(setupSluice)
			require.Equal(t, s.jobs, s.completed, "sluice completes every job")
			for _, r := range sat.sat.results {
				deliveryRecorded(t, r)
			}
		})
	})
	if t.Failed() {
		return
	}
	b.sat, b.e2e = sat.sat, e2e

	dir := t.TempDir()
	b.command = "cd bench && go run ./fleet -config tiny"
	require.NoError(t, b.write(dir))
	md, err := os.ReadFile(filepath.Join(dir, "benchmarks.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "| downstream rejections (429) |")
	require.Contains(t, string(md), "| delivery delay (handler start to downstream), p50 / p99 / p99.9 / max |")
	require.Contains(t, string(md), "## sluice against its targets")
	require.Contains(t, string(md), "## Saturation: a tenant with no limits floods the fleet")
	require.Contains(t, string(md), "of the jobs/s the slots leave it")
	require.Contains(t, string(md), "| slots busy (a job's hand-over to its handler's end) |")
	require.Contains(t, string(md), "| sluice admit.lua |")
	require.Contains(t, string(md), "## End to end: enqueue and run, limits not binding")
	for _, f := range []string{"fleet-wait.png", "fleet-queues.png", "fleet-arrivals-xrate.png", "fleet-arrivals-redisrate.png",
		"fleet-arrivals-sluice.png", "fleet-saturation-wait.png"} {
		png, err := os.ReadFile(filepath.Join(dir, "img", f))
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), f)
	}
	var out bytes.Buffer
	printTable(&out, rows, b.results)
	require.Contains(t, out.String(), "3. sluice")

	// Saved and rendered again: the same report.
	file := filepath.Join(dir, "run.gob")
	require.NoError(t, b.save(file))
	again, err := load(file)
	require.NoError(t, err)
	var out2 bytes.Buffer
	printTable(&out2, rows, again.results)
	require.Equal(t, out.String(), out2.String())
	var md1, md2 bytes.Buffer
	b.markdown(&md1)
	again.markdown(&md2)
	require.Equal(t, md1.String(), md2.String())
}
