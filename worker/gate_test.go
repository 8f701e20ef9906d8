package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/asynqtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

func TestConcurrencyHeldWhileRunningAndReleased(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "concurrency=2 lease=3s")
	rec := newRecorder(100 * time.Millisecond)
	srv := e.server(t, func(c *worker.Config) { c.Gate.TenantLabels = true })
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", 12, "")
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 12 }, "12 jobs done")
	require.Equal(t, 2, rec.maxRun)
	eventually(t, 5*time.Second, func() bool {
		st, err := e.lim.Stats(context.Background(), "acme")
		require.NoError(t, err)
		return st.Concurrency.InFlight == 0
	}, "every slot released")
	g := srv.Gate().Gatherer()
	require.Equal(t, 12.0, metric(t, g, "sluice_worker_handler_outcomes_total", map[string]string{"outcome": "success", "tenant": "acme"}))
	require.Equal(t, 12.0, metric(t, g, "sluice_worker_decisions_total", map[string]string{"verdict": "allowed"}))
	require.Zero(t, metric(t, g, "sluice_worker_in_flight", nil))
}

func TestDeferredJobsKeepTheirRetriesAndAreNeverArchived(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	// 2/s: the last jobs' slots, 5 s and more after the first start, stay
	// beyond the in-process wait (1.5 s) even when a loaded machine
	// dequeues them seconds late (jobs waiting in-process hold asynq's
	// slots meanwhile); at 5/s, in one run under make test's load, every
	// MaxRetry(0) job came close enough to wait instead
	e.policy(t, "acme", "rate=2/s")
	rec := newRecorder(0)
	var handlerErrors atomic.Int64
	srv := e.server(t, func(c *worker.Config) {
		c.Asynq.ErrorHandler = asynq.ErrorHandlerFunc(func(context.Context, *asynq.Task, error) { handlerErrors.Add(1) })
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	// Enqueued with asynq's own client, the jobs skip the waiting room and
	// asynq serves its pending list in order: the last jobs get slots more
	// than the in-process wait away and are deferred, those at MaxRetry(0)
	// as copies.
	var ids []string
	ids = append(ids, e.enqueueDirect(t, "acme", 5, "")...)
	ids = append(ids, e.enqueueDirect(t, "acme", 5, "", asynq.MaxRetry(1))...)
	ids = append(ids, e.enqueueDirect(t, "acme", 5, "", asynq.MaxRetry(0))...)
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == len(ids) }, "every job done")

	require.Zero(t, nonConforming(rec.startTimes(), 2, 2))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	copies := 0
	for _, id := range ids {
		require.Len(t, rec.starts[id], 1, "job %s started once", id)
		require.Equal(t, []int{0}, rec.retried[id], "job %s used no retry", id)
		if rec.taskIDs[id][0] != id {
			require.True(t, strings.HasPrefix(rec.taskIDs[id][0], id+"-sluice"), "copy of %s: %s", id, rec.taskIDs[id][0])
			copies++
		}
	}
	require.Positive(t, copies, "MaxRetry(0) jobs that were deferred ran as copies")
	info := e.queueInfo(t)
	require.Zero(t, info.Archived)
	require.Zero(t, info.Retry)
	require.Zero(t, info.Failed)
	require.Zero(t, handlerErrors.Load(), "deferrals are not shown to the application's ErrorHandler")
}

func TestCooldownPausesTheTenantAndDefersTheJob(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=100/s")
	const pause = 1500 * time.Millisecond
	var pausedAt atomic.Int64
	var reported []error
	var mu sync.Mutex
	rec := newRecorder(0)
	rec.before = func(ctx context.Context, id string, attempt int) error {
		if attempt == 1 && pausedAt.CompareAndSwap(0, time.Now().UnixNano()) {
			return worker.RetryAfter(pause, errors.New("downstream answered 429"))
		}
		return nil
	}
	srv := e.server(t, func(c *worker.Config) {
		c.Asynq.ErrorHandler = asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
			mu.Lock()
			reported = append(reported, err)
			mu.Unlock()
		})
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	first := e.enqueue(t, "acme", 1, "", asynq.MaxRetry(0))
	eventually(t, 5*time.Second, func() bool { return pausedAt.Load() != 0 }, "the first job asks for a pause")
	others := e.enqueue(t, "acme", 5, "")
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 6 }, "every job done")

	paused := time.Unix(0, pausedAt.Load())
	rec.mu.Lock()
	for _, id := range append(first, others...) {
		last := rec.starts[id][len(rec.starts[id])-1]
		require.False(t, last.Before(paused.Add(pause-20*time.Millisecond)), "job %s started %s after the pause began", id, last.Sub(paused))
		require.Equal(t, 0, rec.retried[id][len(rec.retried[id])-1])
	}
	require.Len(t, rec.starts[first[0]], 2)
	rec.mu.Unlock()
	require.Zero(t, e.queueInfo(t).Archived)
	mu.Lock()
	require.Len(t, reported, 1, "the handler's own cooldown error reaches the ErrorHandler")
	var ra *worker.RetryAfterError
	require.ErrorAs(t, reported[0], &ra)
	mu.Unlock()
	require.Equal(t, 1.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonCooldown}))
}

func TestOverflowDropArchivesWithTheReason(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=1/s overflow=drop backlog=100")
	var reported atomic.Int64
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) {
		c.Asynq.ErrorHandler = asynq.ErrorHandlerFunc(func(context.Context, *asynq.Task, error) { reported.Add(1) })
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", 6, "")
	eventually(t, 10*time.Second, func() bool {
		info := e.queueInfo(t)
		return info.Pending+info.Active+info.Scheduled+info.Retry == 0 && info.Archived+rec.doneCount() == 6
	}, "every job ran or was dropped")
	info := e.queueInfo(t)
	ran := rec.doneCount()
	require.GreaterOrEqual(t, ran, 1)
	require.GreaterOrEqual(t, info.Archived, 3, "jobs whose slot is beyond the in-process wait are dropped")
	archived, err := e.inspector.ListArchivedTasks(e.queue)
	require.NoError(t, err)
	for _, a := range archived {
		require.True(t, strings.HasPrefix(a.LastErr, "throttled"), a.LastErr)
	}
	require.Zero(t, nonConforming(rec.startTimes(), 1, 2))
	require.Zero(t, reported.Load())
	require.Equal(t, float64(info.Archived), metric(t, srv.Gate().Gatherer(), "sluice_worker_drops_total", nil))
	st, err := e.lim.Stats(context.Background(), "acme")
	require.NoError(t, err)
	require.Zero(t, st.Waiting, "jobs of a policy that drops them never wait in a line")
}

func TestOverflowWaitHoldsThenDefers(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=2/s overflow=wait max_wait=2s")
	rec := newRecorder(0)
	srv := e.server(t, nil)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueueDirect(t, "acme", 7, "") // past the waiting room: the gate decides
	eventually(t, 15*time.Second, func() bool { return rec.doneCount() == 7 }, "every job done")
	// Slots every 0.5 s: the jobs whose slots are within 2 s (0, 0.5, 1,
	// 1.5 and 2 s, give or take the time the jobs took to arrive) wait
	// in-process, the others are deferred once.
	deferred := metric(t, srv.Gate().Gatherer(), "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonThrottled})
	require.InDelta(t, 2, deferred, 1)
	require.Zero(t, nonConforming(rec.startTimes(), 2, 2))
	require.Zero(t, e.queueInfo(t).Archived)
}

func TestFailClosedWhileRedisIsFrozen(t *testing.T) {
	t.Parallel()
	private := redistest.NewServer(t, nil)
	sluiceRedis := private.Client(t)
	e := setup(t, sluiceRedis)
	asynqRedis := asynqtest.Client(t)
	e.q = mustQueue(t, sluiceRedis, e.lim, asynqRedis)
	e.asynq, e.inspector = asynqRedis, asynq.NewInspectorFromRedisClient(asynqRedis)
	e.policy(t, "acme", "rate=4/s")
	rec := newRecorder(0)
	cfg := func(c *worker.Config) {
		c.AsynqRedis = asynqRedis
		c.Gate.CallTimeout = 300 * time.Millisecond
		c.Gate.BackoffMax = 2 * time.Second
	}
	srv := e.server(t, cfg)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	// Warm the policy cache, then freeze sluice's Redis.
	e.enqueue(t, "acme", 1, "")
	eventually(t, 5*time.Second, func() bool { return rec.doneCount() == 1 }, "the first job runs")
	require.NoError(t, private.Freeze())
	frozen := true
	defer func() {
		if frozen {
			_ = private.Thaw()
		}
	}()
	ids := make([]string, 8)
	for i := range ids {
		info, err := asynq.NewClientFromRedisClient(asynqRedis).Enqueue(asynq.NewTaskWithHeaders("job", nil, map[string]string{taskspec.TenantHeader: "acme"}), asynq.Queue(e.queue))
		require.NoError(t, err)
		ids[i] = info.ID
	}
	g := srv.Gate().Gatherer()
	eventually(t, 10*time.Second, func() bool {
		return metric(t, g, "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonUnavailable}) >= 8
	}, "every job deferred while Redis is frozen")
	time.Sleep(time.Second) // a window in which nothing may run
	require.Equal(t, 1, rec.doneCount(), "nothing runs unthrottled")
	require.NoError(t, private.Thaw())
	frozen = false
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == 9 }, "every job done after Redis is back")
	require.Zero(t, nonConforming(rec.startTimes(), 4, 2))
	info := e.queueInfo(t)
	require.Zero(t, info.Archived)
	rec.mu.Lock()
	for _, id := range ids {
		require.Equal(t, []int{0}, rec.retried[id])
	}
	rec.mu.Unlock()
}

func TestFailOpenRunsJobsWhileRedisIsFrozen(t *testing.T) {
	t.Parallel()
	private := redistest.NewServer(t, nil)
	sluiceRedis := private.Client(t)
	e := setup(t, sluiceRedis)
	asynqRedis := asynqtest.Client(t)
	e.q = mustQueue(t, sluiceRedis, e.lim, asynqRedis)
	e.asynq, e.inspector = asynqRedis, asynq.NewInspectorFromRedisClient(asynqRedis)
	e.policy(t, "acme", "rate=1/min fail_open=true")
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) {
		c.AsynqRedis = asynqRedis
		c.Gate.CallTimeout = 300 * time.Millisecond
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", 1, "")
	eventually(t, 5*time.Second, func() bool { return rec.doneCount() == 1 }, "the first job runs")
	require.NoError(t, private.Freeze())
	defer func() { _ = private.Thaw() }()
	for i := 0; i < 4; i++ {
		_, err := asynq.NewClientFromRedisClient(asynqRedis).Enqueue(asynq.NewTaskWithHeaders("job", nil, map[string]string{taskspec.TenantHeader: "acme"}), asynq.Queue(e.queue))
		require.NoError(t, err)
	}
	eventually(t, 15*time.Second, func() bool { return rec.doneCount() == 5 }, "jobs run unthrottled (rate=1/min would hold them)")
	require.Equal(t, 4.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_decisions_total", map[string]string{"verdict": "fail_open"}))
}

func TestShutdownHandsBackWaitingJobsAndReleasesSlots(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=12/min concurrency=1 lease=10s")
	rec := newRecorder(0)
	started := make(chan struct{}, 1)
	rec.before = func(ctx context.Context, id string, attempt int) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done() // a long job that stops only when asynq aborts it
		return ctx.Err()
	}
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.InProcessWait = 6 * time.Second
		c.Asynq.ShutdownTimeout = 500 * time.Millisecond
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueueDirect(t, "acme", 2, "") // past the waiting room: the gate holds the second
	<-started
	g := srv.Gate().Gatherer()
	eventually(t, 5*time.Second, func() bool {
		return metric(t, g, "sluice_worker_decisions_total", map[string]string{"verdict": "denied"}) >= 1
	}, "the second job waits in-process for its slot, 5 s away")
	begin := time.Now()
	srv.Shutdown()
	require.Less(t, time.Since(begin), 3*time.Second, "the in-process wait ends at once")
	st, err := e.lim.Stats(context.Background(), "acme")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "the aborted job's slot is released")
	require.Equal(t, int64(1), st.Reservations, "the handed-back job keeps its reservation")
	info := e.queueInfo(t)
	require.Zero(t, info.Archived)
	require.Equal(t, 2, info.Pending+info.Retry+info.Scheduled, "both jobs are back in the queue")
	require.Equal(t, 1.0, metric(t, g, "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonShutdown}))
}

func TestUnusableHeadersRunTheJobUnderGlobal(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "@global", "concurrency=1")
	var logs bytes.Buffer
	var logMu sync.Mutex
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	ac := asynq.NewClientFromRedisClient(e.asynq)
	for _, h := range []map[string]string{
		{taskspec.TenantHeader: strings.Repeat("x", 300)},
		{taskspec.TenantHeader: "acme", taskspec.CostHeader: "lots"},
		{taskspec.TenantHeader: "@global"},
		nil,
	} {
		_, err := ac.Enqueue(asynq.NewTaskWithHeaders("job", nil, h), asynq.Queue(e.queue))
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 4 }, "every job runs")
	require.Equal(t, 1, rec.maxRun, "@global's limit still applies")
	g := srv.Gate().Gatherer()
	// Counted per delivery: a job waiting for @global's slot may come twice.
	require.GreaterOrEqual(t, metric(t, g, "sluice_worker_errors_total", map[string]string{"kind": "tenant_header"}), 2.0)
	require.GreaterOrEqual(t, metric(t, g, "sluice_worker_errors_total", map[string]string{"kind": "cost_header"}), 1.0)
	logMu.Lock()
	require.Contains(t, logs.String(), "runs under @global")
	logMu.Unlock()
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestPanickingHandlerReleasesItsSlot(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "concurrency=1 lease=30s")
	rec := newRecorder(0)
	rec.before = func(ctx context.Context, id string, attempt int) error {
		if attempt == 1 {
			panic("boom")
		}
		return nil
	}
	srv := e.server(t, nil)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", 3, "")
	// With the slot held until its 30 s lease ran out, this would time out.
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 3 }, "every job done after its panic")
	require.Equal(t, 3.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_handler_outcomes_total", map[string]string{"outcome": "panic"}))
}

func TestLeaseRenewedWhileTheJobRuns(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "concurrency=1 lease=1s")
	rec := newRecorder(1500 * time.Millisecond)
	srv := e.server(t, nil)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", 2, "")
	eventually(t, 15*time.Second, func() bool { return rec.doneCount() == 2 }, "both jobs done")
	require.Equal(t, 1, rec.maxRun, "the renewed lease kept the second job out")
	g := srv.Gate().Gatherer()
	require.GreaterOrEqual(t, metric(t, g, "sluice_worker_lease_renewals_total", map[string]string{"result": "ok"}), 6.0)
	require.Zero(t, metric(t, g, "sluice_worker_lease_renewals_total", map[string]string{"result": "lost"}))
}

func TestCostNoRuleAdmitsIsDeferredUntilThePolicyChanges(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=10/s burst=2")
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.BackoffMin = 200 * time.Millisecond
		c.Gate.BackoffMax = 400 * time.Millisecond
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	// A producer that bypassed queue.Client's check (or a policy changed
	// after enqueue) left a job no rule can admit.
	_, err := asynq.NewClientFromRedisClient(e.asynq).Enqueue(
		asynq.NewTaskWithHeaders("job", nil, map[string]string{taskspec.TenantHeader: "acme", taskspec.CostHeader: "5"}),
		asynq.Queue(e.queue), asynq.MaxRetry(0))
	require.NoError(t, err)
	g := srv.Gate().Gatherer()
	eventually(t, 10*time.Second, func() bool {
		return metric(t, g, "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonCost}) >= 2
	}, "the job is deferred, not archived")
	require.Zero(t, e.queueInfo(t).Archived)
	e.policy(t, "acme", "rate=10/s burst=5")
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 1 }, "the job runs once the policy admits it")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	defer lim.Close()
	for _, c := range []worker.Config{
		{Gate: worker.GateConfig{InProcessWait: time.Second}},
		{Gate: worker.GateConfig{Lead: -time.Second}},
		{Gate: worker.GateConfig{BackoffMin: 2 * time.Second, BackoffMax: time.Second}},
		{Gate: worker.GateConfig{CallTimeout: time.Millisecond}},
		{Asynq: asynq.Config{DelayedTaskCheckInterval: time.Second}},
		{Gate: worker.GateConfig{Lead: 150 * time.Millisecond}},
		{Limiter: lim, Prefix: "x"},
	} {
		_, err := worker.New(client, &c)
		require.Error(t, err, "%+v", c)
	}
	_, err = worker.New(nil, nil)
	require.Error(t, err)
	_, err = worker.NewGate(nil, client, nil)
	require.Error(t, err)
	_, err = worker.NewGate(lim, nil, nil)
	require.Error(t, err)
}

// mustQueue returns a producer whose sluice keys and asynq queues live on
// different servers.
func mustQueue(tb testing.TB, sluiceRedis redis.UniversalClient, lim *throttle.Limiter, asynqRedis redis.UniversalClient) *queue.Client {
	tb.Helper()
	q, err := queue.New(sluiceRedis, &queue.Config{Limiter: lim, AsynqRedis: asynqRedis})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, q.Close()) })
	return q
}

func TestRunShutsDownWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	rec := newRecorder(0)
	srv := e.server(t, nil)
	srv.Handle("job", rec)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	e.enqueue(t, "acme", 3, "")
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 3 }, "jobs done while running")
	cancel()
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.ErrorIs(t, srv.Start(), asynq.ErrServerClosed)
}

// TestRenewalsAreCoalesced: the leases of a process's running jobs are
// renewed together, about one script run per tick, not one per job.
func TestRenewalsAreCoalesced(t *testing.T) {
	t.Parallel()
	private := redistest.NewServer(t, nil)
	client := private.Client(t)
	e := setup(t, client)
	const jobs = 20
	e.policy(t, "acme", fmt.Sprintf("concurrency=%d lease=1s", jobs))
	release := make(chan struct{})
	var mu sync.Mutex
	running := 0
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = jobs })
	srv.HandleFunc("job", func(ctx context.Context, _ *asynq.Task) error {
		mu.Lock()
		running++
		mu.Unlock()
		<-release
		return nil
	})
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", jobs, "")
	eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return running == jobs }, "all %d jobs running", jobs)
	g := srv.Gate().Gatherer()
	ok0 := metric(t, g, "sluice_worker_lease_renewals_total", map[string]string{"result": "ok"})
	calls0 := scriptCalls(t, client)
	time.Sleep(1500 * time.Millisecond) // the window measured: several lease/3 ticks
	renewed := metric(t, g, "sluice_worker_lease_renewals_total", map[string]string{"result": "ok"}) - ok0
	calls := scriptCalls(t, client) - calls0
	close(release)
	t.Logf("%d running jobs, lease 1s: %.0f renewals in 1.5s in %d script calls of every kind", jobs, renewed, calls)
	require.GreaterOrEqual(t, renewed, float64(jobs*3), "every job renewed every lease/3")
	require.Less(t, float64(calls), renewed/3, "renewals share script runs")
	require.Zero(t, metric(t, g, "sluice_worker_lease_renewals_total", map[string]string{"result": "lost"}))
}

// scriptCalls counts the script calls (EVALSHA and EVAL) Redis has served.
func scriptCalls(tb testing.TB, client *redis.Client) int64 {
	tb.Helper()
	return commandCalls(tb, client, "evalsha", "eval")
}

// commandCalls counts the calls of the commands (lower case) Redis has
// served.
func commandCalls(tb testing.TB, client *redis.Client, commands ...string) int64 {
	tb.Helper()
	info, err := client.Info(context.Background(), "commandstats").Result()
	require.NoError(tb, err)
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !slices.Contains(commands, strings.TrimPrefix(name, "cmdstat_")) {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		require.NoError(tb, err)
		n += v
	}
	return n
}
