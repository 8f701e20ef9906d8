package asynqroom

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestForwardPinsAsynqLayout holds forward.lua to asynq's own forwarder:
// tasks asynq's client scheduled (one of them with a group), and a task a
// real asynq server failed into its retry set, all due, move where asynq's
// forwarder moves them, and a real asynq server whose own forwarder polls
// once an hour runs them; a task not yet due stays where it is.
func TestForwardPinsAsynqLayout(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "fwd-" + redistest.Prefix(t)
	ac := asynq.NewClientFromRedisClient(client)
	insp := asynq.NewInspectorFromRedisClient(client)

	runs := retryServer(t, client, queue).runs
	state := func(id string) asynq.TaskState {
		t.Helper()
		info, err := insp.GetTaskInfo(queue, id)
		require.NoError(t, err, id)
		return info.State
	}

	// the retried task: run once, failed into the retry set an hour away
	_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID("retry"), asynq.MaxRetry(3))
	require.NoError(t, err)
	waitFor(t, "the first try", func() bool { return runs("retry") == 1 })
	waitFor(t, "the retry set", func() bool { return state("retry") == asynq.TaskStateRetry })
	for i, id := range []string{"s1", "s2", "s3"} {
		_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID(id), asynq.ProcessIn(time.Duration(i+1)*time.Minute))
		require.NoError(t, err)
	}
	_, err = ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID("grouped"), asynq.Group("g1"), asynq.ProcessIn(time.Minute))
	require.NoError(t, err)
	_, err = ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID("later"), asynq.ProcessIn(3*time.Hour))
	require.NoError(t, err)

	// nothing is due now
	n, err := Forward(ctx, client, queue, time.Now())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, asynq.TaskStateScheduled, state("s1"))

	// two hours on, all but "later" are: moved as asynq moves them
	n, err = Forward(ctx, client, queue, time.Now().Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, asynq.TaskStateScheduled, state("later"))
	// a task asynq's client scheduled with a group keeps its group in its
	// message only: asynq's forwarder makes it pending, and so does Forward
	for _, id := range []string{"s1", "s2", "s3", "retry", "grouped"} {
		waitFor(t, id+" run", func() bool { return runs(id) >= 1 && (id != "retry" || runs(id) == 2) })
	}
}

// TestForwardMovesInChunks: more due tasks than one call moves all go.
func TestForwardMovesInChunks(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "fwdn-" + redistest.Prefix(t)
	ac := asynq.NewClientFromRedisClient(client)
	insp := asynq.NewInspectorFromRedisClient(client)
	for i := 0; i < 2*forwardChunk+7; i++ {
		_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.ProcessIn(time.Minute))
		require.NoError(t, err)
	}
	n, err := Forward(ctx, client, queue, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 2*forwardChunk+7, n)
	info, err := insp.GetQueueInfo(queue)
	require.NoError(t, err)
	require.Equal(t, 2*forwardChunk+7, info.Pending)
	require.Zero(t, info.Scheduled)
}
