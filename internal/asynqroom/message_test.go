package asynqroom

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lua"
	"github.com/sluicehq/sluice/taskspec"
)

// TestParkPinsAsynqLayout holds park.lua's write of a parked task (and
// Compose and Encode, which make its message) to what asynq v0.26's own
// client writes for a task scheduled for later: for each set of options
// the two tasks' hashes hold the same fields, their messages are the same
// bytes (one header at most: protobuf does not order a map's entries),
// asynq's Inspector reads the same task from both, Info is what asynq's
// client returned, and a real asynq server runs the parked task with its
// payload and headers. An asynq upgrade that changes any of it fails here.
func TestParkPinsAsynqLayout(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "park-" + redistest.Prefix(t)
	ac := asynq.NewClientFromRedisClient(client)
	insp := asynq.NewInspectorFromRedisClient(client)
	deadline := time.Now().Add(48 * time.Hour).Truncate(time.Second)

	cases := []struct {
		name    string
		payload []byte
		headers map[string]string
		opts    []asynq.Option
	}{
		{"defaults", nil, nil, nil},
		{"one header", []byte(`{"a":1}`), map[string]string{taskspec.TenantHeader: "acme"}, nil},
		{"headers and options", []byte{0, 1, 2, 255}, map[string]string{taskspec.TenantHeader: "acme", taskspec.ParkedHeader: "1", "trace": "x"},
			[]asynq.Option{asynq.MaxRetry(3), asynq.Timeout(90 * time.Second), asynq.Retention(time.Hour)}},
		{"deadline, no timeout", nil, map[string]string{taskspec.TenantHeader: "acme"}, []asynq.Option{asynq.Deadline(deadline), asynq.MaxRetry(0)}},
		{"the last option wins", []byte("p"), nil, []asynq.Option{asynq.MaxRetry(1), asynq.MaxRetry(7), asynq.Timeout(time.Second), asynq.Timeout(2500 * time.Millisecond)}},
		{"a long payload", make([]byte, 70_000), map[string]string{"h": string(make([]byte, 300))}, nil},
	}
	at := time.Now().Add(time.Hour)
	for i, c := range cases {
		pid, aid := fmt.Sprintf("p%d", i), fmt.Sprintf("a%d", i)
		task, ok := Compose(pid, queue, "job", c.payload, c.headers, c.opts)
		require.True(t, ok, c.name)
		park(t, client, task, time.Hour)
		want, err := ac.Enqueue(asynq.NewTaskWithHeaders("job", c.payload, c.headers), append(c.opts, asynq.Queue(queue), asynq.TaskID(aid), asynq.ProcessAt(at))...)
		require.NoError(t, err, c.name)

		// the task's hash: the same fields, the same message
		ph, err := client.HGetAll(ctx, TaskKey(queue, pid)).Result()
		require.NoError(t, err)
		ah, err := client.HGetAll(ctx, TaskKey(queue, aid)).Result()
		require.NoError(t, err)
		require.Equal(t, "scheduled", ph["state"], c.name)
		require.Equal(t, keysOf(ah), keysOf(ph), c.name)
		if len(c.headers) <= 1 {
			require.Equal(t, withID(t, ah["msg"], aid, pid), ph["msg"], "%s: the message's bytes", c.name)
		}

		// what asynq reads of it
		got, err := insp.GetTaskInfo(queue, pid)
		require.NoError(t, err)
		read, err := insp.GetTaskInfo(queue, aid)
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(time.Hour), got.NextProcessAt, 5*time.Second, c.name)
		got.ID, got.NextProcessAt, read.NextProcessAt = aid, time.Time{}, time.Time{}
		require.Equal(t, read, got, c.name)

		// Info is what asynq's client answered
		info := task.Info(at)
		info.ID = aid
		require.Equal(t, want, info, c.name)
	}

	// a scheduled task's place: the schedule, and the queue is known
	for i := range cases {
		_, err := client.ZScore(ctx, ScheduledKey(queue), fmt.Sprintf("p%d", i)).Result()
		require.NoError(t, err)
	}
	qs, err := insp.Queues()
	require.NoError(t, err)
	require.Contains(t, qs, queue)

	// Unique and Group tasks are asynq's client's to write
	for _, o := range []asynq.Option{asynq.Unique(time.Minute), asynq.Group("g")} {
		_, ok := Compose("x", queue, "job", nil, nil, []asynq.Option{o})
		require.False(t, ok, "%v", o)
	}

	// a real asynq server runs the parked tasks as its own
	log := retryServer(t, client, queue)
	for i, c := range cases[:3] {
		id := fmt.Sprintf("p%d", i)
		require.NoError(t, insp.RunTask(queue, id))
		waitFor(t, id+" to run", func() bool { return log.runs(id) == 1 })
		if c.headers != nil {
			require.Equal(t, c.headers, log.headersOf(id), c.name)
		}
		waitFor(t, id+" to be done", func() bool {
			info, err := insp.GetTaskInfo(queue, id)
			return errors.Is(err, asynq.ErrTaskNotFound) || err == nil && info.State == asynq.TaskStateCompleted
		})
	}
}

// park runs park.lua for task alone (a line of its own, under keys of the
// test's), parked for the least time given.
func park(t *testing.T, client redis.UniversalClient, task Task, least time.Duration) {
	t.Helper()
	base := redistest.Prefix(t) + ":{t:" + task.ID + "}:"
	e := EngineTaskOf(task)
	keys := []string{base + "l", base + "lh", base + "ll", base + "q", base + "s", e.TaskKey, e.ScheduleKey, e.QueuesKey, base + "j"}
	res, err := lua.Park.Run(context.Background(), client, keys, -1, 1, 0, task.Queue, "\x1f\x1f"+task.ID, task.ID, e.Msg,
		least.Microseconds(), 0, (30 * 24 * time.Hour).Microseconds(), task.Queue, 0).Slice()
	require.NoError(t, err)
	require.Len(t, res, 1, "one op, one reply")
	op, ok := res[0].([]any)
	require.True(t, ok, "the op's reply: %v", res[0])
	require.Equal(t, int64(0), op[0], "parked")
}

func keysOf(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}

// withID is msg, asynq's encoding of a task whose id is from, with the id
// to instead (the ids have one length).
func withID(t *testing.T, msg, from, to string) string {
	t.Helper()
	require.Len(t, to, len(from))
	field := "\x1a" + string(rune(len(from))) + from
	i := strings.Index(msg, field)
	require.GreaterOrEqual(t, i, 0, "the id field")
	return msg[:i] + "\x1a" + string(rune(len(to))) + to + msg[i+len(field):]
}
