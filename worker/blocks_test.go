package worker_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// TestBlocksServeATenantFarFromItsLimits: jobs of a tenant far from its
// limits start from blocks, with about no script call of their own; a
// tenant near its limits (a burst of 1) is decided job by job; with
// NoBlocks every job is decided alone. Concurrency is never exceeded and
// the started meter counts every job.
func TestBlocksServeATenantFarFromItsLimits(t *testing.T) {
	t.Parallel()
	private := redistest.NewServer(t, nil)
	client := private.Client(t)
	ctx := context.Background()
	run := func(noBlocks bool) (calls int64, fromBlocks float64, maxRun int) {
		e := setup(t, client)
		e.policy(t, "acme", "rate=100000/s burst=50000 concurrency=400")
		e.policy(t, "slow", "rate=50/s")
		rec := newRecorder(0)
		srv := e.server(t, func(c *worker.Config) {
			c.Asynq.Concurrency = 20
			c.Gate.NoBlocks = noBlocks
		})
		srv.Handle("job", rec)
		require.NoError(t, srv.Start())
		defer srv.Shutdown()
		const n = 2000
		e.enqueueDirect(t, "acme", 10, "") // warm up: scripts loaded, the pump running
		eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 10 }, "warm-up jobs done")
		g := srv.Gate().Gatherer()
		calls0, blocks0 := scriptCalls(t, client), metric(t, g, "sluice_worker_block_starts_total", nil)
		e.enqueueDirect(t, "acme", n, "")
		eventually(t, 60*time.Second, func() bool { return rec.doneCount() == 10+n }, "%d jobs done", n)
		calls = scriptCalls(t, client) - calls0
		fromBlocks = metric(t, g, "sluice_worker_block_starts_total", nil) - blocks0

		// a tenant near its limits: every job decided alone
		blocks1 := metric(t, g, "sluice_worker_block_starts_total", nil)
		e.enqueueDirect(t, "slow", 5, "")
		eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 15+n }, "slow's jobs done")
		require.Equal(t, blocks1, metric(t, g, "sluice_worker_block_starts_total", nil), "no block for a tenant with a burst of 1")

		st, err := e.lim.Stats(ctx, "acme")
		require.NoError(t, err)
		require.GreaterOrEqual(t, st.Started, int64(10+n), "the started meter counts every job")
		rec.mu.Lock()
		maxRun = rec.maxRun
		rec.mu.Unlock()
		return calls, fromBlocks, maxRun
	}
	calls, fromBlocks, maxRun := run(false)
	callsAlone, fromBlocksAlone, _ := run(true)
	// asynq itself runs three scripts per job (its enqueue, dequeue and
	// done): what is left is sluice's
	const n, asynqCalls = 2000, 3 * 2000
	t.Logf("%d jobs of a tenant far from its limits: %.0f started from blocks, %d script calls, sluice's %.3f per job; with NoBlocks %d, sluice's %.3f per job; at most %d running at once",
		n, fromBlocks, calls, float64(calls-asynqCalls)/n, callsAlone, float64(callsAlone-asynqCalls)/n, maxRun)
	require.GreaterOrEqual(t, fromBlocks, 0.9*n, "most jobs start from blocks")
	require.Less(t, float64(calls-asynqCalls), 0.1*n, "about no script call of sluice's per job")
	require.Zero(t, fromBlocksAlone)
	require.GreaterOrEqual(t, float64(callsAlone-asynqCalls), 1.0*n, "a decision per job without blocks (their releases share runs)")
	require.LessOrEqual(t, maxRun, 20)
}

// TestBlocksLowerLimit: a policy lowered after a worker spent blocks takes
// effect for the jobs that come after the worker's cache sees it: the
// block granted under the old policy is retired, none is granted under
// the new one (a burst of 1), and the new rate holds. (The meters the old
// rate left ahead are re-timed to the new one, as after single decisions:
// docs/operations.md.)
func TestBlocksLowerLimit(t *testing.T) {
	t.Parallel()
	private := redistest.NewServer(t, nil)
	client := private.Client(t)
	e := setup(t, client)
	e.policy(t, "acme", "rate=10000/s burst=5000")
	rec := newRecorder(0)
	var mu sync.Mutex
	var admitted []time.Time // the admissions' Redis times
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 10 })
	srv.Handle("job", asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		a, _ := worker.AdmissionFrom(ctx)
		mu.Lock()
		admitted = append(admitted, a.Decision.Now)
		mu.Unlock()
		return rec.ProcessTask(ctx, task)
	}))
	require.NoError(t, srv.Start())
	defer srv.Shutdown()
	g := srv.Gate().Gatherer()
	e.enqueueDirect(t, "acme", 200, "")
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 200 }, "jobs done")
	require.Positive(t, metric(t, g, "sluice_worker_block_starts_total", nil))

	e.policy(t, "acme", "rate=200/s burst=1")
	eventually(t, 5*time.Second, func() bool {
		r, err := resolve(context.Background(), e.lim, "acme")
		return err == nil && r.Policy.String() == "rate=200/s"
	}, "the lowered policy in the limiter's cache")
	blocks0 := metric(t, g, "sluice_worker_block_starts_total", nil)
	mu.Lock()
	from := len(admitted)
	mu.Unlock()
	e.enqueueDirect(t, "acme", 10, "")
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 210 }, "jobs done at the lowered rate")
	require.Equal(t, blocks0, metric(t, g, "sluice_worker_block_starts_total", nil), "no block under the lowered policy")
	mu.Lock()
	after := slices.Clone(admitted[from:])
	mu.Unlock()
	slices.SortFunc(after, time.Time.Compare)
	require.Empty(t, nonConformingTol(after, 200, 1, throttle.ToleranceDefault), "the lowered rate holds for every job after it: %v", after)
}
