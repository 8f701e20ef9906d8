package asynqroom

import (
	"context"
	"math"
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

// TestPendingTargetFollowsTheFleetsPace: a pending list may hold the
// fleet's capacity while the fleet takes jobs as fast as they come; once
// jobs queue in it while half the slots are idle, what the fleet takes in
// PendingWait (pendingFloor at the least; the pace measured from the jobs
// it ended and runs); found empty, twice as much, up to the capacity.
// Jobs that wait for busy slots do not cut it.
func TestPendingTargetFollowsTheFleetsPace(t *testing.T) {
	g := NewGauge(redistest.Client(t))
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	target := func(active, pending int, ended int64, d time.Duration) int {
		return g.pendingTarget("q", 600, active, pending, ended, at(d))
	}

	require.Equal(t, 600, target(0, 0, 1000, 0), "a fleet that keeps up: its capacity")
	require.Equal(t, 600, target(10, 5, 1000, 50*time.Millisecond))
	require.Equal(t, pendingFloor, target(14, 300, 1000, 60*time.Millisecond), "jobs queue, the pace unknown yet: the floor")
	// 100 ms after the first read the fleet ended 400 more jobs and runs
	// 14: it took 414 in 100 ms, 4,140 a second
	pace := int(math.Ceil(4140 * PendingWait.Seconds()))
	require.Zero(t, g.Drain("q"), "the pace not known yet")
	require.Equal(t, pace, target(14, 250, 1400, 100*time.Millisecond), "jobs queue: the pace's PendingWait")
	require.InDelta(t, float64(pace)/4140*float64(time.Second), float64(g.Drain("q")), float64(time.Microsecond),
		"the list it is to hold lasts pace/4,140 s")
	require.Equal(t, pace, target(14, 10, 1410, 150*time.Millisecond), "the list within it: kept")
	require.Equal(t, 2*pace, target(14, 0, 1420, 160*time.Millisecond), "found empty with idle slots: doubled")
	require.Equal(t, 4*pace, target(14, 0, 1430, 170*time.Millisecond))
	require.Equal(t, 4*pace, target(600, 300, 1440, 180*time.Millisecond), "jobs wait for busy slots: kept")
	require.Equal(t, 4*pace, target(301, 300, 1440, 185*time.Millisecond), "most slots busy: kept")
	require.Equal(t, pace, target(14, 4*pace+10, 1450, 190*time.Millisecond), "jobs queue for idle slots again: the pace")
	for i := range 6 {
		target(14, 0, 1460, time.Duration(191+i)*time.Millisecond)
	}
	require.Equal(t, 600, target(14, 0, 1460, 200*time.Millisecond), "never more than the capacity")

	// a fleet smaller than the floor is never given more than it has
	require.Equal(t, 3, g.pendingTarget("small", 3, 0, 0, 0, at(0)))
	require.Equal(t, 3, g.pendingTarget("small", 3, 3, 20, 100, at(time.Second)))
}
