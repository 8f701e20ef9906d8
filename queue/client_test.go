package queue_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/waitroom"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

func TestEnqueueSetsHeadersAndPassesOptions(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.fleet(t, 10)
	task := asynq.NewTaskWithHeaders("email", []byte(`{"to":"a@example.com"}`), map[string]string{
		"trace":           "abc",
		taskspec.IDHeader: "stale",
	})
	info, err := e.q.Enqueue(ctx, "acme", task, asynq.Queue(e.queue), asynq.MaxRetry(2), queue.Cost(3),
		asynq.Timeout(time.Minute), asynq.Retention(time.Hour))
	require.NoError(t, err)
	require.Equal(t, e.queue, info.Queue)
	require.Equal(t, 2, info.MaxRetry)
	require.Equal(t, time.Minute, info.Timeout)
	require.Equal(t, time.Hour, info.Retention)
	require.Equal(t, asynq.TaskStatePending, info.State, "the fleet has room and nothing limits acme: straight to asynq")
	require.NotEmpty(t, info.Headers[taskspec.DecidedHeader], "the room's decision travels with the job")
	delete(info.Headers, taskspec.DecidedHeader)
	require.Equal(t, map[string]string{"trace": "abc", taskspec.TenantHeader: "acme", taskspec.CostHeader: "3"}, info.Headers)

	stored, err := e.inspector.GetTaskInfo(e.queue, info.ID)
	require.NoError(t, err)
	delete(stored.Headers, taskspec.DecidedHeader)
	require.Equal(t, info.Headers, stored.Headers)

	// The caller's task is not changed.
	require.Equal(t, "stale", task.Headers()[taskspec.IDHeader])

	// A cost of 1 is the default and needs no header; a given TaskID is kept.
	info, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("job-1"))
	require.NoError(t, err)
	require.Equal(t, "job-1", info.ID)
	delete(info.Headers, taskspec.DecidedHeader)
	require.Equal(t, map[string]string{taskspec.TenantHeader: "acme"}, info.Headers)

	// Options given to asynq.NewTask are not carried (asynq keeps them
	// private): the job gets asynq's defaults; options given to Enqueue are.
	info, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil, asynq.MaxRetry(0)), asynq.Queue(e.queue))
	require.NoError(t, err)
	require.Equal(t, 25, info.MaxRetry)
	info, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.MaxRetry(0))
	require.NoError(t, err)
	require.Zero(t, info.MaxRetry)
}

func TestEnqueueRefusesBadInputBeforeWriting(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "capped", "backlog=10 rate=10/s")
	task := asynq.NewTask("email", nil)
	type fakeOption struct{ asynq.Option }
	cases := []struct {
		name    string
		tenant  string
		task    *asynq.Task
		opts    []asynq.Option
		field   string
		contain string
	}{
		{"empty tenant", "", task, nil, "tenant", "the tenant is empty"},
		{"oversized tenant", strings.Repeat("x", throttle.MaxTenantLen+1), task, nil, "tenant", "at most 256"},
		{"reserved tenant", "*", task, nil, "tenant", "reserved name"},
		{"invalid UTF-8 tenant", "a\xffb", task, nil, "tenant", "not valid UTF-8"},
		{"control character in tenant", "a\tb", task, nil, "tenant", "control character (U+0009)"},
		{"NUL in tenant", "a\x00b", task, nil, "tenant", "control character (U+0000)"},
		{"nil task", "capped", nil, nil, "task", "is nil"},
		{"empty type", "capped", asynq.NewTask("", nil), nil, "task", "empty type"},
		{"cost 0", "capped", task, []asynq.Option{queue.Cost(0)}, "cost", "at least 1"},
		{"negative cost", "capped", task, []asynq.Option{queue.Cost(-2)}, "cost", "at least 1"},
		{"nil option", "capped", task, []asynq.Option{nil}, "option", "is nil"},
		{"foreign option", "capped", task, []asynq.Option{fakeOption{asynq.MaxRetry(1)}}, "option", "unknown option"},
		{"blank queue", "capped", task, []asynq.Option{asynq.Queue(" ")}, "option", "queue name is empty"},
		{"blank task id", "capped", task, []asynq.Option{asynq.TaskID("")}, "option", "task id is empty"},
		{"short unique", "capped", task, []asynq.Option{asynq.Unique(time.Millisecond)}, "option", "at least 1s"},
		{"group", "capped", task, []asynq.Option{asynq.Group("g")}, "option", "grouped tasks"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]asynq.Option{asynq.Queue(e.queue)}, tc.opts...)
			_, err := e.q.Enqueue(ctx, tc.tenant, tc.task, opts...)
			require.ErrorIs(t, err, queue.ErrInvalid)
			var ie *queue.InvalidError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.field, ie.Field)
			require.Contains(t, err.Error(), tc.contain)
			if tc.field == "tenant" {
				require.ErrorIs(t, err, throttle.ErrInvalidTenant)
			}
		})
	}
	require.Empty(t, e.asynqKeys(t))
	require.Zero(t, e.waiting(t, "capped"))
	st, err := e.lim.Stats(ctx, "capped")
	require.NoError(t, err)
	require.Zero(t, st.Reservations)
}

func TestEnqueueRefusesACostThePolicyCanNeverAdmit(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=10/s burst=5 backlog=10")
	for _, opts := range [][]asynq.Option{nil, {asynq.ProcessIn(time.Hour)}} {
		_, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask("sync", nil), append(opts, asynq.Queue(e.queue), queue.Cost(6))...)
		var ce *throttle.CostError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, int64(5), ce.Max)
	}
	require.Empty(t, e.asynqKeys(t))
	require.Zero(t, e.waiting(t, "acme"))

	// a pool's rules bound the cost of the jobs that name it alike
	e.policy(t, "@llm", "window=100/min")
	_, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask("sync", nil), asynq.Queue(e.queue), queue.Cost(5), queue.Pools("@llm"))
	require.NoError(t, err)
	_, err = e.q.Enqueue(context.Background(), "free", asynq.NewTask("sync", nil), asynq.Queue(e.queue), queue.Cost(101), queue.Pools("@llm"))
	var ce *throttle.CostError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(100), ce.Max)
	require.Contains(t, ce.Error(), "@llm")
}

// TestJobsWaitInTheirLine: a job its tenant cannot start now is parked in
// asynq's schedule at its fallback time and waits in its tenant's line,
// charged nothing, in the order it came; with no worker serving the queue
// every job waits.
func TestJobsWaitInTheirLine(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s")
	e.fleet(t, 10)
	// no worker serves this queue: everything waits
	info, err := e.q.Enqueue(ctx, "idle", asynq.NewTask("email", nil), asynq.Queue("unserved-"+e.queue))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, info.State)
	require.WithinDuration(t, time.Now().Add(queue.FallbackDefault), info.NextProcessAt, 2*time.Second)
	require.Equal(t, int64(1), e.waiting(t, "idle"))

	var ids []string
	for i := 0; i < 5; i++ {
		info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
		if i == 0 {
			require.Equal(t, asynq.TaskStatePending, info.State, "the first may start now")
			continue
		}
		require.Equal(t, asynq.TaskStateScheduled, info.State, "job %d waits for its slot", i)
		ids = append(ids, info.ID)
	}
	ws, err := waitroom.Of(e.lim).WaitingIDs(ctx, "acme", 10)
	require.NoError(t, err)
	var lined []string
	for _, w := range ws {
		require.Equal(t, e.queue, w.Queue)
		lined = append(lined, w.ID)
	}
	require.Equal(t, ids, lined, "first in, first out")
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(4), st.Waiting)
	require.Equal(t, int64(1), st.Reservations, "only the job sent straight holds a slot (rate=10/s has no burst to spare: the gate decides it)")
}

// TestLongLinesParkLonger: a job behind a long line at a slow rate stays
// parked for twice the time its line needs, so that asynq's fallback never
// brings the tail of a line in ahead of its turn.
func TestLongLinesParkLonger(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "slow", "rate=1/min")
	var ws []waitroom.Waiter
	for i := 0; i < 100; i++ {
		ws = append(ws, waitroom.Waiter{ID: fmt.Sprint("w", i), Queue: e.queue})
	}
	_, _, err := waitroom.Of(e.lim).Join(ctx, "slow", 0, ws...)
	require.NoError(t, err)
	info, err := e.q.Enqueue(ctx, "slow", asynq.NewTask("email", nil), asynq.Queue(e.queue))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(2*101*time.Minute), info.NextProcessAt, 5*time.Second)
}

func TestBacklogCapsTheLine(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "backlog=3")
	for i := 0; i < 3; i++ {
		_, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
	}
	_, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("refused"))
	require.ErrorIs(t, err, throttle.ErrBacklogFull)
	var be *throttle.BacklogError
	require.ErrorAs(t, err, &be)
	require.Equal(t, &throttle.BacklogError{Tenant: "acme", Backlog: 3, Limit: 3}, be)
	info, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(t, err)
	require.Equal(t, 3, info.Scheduled, "the refused job is not in asynq")
	_, err = e.inspector.GetTaskInfo(e.queue, "refused")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)

	// A job that leaves the line makes room.
	turnRoom(t, e, "acme", 1)
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
	require.NoError(t, err)

	// Tenants without a cap are not held.
	for i := 0; i < 5; i++ {
		_, err = e.q.Enqueue(ctx, "other", asynq.NewTask("email", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
	}
}

// turnRoom promotes up to n jobs of tenant's line as a worker's pump does,
// handing them to asynq.
func turnRoom(t *testing.T, e *env, tenant string, n int) {
	t.Helper()
	ws, err := waitroom.Of(e.lim).WaitingIDs(context.Background(), tenant, int64(n))
	require.NoError(t, err)
	for _, w := range ws {
		require.NoError(t, e.inspector.RunTask(w.Queue, w.ID))
	}
	_, err = e.client.LPopCount(context.Background(), e.lineKey(tenant), len(ws)).Result()
	require.NoError(t, err)
}

func TestFailedEnqueueLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "backlog=5 concurrency=1")
	_, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", []byte("1")), asynq.Queue(e.queue), asynq.TaskID("fixed"))
	require.NoError(t, err)

	// A waiting job's id taken: its duplicate does not join the line.
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", []byte("2")), asynq.Queue(e.queue), asynq.TaskID("fixed"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	require.Contains(t, err.Error(), `tenant "acme"`)
	require.Equal(t, int64(1), e.waiting(t, "acme"))
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("report", []byte("x")), asynq.Queue(e.queue), asynq.Unique(time.Minute))
	require.NoError(t, err)
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("report", []byte("x")), asynq.Queue(e.queue), asynq.Unique(time.Minute))
	require.ErrorIs(t, err, asynq.ErrDuplicateTask)
	require.Equal(t, int64(2), e.waiting(t, "acme"))

	// A job sent straight gives back its slot when asynq refuses it.
	e.fleet(t, 10)
	_, err = e.q.Enqueue(ctx, "solo", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("fixed"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	e.policy(t, "solo", "concurrency=1")
	_, err = e.q.Enqueue(ctx, "solo", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("fixed"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	st, err := e.lim.Stats(ctx, "solo")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "the refused job's slot was given back")
	require.Zero(t, st.Waiting)
}

func TestDelayedAndDroppedJobsSkipTheRoom(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/s")
	info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), info.NextProcessAt, 2*time.Second)
	e.policy(t, "lossy", "rate=1/s overflow=drop")
	info, err = e.q.Enqueue(ctx, "lossy", asynq.NewTask("email", nil), asynq.Queue(e.queue))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State, "work worthless late is not held: the gate drops it if it cannot start")
	for _, tenant := range []string{"acme", "lossy"} {
		st, err := e.lim.Stats(ctx, tenant)
		require.NoError(t, err)
		require.Zero(t, st.Reservations)
		require.Zero(t, st.Waiting)
	}
}

func TestEnqueueBatchReportsEveryJob(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "capped", "backlog=3")
	e.policy(t, "rated", "rate=100/s")
	var jobs []queue.Job
	add := func(tenant string, opts ...asynq.Option) {
		jobs = append(jobs, queue.Job{Tenant: tenant, Task: asynq.NewTask("email", []byte(fmt.Sprint(len(jobs)))), Options: append([]asynq.Option{asynq.Queue(e.queue)}, opts...)})
	}
	for i := 0; i < 5; i++ {
		add("capped")
	}
	add("")                          // 5: invalid tenant
	add("free", asynq.TaskID("dup")) // 6
	add("free", asynq.TaskID("dup")) // 7: duplicate in the batch
	add("free", queue.Cost(0))       // 8: bad cost
	for i := 0; i < 20; i++ {        // 9..28
		add("rated")
	}
	res := e.q.EnqueueBatch(ctx, jobs)
	require.Len(t, res, len(jobs))
	for i := 0; i < 3; i++ {
		require.NoError(t, res[i].Err, "job %d", i)
	}
	for i := 3; i < 5; i++ {
		require.ErrorIs(t, res[i].Err, throttle.ErrBacklogFull, "job %d", i)
		require.Nil(t, res[i].Info)
	}
	require.ErrorIs(t, res[5].Err, throttle.ErrInvalidTenant)
	require.NoError(t, res[6].Err)
	require.Equal(t, "dup", res[6].Info.ID)
	require.ErrorIs(t, res[7].Err, queue.ErrInvalid)
	require.Contains(t, res[7].Err.Error(), "jobs[6] of the batch already has this task id")
	require.ErrorIs(t, res[8].Err, queue.ErrInvalid)
	var rated []string
	for i := 9; i < len(jobs); i++ {
		require.NoError(t, res[i].Err, "job %d", i)
		require.Equal(t, "rated", res[i].Info.Headers[taskspec.TenantHeader])
		rated = append(rated, res[i].Info.ID)
	}
	require.Equal(t, int64(3), e.waiting(t, "capped"))
	ws, err := waitroom.Of(e.lim).WaitingIDs(ctx, "rated", 100)
	require.NoError(t, err)
	var lined []string
	for _, w := range ws {
		lined = append(lined, w.ID)
	}
	require.Equal(t, rated, lined, "a tenant's jobs wait in batch order")
	q, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(t, err)
	require.Equal(t, 3+1+20, q.Size)
}

func TestEnqueueBatchAcrossManyTenants(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "*", "backlog=2 rate=50/s")
	var jobs []queue.Job
	for i := 0; i < 300; i++ {
		jobs = append(jobs, queue.Job{Tenant: fmt.Sprintf("t%d", i%100), Task: asynq.NewTask("email", nil), Options: []asynq.Option{asynq.Queue(e.queue)}})
	}
	res := e.q.EnqueueBatch(ctx, jobs)
	ok, full := 0, 0
	for _, r := range res {
		switch {
		case r.Err == nil:
			ok++
		case errors.Is(r.Err, throttle.ErrBacklogFull):
			full++
		default:
			t.Fatalf("unexpected error: %v", r.Err)
		}
	}
	require.Equal(t, 200, ok)
	require.Equal(t, 100, full)
	for i := 0; i < 100; i++ {
		require.Nil(t, res[200+i].Info, "the first two jobs of each tenant in batch order are taken")
	}
}

func TestScheduleFor(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_700_000_000, 0)
	cases := []struct {
		slot, lead time.Duration
		want       time.Duration
	}{
		{slot: 5 * time.Second, lead: 300 * time.Millisecond, want: 4500 * time.Millisecond},
		{slot: 5300 * time.Millisecond, lead: 300 * time.Millisecond, want: 5500 * time.Millisecond},
		{slot: 5299 * time.Millisecond, lead: 300 * time.Millisecond, want: 4500 * time.Millisecond},
		{slot: 10 * time.Second, lead: time.Second, want: 9500 * time.Millisecond},
	}
	for _, c := range cases {
		got := taskspec.ScheduleFor(base.Add(c.slot), c.lead)
		require.Equal(t, base.Add(c.want), got, "slot %s lead %s", c.slot, c.lead)
		// asynq's score is the whole second; it must lie in (slot-lead-1s, slot-lead].
		score := time.Unix(got.Unix(), 0)
		require.False(t, score.After(base.Add(c.slot-c.lead)))
		require.True(t, score.After(base.Add(c.slot-c.lead-time.Second)))
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	client := setup(t, nil).client
	lim, err := throttle.NewLimiter(client, nil)
	require.NoError(t, err)
	defer lim.Close()
	for _, cfg := range []*queue.Config{
		{Limiter: lim, Prefix: "x"},
		{Fallback: time.Millisecond},
		{BatchConcurrency: -1},
	} {
		_, err := queue.New(client, cfg)
		require.Error(t, err, "%+v", cfg)
	}
	_, err = queue.New(nil, nil)
	require.Error(t, err)
}

// TestEnqueueBatchLongLine: a batch of 10,000 jobs of one tenant joins its
// line whole, in batch order (line.lua once unpacked every entry into one
// RPUSH: from about 8,000 Redis refused the script, and the whole batch
// failed), and a backlog cap holds across the calls a long batch takes.
func TestEnqueueBatchLongLine(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "capped", "backlog=2500")
	const n = 10_000
	jobs := make([]queue.Job, 0, n+3000)
	for i := 0; i < n; i++ {
		jobs = append(jobs, queue.Job{Tenant: "big", Task: asynq.NewTask("email", nil), Options: []asynq.Option{asynq.Queue(e.queue)}})
	}
	for i := 0; i < 3000; i++ {
		jobs = append(jobs, queue.Job{Tenant: "capped", Task: asynq.NewTask("email", nil), Options: []asynq.Option{asynq.Queue(e.queue)}})
	}
	res := e.q.EnqueueBatch(ctx, jobs)
	require.Len(t, res, len(jobs))
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		require.NoError(t, res[i].Err, "job %d", i)
		ids = append(ids, res[i].Info.ID)
	}
	ws, err := waitroom.Of(e.lim).WaitingIDs(ctx, "big", 0)
	require.NoError(t, err)
	lined := make([]string, 0, len(ws))
	for _, w := range ws {
		lined = append(lined, w.ID)
	}
	require.Equal(t, ids, lined, "the tenant's jobs wait in batch order")
	for i := n; i < n+2500; i++ {
		require.NoError(t, res[i].Err, "job %d", i)
	}
	for i := n + 2500; i < len(jobs); i++ {
		require.ErrorIs(t, res[i].Err, throttle.ErrBacklogFull, "job %d", i)
		require.Nil(t, res[i].Info)
	}
	require.Equal(t, int64(2500), e.waiting(t, "capped"))
	q, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(t, err)
	require.Equal(t, n+2500, q.Scheduled, "the refused jobs are not in asynq")
}

// orphan leaves what a producer that died between parking a job's task in
// asynq and putting the job in its line (the crash point queue.parked)
// leaves: the job arrived (and waits), its task is parked at its fallback,
// and no line holds it.
func orphan(t *testing.T, e *env, tenant, id string) {
	t.Helper()
	ctx := context.Background()
	a, err := waitroom.Of(e.lim).Arrive(ctx, waitroom.Arrival{Tenant: tenant, ID: id, Queue: e.queue})
	require.NoError(t, err)
	require.False(t, a.Straight)
	task := asynq.NewTaskWithHeaders("email", nil, map[string]string{taskspec.TenantHeader: tenant})
	_, err = asynq.NewClientFromRedisClient(e.asynq).Enqueue(task, asynq.Queue(e.queue), asynq.TaskID(id), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
}

// TestEnqueueRetryJoinsAnOrphan: a producer that died after parking a
// job's task and before its line took it retries with the same task id:
// the retry puts the parked job in its line and succeeds (before, asynq's
// "conflict" answered it, and the job waited for its fallback: an hour).
// A job that waits in its line, or was run, still gets the conflict.
func TestEnqueueRetryJoinsAnOrphan(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/s")
	orphan(t, e, "acme", "lost")
	require.Zero(t, e.waiting(t, "acme"), "the job is in no line")

	info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("lost"))
	require.NoError(t, err, "the retry of a parked job that is in no line")
	require.Equal(t, "lost", info.ID)
	require.Equal(t, asynq.TaskStateScheduled, info.State)
	ws, err := waitroom.Of(e.lim).WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{{ID: "lost", Queue: e.queue, Cost: 1}}, ws, "the retry put the job in its line")

	// a second retry: the job waits in its line now
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("lost"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	require.Equal(t, int64(1), e.waiting(t, "acme"))

	// another tenant's retry with the id is not this job's
	orphan(t, e, "acme", "other")
	_, err = e.q.Enqueue(ctx, "globex", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("other"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	require.Zero(t, e.waiting(t, "globex"))

	// a job scheduled for later by its producer is not an orphan
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("later"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("later"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)

	// a pending one neither
	orphan(t, e, "acme", "ran")
	require.NoError(t, e.inspector.RunTask(e.queue, "ran"))
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("ran"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	require.Equal(t, int64(1), e.waiting(t, "acme"))

	// a retry that may go straight (an empty line, a fleet with room)
	// gives back the slot it took and joins the parked job to its line
	orphan(t, e, "solo", "lost2")
	e.fleet(t, 10)
	q, err := queue.New(e.client, &queue.Config{Limiter: e.lim, AsynqRedis: e.asynq}) // its gauge sees the fleet
	require.NoError(t, err)
	defer q.Close()
	info, err = q.Enqueue(ctx, "solo", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("lost2"))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, info.State)
	ws, err = waitroom.Of(e.lim).WaitingIDs(ctx, "solo", 0)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{{ID: "lost2", Queue: e.queue, Cost: 1}}, ws)
	st, err := e.lim.Stats(ctx, "solo")
	require.NoError(t, err)
	require.Zero(t, st.Reservations, "the straight arrival's slot was given back")
}

// TestEnqueueParksInOneCall: a job its rules have wait, in a fleet with
// room, arrives (its intent recorded) and is parked and put in its line in
// one call that takes the intent back; the jobs after it, whose tenant's
// line holds jobs, are parked at once without arriving; the line keeps
// their order and no intent is left. With the fleet full every job is
// parked at once.
func TestEnqueueParksInOneCall(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	if redistest.ClusterMode() {
		t.Skip("on a Cluster jobs wait in three steps (arrive, park, join)")
	}
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/s burst=1")
	e.fleet(t, 10)
	q, err := queue.New(e.client, &queue.Config{Limiter: e.lim}) // asynq's keys on sluice's client: one call
	require.NoError(t, err)
	defer q.Close()
	ids := []string{"a", "b", "c", "d"}
	for _, id := range ids {
		info, err := q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID(id))
		require.NoError(t, err)
		want := asynq.TaskStateScheduled
		if id == "a" {
			want = asynq.TaskStatePending
		}
		require.Equal(t, want, info.State, id)
		got, err := e.inspector.GetTaskInfo(e.queue, id)
		require.NoError(t, err)
		require.Equal(t, want, got.State, id)
		require.Equal(t, info.NextProcessAt.Unix(), got.NextProcessAt.Unix(), id)
	}
	ws, err := waitroom.Of(e.lim).WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{{ID: "b", Queue: e.queue, Cost: 1}, {ID: "c", Queue: e.queue, Cost: 1}, {ID: "d", Queue: e.queue, Cost: 1}}, ws)
	n, err := e.client.Exists(ctx, e.prefix+":{t:acme}:j").Result()
	require.NoError(t, err)
	require.Zero(t, n, "no intent is left")
	ls, err := waitroom.Of(e.lim).Lines(ctx, e.queue)
	require.NoError(t, err)
	require.Len(t, ls, 1, "the tenant is due in the room's index")

	// a full line refuses the next job and keeps nothing of it
	e.policy(t, "acme", "rate=1/s burst=1 backlog=3")
	_, err = q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("e"))
	require.ErrorIs(t, err, throttle.ErrBacklogFull)
	_, err = e.inspector.GetTaskInfo(e.queue, "e")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
	require.Equal(t, int64(3), e.waiting(t, "acme"))
}
