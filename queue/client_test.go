package queue_test

import (
	"context"
	"errors"
	"fmt"
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
	task := asynq.NewTaskWithHeaders("email", []byte(`{"to":"a@example.com"}`), map[string]string{
		"trace":                "abc",
		taskspec.IDHeader:      "stale",
		taskspec.BacklogHeader: "1",
	})
	info, err := e.q.Enqueue(ctx, "acme", task, asynq.Queue(e.queue), asynq.MaxRetry(2), queue.Cost(3),
		asynq.Timeout(time.Minute), asynq.Retention(time.Hour))
	require.NoError(t, err)
	require.Equal(t, e.queue, info.Queue)
	require.Equal(t, 2, info.MaxRetry)
	require.Equal(t, time.Minute, info.Timeout)
	require.Equal(t, time.Hour, info.Retention)
	require.Equal(t, asynq.TaskStatePending, info.State)
	require.Equal(t, map[string]string{"trace": "abc", taskspec.TenantHeader: "acme", taskspec.CostHeader: "3"}, info.Headers)

	stored, err := e.inspector.GetTaskInfo(e.queue, info.ID)
	require.NoError(t, err)
	require.Equal(t, info.Headers, stored.Headers)

	// The caller's task is not changed.
	require.Equal(t, "stale", task.Headers()[taskspec.IDHeader])

	// A cost of 1 is the default and needs no header; a given TaskID is kept.
	info, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.TaskID("job-1"))
	require.NoError(t, err)
	require.Equal(t, "job-1", info.ID)
	require.Equal(t, map[string]string{taskspec.TenantHeader: "acme"}, info.Headers)
}

func TestEnqueueRefusesBadInputBeforeWriting(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "capped", "backlog=10 shape=true rate=10/s")
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
		{"options on the task", "capped", asynq.NewTask("email", nil, asynq.MaxRetry(0)), nil, "task", "pass them to Enqueue"},
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
	require.Zero(t, e.backlog(t, "capped"))
	st, err := e.lim.Stats(ctx, "capped")
	require.NoError(t, err)
	require.Zero(t, st.Reservations)
}

func TestEnqueueRefusesACostThePolicyCanNeverAdmit(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=10/s burst=5 backlog=10")
	_, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask("sync", nil), asynq.Queue(e.queue), queue.Cost(6))
	var ce *throttle.CostError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(5), ce.Max)
	require.Empty(t, e.asynqKeys(t))
	require.Zero(t, e.backlog(t, "acme"))
}

func TestBacklogCap(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "backlog=3")
	var ids []string
	for i := 0; i < 3; i++ {
		info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
		require.Equal(t, "1", info.Headers[taskspec.BacklogHeader])
		ids = append(ids, info.ID)
	}
	_, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
	require.ErrorIs(t, err, throttle.ErrBacklogFull)
	var be *throttle.BacklogError
	require.ErrorAs(t, err, &be)
	require.Equal(t, &throttle.BacklogError{Tenant: "acme", Backlog: 3, Limit: 3}, be)
	info, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(t, err)
	require.Equal(t, 3, info.Pending)

	// A job that finishes for good makes room.
	require.NoError(t, e.lim.Finish(ctx, "acme", ids[0], 0))
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
	require.NoError(t, err)

	// Tenants without a cap are not counted.
	_, err = e.q.Enqueue(ctx, "other", asynq.NewTask("email", nil), asynq.Queue(e.queue))
	require.NoError(t, err)
	require.Zero(t, e.backlog(t, "other"))
}

func TestBacklogUndoneWhenEnqueueFails(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "backlog=5")
	_, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", []byte("1")), asynq.Queue(e.queue), asynq.TaskID("fixed"))
	require.NoError(t, err)

	// The id belongs to a queued job, which keeps its count.
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("email", []byte("2")), asynq.Queue(e.queue), asynq.TaskID("fixed"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	require.Contains(t, err.Error(), `tenant "acme"`)
	require.Equal(t, int64(1), e.backlog(t, "acme"))

	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("report", []byte("x")), asynq.Queue(e.queue), asynq.Unique(time.Minute))
	require.NoError(t, err)
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("report", []byte("x")), asynq.Queue(e.queue), asynq.Unique(time.Minute))
	require.ErrorIs(t, err, asynq.ErrDuplicateTask)
	require.Equal(t, int64(2), e.backlog(t, "acme"))
}

func TestShapingSchedulesEachJobForItsSlot(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s shape=true")
	const n = 30
	before := time.Now()
	var infos []*asynq.TaskInfo
	for i := 0; i < n; i++ {
		info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
		infos = append(infos, info)
	}
	require.Equal(t, asynq.TaskStatePending, infos[0].State, "the first slot is due at once")
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(n), st.Reservations)
	// Job i's slot is about i/10 s after the first; it is due in asynq in
	// the whole second holding slot-lead.
	for i, info := range infos[1:] {
		slot := before.Add(time.Duration(i+1) * 100 * time.Millisecond)
		if info.State == asynq.TaskStatePending {
			require.Less(t, time.Duration(i+1)*100*time.Millisecond, taskspec.LeadDefault+time.Second+50*time.Millisecond, "job %d", i+1)
			continue
		}
		require.Equal(t, asynq.TaskStateScheduled, info.State)
		due := info.NextProcessAt.Truncate(time.Second)
		require.WithinRange(t, due, slot.Add(-taskspec.LeadDefault-time.Second-50*time.Millisecond), slot.Add(-taskspec.LeadDefault+50*time.Millisecond), "job %d", i+1)
	}
	q, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(t, err)
	require.Less(t, q.Pending, n/2, "most of the burst waits in the schedule")
}

func TestShapingBeyondTheHorizonSchedulesAtTheHorizon(t *testing.T) {
	t.Parallel()
	e := setup(t, &throttle.Config{Horizon: 2 * time.Second})
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/s shape=true")
	var infos []*asynq.TaskInfo
	for i := 0; i < 4; i++ {
		info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
		infos = append(infos, info)
	}
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(3), st.Reservations, "slots at 0, 1 and 2 s; the fourth is beyond the horizon")
	require.Equal(t, asynq.TaskStateScheduled, infos[3].State)
	require.WithinDuration(t, time.Now().Add(2*time.Second), infos[3].NextProcessAt, time.Second)
}

func TestShapingLeavesDelayedJobsToTheWorker(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/s shape=true")
	info, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(e.queue), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), info.NextProcessAt, 2*time.Second)
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Reservations)
}

func TestEnqueueBatchReportsEveryJob(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "capped", "backlog=3")
	e.policy(t, "shaped", "rate=100/s shape=true")
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
		add("shaped")
	}
	res := e.q.EnqueueBatch(ctx, jobs)
	require.Len(t, res, len(jobs))
	for i := 0; i < 3; i++ {
		require.NoError(t, res[i].Err, "job %d", i)
		require.Equal(t, "1", res[i].Info.Headers[taskspec.BacklogHeader])
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
	for i := 9; i < len(jobs); i++ {
		require.NoError(t, res[i].Err, "job %d", i)
		require.Equal(t, "shaped", res[i].Info.Headers[taskspec.TenantHeader])
	}
	require.Equal(t, int64(3), e.backlog(t, "capped"))
	st, err := e.lim.Stats(ctx, "shaped")
	require.NoError(t, err)
	require.Equal(t, int64(20), st.Reservations)
	q, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(t, err)
	require.Equal(t, 3+1+20, q.Size)
}

func TestEnqueueBatchAcrossManyTenants(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "*", "backlog=2 rate=50/s shape=true")
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
		{Lead: -time.Second},
		{BatchConcurrency: -1},
	} {
		_, err := queue.New(client, cfg)
		require.Error(t, err, "%+v", cfg)
	}
	_, err = queue.New(nil, nil)
	require.Error(t, err)
}
