package queue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// The enqueue benchmark's round: benchJobs jobs over benchTenants tenants,
// enqueued by benchProducers goroutines (the end-to-end fleet round's
// shape).
const (
	benchJobs      = 5_000
	benchTenants   = 50
	benchProducers = 16
)

// BenchmarkEnqueue compares, in one run, the producer's side alone:
// asynq's client and sluice's queue.Client enqueueing the same jobs on a
// private Redis with no worker (so every sluice job is parked in its
// tenant's line, in one call: the path of a job that arrives while the
// fleet is full). sluice's tenants have a rate and a concurrency rule that
// never bind. Each iteration is a pair of rounds, asynq's client then
// sluice's, each into a queue of its own. It reports the median jobs/s of
// each, their ratio, and the CPU time per job that Redis and this process
// (the producer) spent. Run it with:
//
//	go test -run '^$' -bench Enqueue -benchtime 5x ./queue/
func BenchmarkEnqueue(b *testing.B) {
	server := redistest.NewServer(b, nil)
	client := server.Client(b)
	prefix := redistest.Prefix(b)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	require.NoError(b, err)
	defer lim.Close()
	policy, err := throttle.ParsePolicy("rate=1000000/s burst=100000 concurrency=100000")
	require.NoError(b, err)
	for i := range benchTenants {
		require.NoError(b, lim.Policies().Set(context.Background(), benchTenant(i), policy))
	}
	q, err := queue.New(client, &queue.Config{Limiter: lim})
	require.NoError(b, err)
	defer q.Close()
	ac := asynq.NewClientFromRedisClient(client)
	inspector := asynq.NewInspectorFromRedisClient(client)

	waiting := func() int64 {
		var n int64
		for t := range benchTenants {
			st, err := lim.Stats(context.Background(), benchTenant(t))
			require.NoError(b, err)
			n += st.Waiting
		}
		return n
	}
	var plain, sluice [3][]float64 // jobs/s, Redis CPU µs/job, producer CPU µs/job
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		qname := fmt.Sprintf("plain-%d-%d", b.N, i)
		for k, v := range enqueueRound(b, client, func(ctx context.Context, t *asynq.Task) error {
			_, err := ac.EnqueueContext(ctx, t, asynq.Queue(qname))
			return err
		}) {
			plain[k] = append(plain[k], v)
		}
		info, err := inspector.GetQueueInfo(qname)
		require.NoError(b, err)
		require.Equal(b, benchJobs, info.Pending, "asynq's client: every job pending")

		before := waiting()
		qname = fmt.Sprintf("sluice-%d-%d", b.N, i)
		for k, v := range enqueueRound(b, client, func(ctx context.Context, t *asynq.Task) error {
			_, err := q.Enqueue(ctx, t.Headers()[taskspec.TenantHeader], t, asynq.Queue(qname))
			return err
		}) {
			sluice[k] = append(sluice[k], v)
		}
		info, err = inspector.GetQueueInfo(qname)
		require.NoError(b, err)
		require.Equal(b, benchJobs, info.Pending+info.Scheduled, "queue.Client: every job in asynq")
		require.EqualValues(b, info.Scheduled, waiting()-before, "every parked job is in its tenant's line")
	}
	redistest.ReportSideBySide(b, plain, sluice, "producer")
}

func benchTenant(i int) string { return fmt.Sprintf("t%02d", i) }

// enqueueRound times benchProducers goroutines enqueueing benchJobs jobs
// with enqueue, the i-th job's tenant benchTenant(i % benchTenants). It
// returns the jobs/s and the CPU time per job of Redis and of this
// process.
func enqueueRound(b *testing.B, client *redis.Client, enqueue func(context.Context, *asynq.Task) error) [3]float64 {
	ctx := context.Background()
	redis0, proc0 := redistest.CPU(b, client), redistest.ProcessCPU()
	start := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	var failed atomic.Value
	for range benchProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= benchJobs {
					return
				}
				t := asynq.NewTaskWithHeaders("noop", nil, map[string]string{taskspec.TenantHeader: benchTenant(int(i) % benchTenants)})
				if err := enqueue(ctx, t); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return [3]float64{
		benchJobs / elapsed.Seconds(),
		(redistest.CPU(b, client) - redis0) / benchJobs * 1e6,
		(redistest.ProcessCPU() - proc0) / benchJobs * 1e6,
	}
}
