package asynqroom

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestLayoutProbePassesOnV026 runs the start-up check against the asynq
// this module is built with: the probe task is handed over and seen
// pending by asynq's Inspector, and nothing of it is left behind.
func TestLayoutProbePassesOnV026(t *testing.T) {
	ctx := context.Background()
	server := redistest.NewServer(t, nil)
	client := server.Client(t)
	require.NoError(t, NewLayout(client).Check(ctx))
	keys, err := client.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "the probe leaves no key behind (its task, its queue in asynq:queues)")
	queues, err := asynq.NewInspectorFromRedisClient(client).Queues()
	require.NoError(t, err)
	require.Empty(t, queues)
}

// TestLayoutRefusesAnUnknownVersion: an asynq version sluice does not
// know is refused without a probe, and the verdict is kept.
func TestLayoutRefusesAnUnknownVersion(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	SimulateVersion(client, "v0.27.0")
	defer SimulateVersion(client, "")
	l := NewLayout(client)
	err := l.Check(ctx)
	var le *LayoutError
	require.ErrorAs(t, err, &le)
	require.Equal(t, "v0.27.0", le.Version)
	require.Contains(t, err.Error(), "asynq v0.27.0: not a version sluice knows")
	checked, verdict := l.Checked()
	require.True(t, checked)
	require.Equal(t, err, verdict)
}

// TestLayoutRetriesWhenRedisIsDown: no verdict without Redis.
func TestLayoutRetriesWhenRedisIsDown(t *testing.T) {
	ctx := context.Background()
	server := redistest.NewServer(t, nil)
	client := server.Client(t)
	server.Kill()
	l := NewLayout(client)
	err := l.Check(ctx)
	require.Error(t, err)
	var le *LayoutError
	require.False(t, errors.As(err, &le))
	checked, _ := l.Checked()
	require.False(t, checked)
	require.NoError(t, server.Restart())
	require.NoError(t, l.Check(ctx))
}

// TestRecoverPinsAsynqLayout holds recover.lua to asynq v0.26's layout of
// active tasks (ActiveKey, LeaseKey, a task's state): a task a real asynq
// server runs is given back to pending, as asynq's Inspector sees it, and
// run again; a task whose lease changed, one not active, and one given
// back RecoverMax times are left alone.
func TestRecoverPinsAsynqLayout(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "recover-" + redistest.Prefix(t)
	ac := asynq.NewClientFromRedisClient(client)
	insp := asynq.NewInspectorFromRedisClient(client)

	var mu sync.Mutex
	ran := map[string]int{}
	release := make(chan struct{})
	mux := asynq.NewServeMux()
	mux.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		ran[id]++
		first := ran[id] == 1
		mu.Unlock()
		if first {
			select { // the first run hangs, as on a worker that died
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(client, asynq.Config{
		Queues: map[string]int{queue: 1}, Concurrency: 4, TaskCheckInterval: 10 * time.Millisecond,
		LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second,
	})
	require.NoError(t, srv.Start(mux))
	defer srv.Shutdown()
	defer close(release)
	runs := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return ran[id]
	}
	for _, id := range []string{"dead", "alive", "often"} {
		_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(queue), asynq.TaskID(id), asynq.MaxRetry(0))
		require.NoError(t, err)
		waitFor(t, id+" running", func() bool { return runs(id) == 1 })
	}
	// asynq's layout of an active task, as recover.lua reads it
	for _, id := range []string{"dead", "alive", "often"} {
		state, err := client.HGet(ctx, TaskKey(queue, id), "state").Result()
		require.NoError(t, err)
		require.Equal(t, "active", state)
		_, err = client.LPos(ctx, ActiveKey(queue), id, redis.LPosArgs{}).Result()
		require.NoError(t, err, "%s in %s", id, ActiveKey(queue))
	}
	leases, err := Leases(ctx, client, queue)
	require.NoError(t, err)
	require.Len(t, leases, 3)
	require.NoError(t, client.HSet(ctx, TaskKey(queue, "often"), "sluice_recovered", RecoverMax).Err())

	// a paused queue keeps the given-back task pending, for the Inspector
	require.NoError(t, insp.PauseQueue(queue))
	res, err := Recover(ctx, client, queue, []Orphan{{ID: "dead"}, {ID: "alive", Lease: "1"}, {ID: "often"}, {ID: "missing"}})
	require.NoError(t, err)
	require.Equal(t, []Recovered{GivenBack, Extended, TooOften, NotActive}, res)
	info, err := insp.GetTaskInfo(queue, "dead")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
	require.Zero(t, info.Retried, "a give-back is not a retry")
	qi, err := insp.GetQueueInfo(queue)
	require.NoError(t, err)
	require.Equal(t, 1, qi.Pending)
	require.Equal(t, 2, qi.Active)
	// a task given back is not active any more: a second give-back does nothing
	res, err = Recover(ctx, client, queue, []Orphan{{ID: "dead"}})
	require.NoError(t, err)
	require.Equal(t, []Recovered{NotActive}, res)

	require.NoError(t, insp.UnpauseQueue(queue))
	waitFor(t, "the given-back task to run again", func() bool { return runs("dead") == 2 })
	waitFor(t, "it to leave asynq", func() bool {
		_, err := insp.GetTaskInfo(queue, "dead")
		return errors.Is(err, asynq.ErrTaskNotFound)
	})
}
