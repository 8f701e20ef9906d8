package asynqroom

import (
	"context"
	"errors"
	"github.com/sluicehq/sluice/internal/waitroom"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/taskspec"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestHandoverPinsAsynqLayout holds the waiting room's hand-over to the
// layout of asynq's keys it writes (PendingKey, TaskKey, the schedule and
// retry sets, a task's state and group fields): tasks asynq's own client
// and server put in each state are handed over, and asynq's Inspector and
// a real asynq server see the result. An asynq upgrade that moves any of
// it fails here.
func TestHandoverPinsAsynqLayout(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "pin-" + redistest.Prefix(t)
	ac := asynq.NewClientFromRedisClient(client)
	insp := asynq.NewInspectorFromRedisClient(client)

	enqueue := func(id string, opts ...asynq.Option) {
		t.Helper()
		task := asynq.NewTaskWithHeaders("job", nil, map[string]string{"trace": id, taskspec.DecidedHeader: "stale"})
		_, err := ac.Enqueue(task, append(opts, asynq.Queue(queue), asynq.TaskID(id), asynq.MaxRetry(3))...)
		require.NoError(t, err)
	}
	state := func(id string) string {
		t.Helper()
		s, err := client.HGet(ctx, TaskKey(queue, id), "state").Result()
		require.NoError(t, err, "task %s's hash", id)
		return s
	}

	// a real asynq server: "retry" fails once (into the retry set, an hour
	// away), everything else succeeds
	log := retryServer(t, client, queue)
	runs := log.runs

	enqueue("retry")
	waitFor(t, "the retry task to fail once", func() bool {
		info, err := insp.GetTaskInfo(queue, "retry")
		return err == nil && info.State == asynq.TaskStateRetry
	})
	require.Equal(t, "retry", state("retry"))
	score, err := client.ZScore(ctx, queuePrefix(queue)+"retry", "retry").Result()
	require.NoError(t, err, "a retrying task is in asynq:{QUEUE}:retry")
	require.Greater(t, score, float64(time.Now().Add(30*time.Minute).Unix()))

	enqueue("parked", asynq.ProcessIn(time.Hour))
	require.Equal(t, "scheduled", state("parked"))
	_, err = client.ZScore(ctx, queuePrefix(queue)+"scheduled", "parked").Result()
	require.NoError(t, err, "a parked task is in asynq:{QUEUE}:scheduled")

	enqueue("archived", asynq.ProcessIn(time.Hour))
	require.NoError(t, insp.ArchiveTask(queue, "archived"))
	require.Equal(t, "archived", state("archived"))

	enqueue("grouped", asynq.Group("g"))
	require.Equal(t, "aggregating", state("grouped"))
	group, err := client.HGet(ctx, TaskKey(queue, "grouped"), "group").Result()
	require.NoError(t, err)
	require.Equal(t, "g", group)

	// each handed-over task gets its decision as a header (a long one for
	// "parked", whose length takes two bytes of protobuf's varint), "retry"
	// none
	decided := map[string]string{"parked": strings.Repeat("d", 200), "retry": ""}
	promoted := func(ids ...string) []waitroom.Promoted {
		out := make([]waitroom.Promoted, len(ids))
		for i, id := range ids {
			out[i] = waitroom.Promoted{Tenant: "acme", Queue: queue, ID: id, Ticket: decided[id]}
		}
		return out
	}
	res := Handover(client, false)(ctx, promoted("parked", "retry", "archived", "grouped", "missing"))
	require.Equal(t, []waitroom.HandoverResult{waitroom.Handed, waitroom.Handed, waitroom.Gone, waitroom.Gone, waitroom.Gone}, res)

	// asynq runs what was handed over, once each, and leaves the rest
	waitFor(t, "the handed-over tasks to run", func() bool { return runs("parked") == 1 && runs("retry") == 2 })
	for _, id := range []string{"parked", "retry"} {
		waitFor(t, id+" to leave asynq", func() bool {
			_, err := insp.GetTaskInfo(queue, id)
			return errors.Is(err, asynq.ErrTaskNotFound)
		})
	}
	require.Equal(t, map[string]string{"trace": "parked", taskspec.DecidedHeader: decided["parked"]}, log.headersOf("parked"),
		"the decision appended to the task's message replaces the one it had; its other headers are kept")
	require.Equal(t, map[string]string{"trace": "retry", taskspec.DecidedHeader: "stale"}, log.headersOf("retry"), "no decision: the task is left as it was")
	info, err := insp.GetTaskInfo(queue, "archived")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, info.State)
	info, err = insp.GetTaskInfo(queue, "grouped")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateAggregating, info.State)

	// a task pending already counts as handed over, and PendingKey is the
	// list asynq's Inspector counts
	log.srv.Stop()
	enqueue("pending")
	require.Equal(t, "pending", state("pending"))
	n, err := client.LLen(ctx, PendingKey(queue)).Result()
	require.NoError(t, err)
	qi, err := insp.GetQueueInfo(queue)
	require.NoError(t, err)
	require.Equal(t, int64(qi.Pending), n)
	require.Equal(t, int64(1), n)
	res = Handover(client, false)(ctx, promoted("pending"))
	require.Equal(t, []waitroom.HandoverResult{waitroom.Handed}, res)
	n, err = client.LLen(ctx, PendingKey(queue)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "not pushed twice")
	require.Equal(t, 1, runs("parked"))
}

// TestReparkPushesOnlyParkedTasksInLines: of the tasks in a queue's
// schedule, Repark pushes further out only those parked for a waiting job
// (taskspec.ParkedHeader) of a tenant with a line, coming due within its
// bound; a task a producer scheduled itself, one parked for a tenant
// without a line, and one due later keep their times. asynq's Inspector
// shows the new times (the layout is v0.26's).
func TestReparkPushesOnlyParkedTasksInLines(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "repark-" + redistest.Prefix(t)
	ac := asynq.NewClientFromRedisClient(client)
	insp := asynq.NewInspectorFromRedisClient(client)
	soon := time.Now().Add(30 * time.Second)
	enqueue := func(id, tenant string, parked bool, at time.Time) {
		t.Helper()
		h := map[string]string{taskspec.TenantHeader: tenant, "trace": id}
		if parked {
			h[taskspec.ParkedHeader] = "1"
		}
		_, err := ac.Enqueue(asynq.NewTaskWithHeaders("job", []byte("payload "+id), h), asynq.Queue(queue), asynq.TaskID(id), asynq.ProcessAt(at))
		require.NoError(t, err)
	}
	enqueue("parked", "acme", true, soon)
	enqueue("parked-2", "acme", true, soon)
	enqueue("own", "acme", false, soon)
	enqueue("no-line", "globex", true, soon)
	enqueue("later", "acme", true, time.Now().Add(time.Hour))
	inLine := func(tenant string) bool { return tenant == "acme" }
	n, err := Repark(client)(ctx, queue, time.Minute, 2*time.Hour, inLine)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	at := func(id string) time.Time {
		info, err := insp.GetTaskInfo(queue, id)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateScheduled, info.State, id)
		return info.NextProcessAt
	}
	for _, id := range []string{"parked", "parked-2"} {
		require.WithinDuration(t, time.Now().Add(2*time.Hour), at(id), 5*time.Second, id)
	}
	for _, id := range []string{"own", "no-line"} {
		require.WithinDuration(t, soon, at(id), time.Second, id)
	}
	require.WithinDuration(t, time.Now().Add(time.Hour), at("later"), 5*time.Second)
	// nothing left to push
	n, err = Repark(client)(ctx, queue, time.Minute, 2*time.Hour, inLine)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestHandoverConfirmsInTheHandingSet: where the room's keys and asynq's
// share a server (confirm), a job asynq has leaves the room's handing set
// in the hand-over's own call and is answered Confirmed; a job asynq does
// not have, or one without a handing entry, keeps it, and without confirm
// nothing of the room's is touched.
func TestHandoverConfirmsInTheHandingSet(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	pfx := redistest.Prefix(t)
	queue := "confirm-" + pfx
	handing := pfx + ":handing"
	ac := asynq.NewClientFromRedisClient(client)
	for _, id := range []string{"a", "b", "c"} {
		_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID(id), asynq.ProcessIn(time.Hour))
		require.NoError(t, err)
	}
	_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID("pending"))
	require.NoError(t, err)
	for _, e := range []string{"ea", "eb", "ec", "ep", "em"} {
		require.NoError(t, client.ZAdd(ctx, handing, redis.Z{Score: 1, Member: e}).Err())
	}
	job := func(id, entry string, withSet bool) waitroom.Promoted {
		p := waitroom.Promoted{Tenant: "acme", Queue: queue, ID: id, Entry: entry}
		if withSet {
			p.Handing = handing
		}
		return p
	}
	res := Handover(client, true)(ctx, []waitroom.Promoted{
		job("a", "ea", true), job("b", "eb", false), job("pending", "ep", true), job("missing", "em", true),
	})
	require.Equal(t, []waitroom.HandoverResult{waitroom.Confirmed, waitroom.Handed, waitroom.Confirmed, waitroom.Gone}, res)
	left, err := client.ZRange(ctx, handing, 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"eb", "ec", "em"}, left, "the confirmed entries left the handing set, the others stayed")

	res = Handover(client, false)(ctx, []waitroom.Promoted{job("c", "ec", true)})
	require.Equal(t, []waitroom.HandoverResult{waitroom.Handed}, res)
	left, err = client.ZRange(ctx, handing, 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"eb", "ec", "em"}, left, "without confirm the room confirms")
	n, err := client.LLen(ctx, PendingKey(queue)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(4), n, "a, b, c and pending are pending, once each")

	// jobs a turn handed over, or found gone, in its own run: answered
	// with no call
	res = Handover(client, true)(ctx, []waitroom.Promoted{
		{Tenant: "acme", Queue: queue, ID: "x", InRun: true}, {Tenant: "acme", Queue: queue, InRun: true, Gone: true},
	})
	require.Equal(t, []waitroom.HandoverResult{waitroom.Confirmed, waitroom.Gone}, res)
	n, err = client.LLen(ctx, PendingKey(queue)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(4), n, "nothing moved")
}
