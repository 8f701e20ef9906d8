package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/worker"
)

// enqueueLine enqueues n jobs of tenant in one batch; with no worker
// serving the queue yet they all wait in the tenant's line.
func (e *env) enqueueLine(t *testing.T, tenant string, n int) {
	t.Helper()
	e.enqueueBatch(t, tenant, n)
}

// TestRoomFreedSlotWaitsItsTurn: a tenant whose cap is above the fleet's
// concurrency keeps the fleet busy with a long line; a quiet tenant's job
// arriving meanwhile starts within a moment. A finishing job hands its
// slot to the next in its own line only when no other tenant's turn comes
// first: before, every release handed its slot on, asynq's pending list
// stayed full, the pump never had room, and the quiet job waited for the
// whole line to drain (about 8 s here).
func TestRoomFreedSlotWaitsItsTurn(t *testing.T) {
	e := setup(t, nil)
	e.policy(t, "hog", "concurrency=8")
	e.policy(t, "quiet", "concurrency=1")
	const n = 400
	rec := newTenantRecorder(40 * time.Millisecond)
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 2 })
	srv.Handle("job", rec)
	e.enqueueLine(t, "hog", n)
	require.NoError(t, srv.Start())
	eventually(t, 10*time.Second, func() bool { return len(rec.startsOf("hog")) >= 20 }, "the hog's line is running")
	var waits []time.Duration
	for range 3 {
		at := time.Now()
		e.enqueue(t, "quiet", 1, "")
		eventually(t, 30*time.Second, func() bool { return len(rec.startsOf("quiet")) > len(waits) }, "the quiet tenant's job started")
		waits = append(waits, rec.startsOf("quiet")[len(waits)].Sub(at))
	}
	first := rec.startsOf("quiet")[0]
	hog := 0
	for _, s := range rec.startsOf("hog") {
		if s.Before(first) {
			hog++
		}
	}
	t.Logf("a hog with concurrency=8 on a fleet of 2 (%d of %d jobs started before the first quiet one): the quiet tenant's jobs waited %v", hog, n, waits)
	require.Less(t, hog, n, "the hog's line was still long")
	for _, w := range waits {
		require.Less(t, w, 1500*time.Millisecond, "the quiet tenant's job waits for its turn, not for the hog's line")
	}
	require.LessOrEqual(t, rec.maxRunOf("hog"), 8)
}

// TestRoomWeightsHoldAtSaturation: two tenants with long lines, weight=10
// and weight=1, on a fleet that runs 3 or 4 jobs at once: the heavier
// starts about ten jobs for each of the lighter's, whether the pump serves
// them (no caps), finishing jobs hand their slots on (caps above the
// fleet), or two workers' pumps share the work.
// Before, the pump shared its free room among the tenants it took in one
// round, about one per free slot, so they alternated (about 1:1), and a
// release handed its slot to its own tenant's next job, whatever the
// turn.
func TestRoomWeightsHoldAtSaturation(t *testing.T) {
	for _, tc := range []struct {
		name, rules        string
		workers, perWorker int
		least              float64 // the least ratio of starts
	}{
		{"pump", "", 1, 3, 6},
		{"release", " concurrency=8", 1, 3, 6},
		// two workers' pumps share the turns (the deficits and the order
		// are in Redis)
		{"two pumps", " concurrency=8", 2, 2, 6},
		// the pumps alone: each round often holds one of the two tenants,
		// the other pump's round the other. Before a round shared out its
		// room by the weights of every tenant its pump took within the last
		// second, each got about the room of a round: 6:1.
		{"two pumps no caps", "", 2, 2, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, nil)
			e.policy(t, "heavy", "weight=10"+tc.rules)
			e.policy(t, "light", "weight=1"+tc.rules)
			rec := newTenantRecorder(30 * time.Millisecond)
			e.enqueueLine(t, "heavy", 1500)
			e.enqueueLine(t, "light", 300)
			for range tc.workers {
				srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = tc.perWorker })
				srv.Handle("job", rec)
				require.NoError(t, srv.Start())
			}
			total := func() int { return len(rec.startsOf("heavy")) + len(rec.startsOf("light")) }
			eventually(t, 30*time.Second, func() bool { return total() >= 50 }, "the first 50 starts")
			h0, l0 := len(rec.startsOf("heavy")), len(rec.startsOf("light"))
			eventually(t, 60*time.Second, func() bool { return total() >= 50+330 }, "330 more starts")
			h, l := len(rec.startsOf("heavy"))-h0, len(rec.startsOf("light"))-l0
			ratio := float64(h) / float64(max(l, 1))
			t.Logf("weights 10:1, a saturated fleet of %d worker(s) of %d: %d starts of the heavier, %d of the lighter (%.1f:1)", tc.workers, tc.perWorker, h, l, ratio)
			require.Positive(t, l, "the lighter tenant gets its turns")
			require.GreaterOrEqual(t, ratio, tc.least, "starts by weight")
			require.LessOrEqual(t, ratio, 15.0, "starts by weight")
		})
	}
}

// TestRoomParkedTasksOutliveTheirFallback: a concurrency=1 tenant's line
// lasts longer than its jobs' fallback (3 s here, an hour by default):
// while a worker's pump runs, its sweep pushes the parked tasks' fallback
// further out, so none comes out of asynq's schedule by itself. Every job
// starts from its line, in line order, one at a time, and the gate denies
// none. Before, the jobs still waiting at the fallback came to the gate
// all at once, were denied by the cap (deferred) and ran out of order.
func TestRoomParkedTasksOutliveTheirFallback(t *testing.T) {
	e := setup(t, nil)
	q, err := queue.New(e.client, &queue.Config{Limiter: e.lim, AsynqRedis: e.asynq, Fallback: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	e.policy(t, "slow", "concurrency=1")
	const n = 6
	var ids []string
	for range n {
		// with no worker yet every job waits in the line, parked 3 s ahead
		info, err := q.Enqueue(context.Background(), "slow", asynq.NewTask("job", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
		ids = append(ids, info.ID)
	}
	require.Equal(t, int64(n), waitingOf(t, e, "slow"))
	var mu sync.Mutex
	var order []string
	rec := newTenantRecorder(1200 * time.Millisecond)
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 4 })
	srv.Handle("job", asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		order = append(order, id)
		mu.Unlock()
		return rec.ProcessTask(ctx, task)
	}))
	start := time.Now()
	require.NoError(t, srv.Start())
	eventually(t, 60*time.Second, func() bool { return rec.done() == n }, "all %d jobs ran (%d did)", n, rec.done())
	g := srv.Gate().Gatherer()
	denied := metric(t, g, "sluice_worker_decisions_total", map[string]string{"verdict": "denied"})
	running := metric(t, g, "sluice_room_skipped_total", map[string]string{"reason": "running"})
	t.Logf("%d jobs of 1.2 s under concurrency=1, parked with a 3 s fallback, ran in %s; %.0f denied at the gate, %.0f line entries found running", n, time.Since(start).Round(10*time.Millisecond), denied, running)
	require.LessOrEqual(t, rec.maxRunOf("slow"), 1)
	require.Zero(t, denied, "no job came to the gate through its fallback")
	require.Zero(t, running, "no job ran before its turn")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, ids, order, "the jobs started in line order, each once")
}
