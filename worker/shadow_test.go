package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// TestShadowPolicy: a tenant enforced at rate=1000/s with a shadow of
// rate=5/s runs its jobs as fast as the enforced policy lets it (the
// shadow holds nothing back), and the shadow counts, fleet-wide in Redis
// and in the worker's metric, that it would have denied all but the few
// its rate allows over the run. A tenant without a shadow costs no script
// call more than before any shadow existed; a tenant with one costs about
// one script call per job (its start), sent in pipelines off the job's
// path.
func TestShadowPolicy(t *testing.T) {
	t.Parallel()
	private := redistest.NewServer(t, nil)
	client := private.Client(t)
	e := setup(t, client)
	ctx := context.Background()
	const n = 100
	e.policy(t, "acme", "rate=1000/s burst=1000")
	e.policy(t, "globex", "rate=1000/s burst=1000")
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 10 })
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())

	// run enqueues n jobs of tenant, waits for them all to be done and
	// returns how long they took and the script calls Redis served
	// meanwhile.
	// returns how long they took, the script calls Redis served meanwhile
	// and the shadow's flushes that wrote counts (HSETNX: nothing else
	// sends it).
	done := 0
	run := func(tenant string, settled func() bool) (time.Duration, int64, int64) {
		calls0, flushes0 := scriptCalls(t, client), commandCalls(t, client, "hsetnx")
		start := time.Now()
		e.enqueue(t, tenant, n, "")
		done += n
		eventually(t, 20*time.Second, func() bool { return rec.doneCount() == done }, "%d jobs of %s done", n, tenant)
		took := time.Since(start)
		eventually(t, 5*time.Second, settled, "%s's run settled", tenant)
		return took, scriptCalls(t, client) - calls0, commandCalls(t, client, "hsetnx") - flushes0
	}
	always := func() bool { return true }
	// warm up: scripts loaded, the pump running. Each measured run follows
	// a run of the other tenant: a run right after its own tenant's costs
	// the room fewer turns (about 385 script calls against 510)
	_, _, _ = run("globex", always)
	_, _, _ = run("acme", always)
	tookBefore, callsBefore, _ := run("globex", always)

	// acme's run before its shadow
	tookAcme, callsAcme, _ := run("acme", always)

	e.policy(t, throttle.ShadowPrefix+"acme", "rate=5/s")
	eventually(t, 5*time.Second, func() bool {
		r, err := resolve(ctx, e.lim, "acme")
		return err == nil && r.Shadow != nil
	}, "the shadow in the limiter's cache")
	tookAfter, callsAfter, flushesAfter := run("globex", always)
	var st *throttle.Stats
	tookShadow, callsShadow, flushesShadow := run("acme", func() bool {
		// the shadow's counts are written a tick after its last decisions
		var err error
		st, err = e.lim.Stats(ctx, "acme")
		return err == nil && st.Shadow != nil && st.Shadow.Decisions == n
	})

	starts := rec.startTimes()[5*n:]
	span := starts[len(starts)-1].Sub(starts[0])
	t.Logf("%d jobs: globex (no shadow) %s and %d script calls before any shadow, %s and %d (%d shadow flushes) with acme's; acme %s and %d script calls before its shadow, %s and %d (%d shadow flushes) with it (rate=5/s), its starts spanning %s",
		n, tookBefore.Round(time.Millisecond), callsBefore, tookAfter.Round(time.Millisecond), callsAfter, flushesAfter,
		tookAcme.Round(time.Millisecond), callsAcme, tookShadow.Round(time.Millisecond), callsShadow, flushesShadow, span.Round(time.Millisecond))
	// nothing held back: at rate=5/s the jobs would take 20 s
	require.Less(t, span, 4*time.Second, "acme's jobs ran at their enforced rate, not the shadow's")
	// a tenant without a shadow pays nothing for another's: no shadow
	// flush ran (the script calls per job vary by a few percent with how
	// concurrent admissions share runs)
	require.Zero(t, flushesAfter, "no shadow flush for a tenant without a shadow")
	// and no shadow scope of its own was ever written (a shadow's scope is
	// {t:TENANT}:x..., its counts {t:TENANT}:xn:...)
	shadowKeys, err := client.Keys(ctx, "*{t:globex}:x*").Result()
	require.NoError(t, err)
	require.Empty(t, shadowKeys, "no shadow state for a tenant without a shadow")
	// The script calls of a run are its jobs' calls plus what the fleet's
	// timers run meanwhile (the pump, the forwarder): the jobs' share is
	// fixed, the timers' grows with the run's time, which a loaded machine
	// stretches. The bounds scale the run before any shadow by the ratio
	// of the run times (at least 1), which covers both parts.
	scaled := func(calls int64, before, took time.Duration) float64 {
		return float64(calls) * max(1, float64(took)/float64(before)) * 1.15
	}
	require.Less(t, float64(callsAfter), scaled(callsBefore, tookBefore, tookAfter), "no script call more for a tenant without a shadow")
	require.Positive(t, flushesShadow)
	acmeKeys, err := client.Keys(ctx, "*{t:acme}:x*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, acmeKeys, "the pattern finds a shadow's keys")
	// a tenant with one: about a script call per start, sent in a few
	// pipelines (a tick's decisions in each)
	require.Less(t, float64(callsShadow), scaled(callsAcme, tookAcme, tookShadow)+1.2*n)

	// every start decided, and all but those rate=5/s (burst 1) allows
	// over the span denied
	allowedMax := int64(1 + 5*span.Seconds() + 1)
	t.Logf("shadow rate=5/s: denied %d of %d (by rule %v), would have imposed %s of waits; at most %d allowed over the span", st.Shadow.Denied, st.Shadow.Decisions, st.Shadow.DeniedBy, st.Shadow.RetryAfter.Round(time.Millisecond), allowedMax)
	require.GreaterOrEqual(t, st.Shadow.Denied, n-allowedMax)
	require.LessOrEqual(t, st.Shadow.Denied, int64(n-1), "the first start is allowed")
	require.Equal(t, map[string]int64{"rate[0]": st.Shadow.Denied}, st.Shadow.DeniedBy)
	require.Positive(t, st.Shadow.RetryAfter)
	require.Equal(t, "rate=5/s", st.Shadow.Policy.String())

	g := srv.Gate().Gatherer()
	eventually(t, 5*time.Second, func() bool {
		return metric(t, g, "sluice_shadow_decisions_total", map[string]string{"tenant": "acme"}) == n
	}, "the worker's metric counts every decision")
	require.Equal(t, float64(st.Shadow.Denied), metric(t, g, "sluice_shadow_decisions_total", map[string]string{"tenant": "acme", "verdict": "denied", "rule": "rate[0]"}))
	// and none for globex, whose jobs ran before: none came late
	require.Zero(t, metric(t, g, "sluice_shadow_decisions_total", map[string]string{"tenant": "globex"}))
	require.Zero(t, metric(t, g, "sluice_worker_errors_total", map[string]string{"kind": "shadow"}))
	// the enforced policy's own state saw every job, and nothing was denied
	require.Zero(t, metric(t, g, "sluice_worker_decisions_total", map[string]string{"verdict": "denied"}))
}
