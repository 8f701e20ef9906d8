package asynqroom

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestGaugePinsAsynqLayout holds the gauge to the keys of asynq's it reads
// besides the pending list: a real asynq server's running task is in
// activeKey, and every task it ended counts in processedKey.
func TestGaugePinsAsynqLayout(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t)
	queue := "gauge-" + redistest.Prefix(t)
	release := make(chan struct{})
	mux := asynq.NewServeMux()
	mux.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
		if string(task.Payload()) == "hold" {
			<-release
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(client, asynq.Config{
		Queues: map[string]int{queue: 1}, Concurrency: 2,
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	ac := asynq.NewClientFromRedisClient(client)
	for _, p := range []string{"a", "b", "hold"} {
		_, err := ac.Enqueue(asynq.NewTask("job", []byte(p)), asynq.Queue(queue))
		require.NoError(t, err)
	}
	waitFor(t, "the two quick tasks to end and the third to run", func() bool {
		n, _ := client.Get(ctx, processedKey(queue)).Int64()
		a, _ := client.LLen(ctx, activeKey(queue)).Result()
		return n == 2 && a == 1
	})
	close(release)
	waitFor(t, "the third task to end", func() bool {
		n, _ := client.Get(ctx, processedKey(queue)).Int64()
		a, _ := client.LLen(ctx, activeKey(queue)).Result()
		return n == 3 && a == 0
	})
}

// TestPendingTargetFollowsTheFleetsPace: a gauge keeps a pending list at
// the fleet's idle slots until it knows how fast the fleet takes jobs, and
// then at what the fleet takes in PendingWait (pendingFloor at the least,
// the capacity at the most), whether the jobs end or keep running.
func TestPendingTargetFollowsTheFleetsPace(t *testing.T) {
	g := NewGauge(redistest.Client(t))
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	require.Equal(t, 600, g.pendingTarget("q", 600, 0, 1000, at(0)), "idle and pace unknown: every idle slot")
	require.Equal(t, 590, g.pendingTarget("q", 600, 10, 1000, at(50*time.Millisecond)), "pace unknown yet")
	// 100 ms later the fleet ended 400 jobs and runs 400: it took 790 in
	// 100 ms, 7,900 a second, so 40 in 5 ms
	require.Equal(t, 40, g.pendingTarget("q", 600, 400, 1400, at(100*time.Millisecond)))
	require.Equal(t, 40, g.pendingTarget("q", 600, 600, 1410, at(150*time.Millisecond)), "the pace holds until measured again")
	// slow: 10 jobs taken in the next 100 ms (15 more ended, 5 fewer
	// run); the floor
	require.Equal(t, pendingFloor, g.pendingTarget("q", 600, 395, 1415, at(200*time.Millisecond)))
	// a fleet smaller than the floor is never given more than it has
	require.Equal(t, 3, g.pendingTarget("small", 3, 0, 0, at(0)))
	require.Equal(t, 3, g.pendingTarget("small", 3, 3, 100, at(time.Second)))
	// a fleet that takes nothing again (its jobs all ended, none came)
	// is given its idle slots
	require.Equal(t, 600, g.pendingTarget("q", 600, 0, 1810, at(300*time.Millisecond)), "took none: the 395 it ran ended")
}
