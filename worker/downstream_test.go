package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/worker"
)

// strictDownstream is a rate-limited API: GCRA at rate per second with
// burst, answering 429 with Retry-After: 1 when a request does not fit,
// and, unless blind, announcing its limit on every answer in the IETF
// RateLimit fields and X-RateLimit-*.
type strictDownstream struct {
	rate  float64
	burst int
	blind bool

	mu  sync.Mutex
	tat time.Time
	log []answer
}

type answer struct {
	at time.Time
	ok bool
}

func (d *strictDownstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	now := time.Now()
	interval := time.Duration(float64(time.Second) / d.rate)
	tau := time.Duration(d.burst-1) * interval
	tat := d.tat
	if tat.Before(now) {
		tat = now
	}
	ok := tat.Sub(now) <= tau
	if ok {
		tat = tat.Add(interval)
		d.tat = tat
	}
	d.log = append(d.log, answer{now, ok})
	// requests that would pass now, and how long until one more would
	ahead := tat.Sub(now)
	remaining := max(int64((tau-ahead)/interval)+1, 0)
	wait := max(ahead-tau, 0)
	d.mu.Unlock()
	if !d.blind {
		h := w.Header()
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=1`, int(d.rate)))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, remaining, int(wait.Seconds())))
		h.Set("X-RateLimit-Limit", fmt.Sprint(int(d.rate)))
		h.Set("X-RateLimit-Remaining", fmt.Sprint(remaining))
		h.Set("X-RateLimit-Reset-After", fmt.Sprintf("%.3f", wait.Seconds()))
	}
	if !ok {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (d *strictDownstream) answers() []answer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]answer(nil), d.log...)
}

func (d *strictDownstream) accepted() int {
	n := 0
	for _, a := range d.answers() {
		if a.ok {
			n++
		}
	}
	return n
}

// TestDownstreamSignals: a tenant whose policy (rate=100/s burst=5) is above
// what its downstream allows (40/s burst 2) runs on two workers, each with
// its own limiter and policy cache, as two processes would. A downstream
// that announces its limit is followed by the whole fleet from its first
// answer: 429s after it are bounded, and the achieved rate is within 10%
// of the downstream's. A downstream that only answers 429 is reported.
func TestDownstreamSignals(t *testing.T) {
	if redistest.ClusterMode() {
		t.Skip("timing test; runs on the single server")
	}
	f := newFleet(t, buildTestWorker(t))
	e := f.env
	const policyBurst = 5
	e.policy(t, "announced", fmt.Sprintf("rate=100/s burst=%d", policyBurst))
	e.policy(t, "blind", fmt.Sprintf("rate=100/s burst=%d", policyBurst))
	announced := &strictDownstream{rate: 40, burst: 2}
	blind := &strictDownstream{rate: 40, burst: 2, blind: true}
	srvA := httptest.NewServer(announced)
	defer srvA.Close()
	srvB := httptest.NewServer(blind)
	defer srvB.Close()
	// two worker processes, each with its own policy cache
	f.args = []string{"-concurrency", "20"}
	f.start(t)
	f.start(t)

	const jobs = 600
	ctx := context.Background()
	payload := func(url string) []byte {
		b, err := json.Marshal(worker.HTTPRequest{URL: url})
		require.NoError(t, err)
		return b
	}
	go func() {
		for range 200 {
			if _, err := e.q.Enqueue(ctx, "blind", asynq.NewTask(worker.TypeHTTP, payload(srvB.URL)), asynq.Queue(e.queue)); err != nil {
				return
			}
		}
	}()
	for range jobs {
		_, err := e.q.Enqueue(ctx, "announced", asynq.NewTask(worker.TypeHTTP, payload(srvA.URL)), asynq.Queue(e.queue))
		require.NoError(t, err)
	}
	poll(t, 60*time.Second, 50*time.Millisecond, func() bool { return announced.accepted() >= jobs },
		"all %d jobs of the announced downstream answered 200", jobs)

	log := announced.answers()
	first := log[0].at
	// the first signal: the first answer (each carries the limit)
	var lastOK time.Time
	late429 := 0
	early429 := 0
	for i, a := range log {
		switch {
		case a.ok:
			lastOK = a.at
		case i < policyBurst:
			// the first burst, sent before any answer came back: the
			// policy's burst, back to back (counted by place, not by a
			// few ms after the first answer: on a loaded machine the
			// burst's requests arrive spread out)
			early429++
		default:
			late429++
		}
	}
	run := lastOK.Sub(first)
	rate := float64(jobs) / run.Seconds()
	steadyFrom := first.Add(1500 * time.Millisecond)
	steady := 0
	for _, a := range log {
		if a.ok && a.at.After(steadyFrom) {
			steady++
		}
	}
	steadyRate := float64(steady) / lastOK.Sub(steadyFrom).Seconds()
	st, err := e.lim.Stats(ctx, "announced")
	require.NoError(t, err)
	require.NotNil(t, st.Learned, "the limit is learned")
	t.Logf("announced downstream (40/s burst 2), policy 100/s burst 5, 2 workers: %d jobs in %s = %.1f/s over the run (%.1f%% of 40/s), %.1f/s after the first 1.5 s; 429s: %d in the first burst, %d after the first answer; learned: %s",
		jobs, run.Round(time.Millisecond), rate, 100*rate/40, steadyRate, early429, late429, st.Learned)
	// The bound: the first burst is the policy's (5 back to back, 3 over
	// the downstream's burst of 2) and goes out before any answer comes
	// back; every answer declares the limit, which the fleet follows from
	// the first one (within milliseconds, by pub/sub), and the first 429's
	// Retry-After pauses the tenant for a second meanwhile. After that, the
	// starts are spaced at the declared 25 ms, and a request is refused only
	// if scheduling delays bunch two of them by more than the downstream's
	// tolerance (25 ms): allow 1% of the jobs (6) for a loaded machine
	// (make test runs other packages' tests beside this one; 4 were seen
	// there).
	require.LessOrEqual(t, late429, jobs/100, "429s after the first answer")
	require.LessOrEqual(t, early429, policyBurst, "429s of the first burst")
	// the figure: the achieved rate once the limit is learned
	// (after the first answer's pause) within 10% of the downstream's 40/s
	require.InDelta(t, 40, steadyRate, 4, "achieved rate after the first pause within 10%% of the downstream's 40/s")
	// over the run, the first second's pause included (600 jobs: at best
	// 15 s of starts after it, 93.75%); the loaded machine of make test
	// has measured 89.8%
	require.GreaterOrEqual(t, rate, 0.8*40, "achieved rate over the run")

	// the downstream that only answers 429: no limit to learn; each 429
	// pauses the tenant for its Retry-After (item 2's adaptive limits are
	// what converge there)
	answers := blind.answers()
	ok, refused := 0, 0
	for _, a := range answers {
		if a.ok {
			ok++
		} else {
			refused++
		}
	}
	span := answers[len(answers)-1].at.Sub(answers[0].at)
	t.Logf("blind downstream (429 with Retry-After: 1, no limit headers), same policy, over the same %s: %d answered, %d refused (%.0f%%), %.1f/s",
		span.Round(time.Millisecond), ok, refused, 100*float64(refused)/math.Max(1, float64(ok+refused)), float64(ok)/span.Seconds())
	require.Positive(t, ok)
	bs, err := e.lim.Stats(ctx, "blind")
	require.NoError(t, err)
	require.Nil(t, bs.Learned, "nothing to learn from a bare 429")
}

// TestObserveThroughTheGate: the http handler reads every answer through
// the gate: a 2xx that says the quota is used up pauses the tenant until
// its reset, a declared limit below the policy is learned, a pinned policy
// learns nothing, and malformed values are counted and change nothing.
func TestObserveThroughTheGate(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=100/s")
	e.policy(t, "pinned", "rate=100/s learn=false")
	ds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		switch r.URL.Path {
		case "/used-up":
			h.Set("RateLimit-Policy", `"hour";q=3600;w=3600`)
			h.Set("RateLimit", `"hour";r=0;t=2`)
		case "/garbage":
			h.Set("X-RateLimit-Remaining", "none")
			h.Set("RateLimit-Policy", `"x";q=ten`)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer ds.Close()
	srv := e.server(t, nil)
	worker.RegisterBuiltins(srv, ds.Client(), 0)
	require.NoError(t, srv.Start())
	ctx := context.Background()
	run := func(tenant, path string) {
		p, err := json.Marshal(worker.HTTPRequest{URL: ds.URL + path})
		require.NoError(t, err)
		info, err := e.q.Enqueue(ctx, tenant, asynq.NewTask(worker.TypeHTTP, p), asynq.Queue(e.queue))
		require.NoError(t, err)
		eventually(t, 10*time.Second, func() bool {
			ti, err := e.inspector.GetTaskInfo(e.queue, info.ID)
			return err != nil || ti.State == asynq.TaskStateCompleted
		}, "job %s of %s done", info.ID, tenant)
	}
	run("acme", "/used-up")
	eventually(t, 5*time.Second, func() bool {
		st, err := e.lim.Stats(ctx, "acme")
		require.NoError(t, err)
		return st.Learned != nil && !st.CooldownUntil.IsZero()
	}, "acme learned its limit and pauses")
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(3600), st.Learned.Limit)
	require.Equal(t, time.Hour, st.Learned.Window)
	require.Equal(t, "rate[1]", st.Learned.Rule)
	require.Equal(t, "RateLimit-Policy", st.Learned.Source)
	require.Contains(t, st.Learned.From, "200 from GET "+ds.Listener.Addr().String()+"/used-up, task ")
	require.InDelta(t, 2*time.Second, st.CooldownUntil.Sub(st.Now), float64(300*time.Millisecond), "paused until the reset")
	require.Equal(t, "rate=100/s", st.Rules.String(), "the stored policy is unchanged")

	run("pinned", "/used-up")
	g := srv.Gate().Gatherer()
	eventually(t, 5*time.Second, func() bool {
		return metric(t, g, "sluice_downstream_actions_total", map[string]string{"action": "pinned"}) == 1
	}, "the pinned tenant learned nothing")
	ps, err := e.lim.Stats(ctx, "pinned")
	require.NoError(t, err)
	require.Nil(t, ps.Learned)
	require.False(t, ps.CooldownUntil.IsZero(), "a pinned policy still pauses when the quota is used up")

	run("acme", "/garbage")
	eventually(t, 5*time.Second, func() bool {
		return metric(t, g, "sluice_downstream_signals_total", map[string]string{"result": "malformed"}) == 2
	}, "two malformed values counted")
	require.Equal(t, float64(4), metric(t, g, "sluice_downstream_signals_total", map[string]string{"kind": "ratelimit", "result": "read"}), "RateLimit-Policy and RateLimit of two answers")
}
