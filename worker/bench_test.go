package worker_test

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
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// benchJobs is the number of no-op jobs each round processes.
const benchJobs = 20_000

// BenchmarkGate compares, in one run, one worker process of plain asynq with
// one of asynq behind sluice's gate (a rate and concurrency policy that never
// binds: every job is admitted, holds a concurrency slot and releases it).
// Each iteration is a pair of rounds, plain then gated, on a private Redis;
// each round drains benchJobs queued no-op jobs. It reports the median
// jobs/s of each, their ratio, and the CPU time per job that Redis and the
// worker process spent. Run it with:
//
//	go test -run '^$' -bench Gate -benchtime 5x ./worker/
func BenchmarkGate(b *testing.B) {
	server := redistest.NewServer(b, nil)
	client := server.Client(b)
	prefix := redistest.Prefix(b)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	require.NoError(b, err)
	defer lim.Close()
	policy, err := throttle.ParsePolicy("rate=1000000/s burst=100000 concurrency=100000")
	require.NoError(b, err)
	require.NoError(b, lim.Policies().Set(context.Background(), "acme", policy))

	var plain, gated [3][]float64 // jobs/s, Redis CPU µs/job, worker CPU µs/job
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, v := range benchRound(b, client, nil, fmt.Sprintf("plain-%d", i)) {
			plain[k] = append(plain[k], v)
		}
		for k, v := range benchRound(b, client, lim, fmt.Sprintf("gated-%d", i)) {
			gated[k] = append(gated[k], v)
		}
	}
	redistest.ReportSideBySide(b, plain, gated, "worker")
}

// benchRound queues benchJobs jobs (untimed), then times one worker
// draining them: plain asynq when lim is nil, sluice's Server otherwise. It
// returns the jobs/s and the CPU time per job of Redis and of the worker.
func benchRound(b *testing.B, client *redis.Client, lim *throttle.Limiter, qname string) [3]float64 {
	b.StopTimer()
	fill(b, client, qname)
	redis0, proc0 := redistest.CPU(b, client), redistest.ProcessCPU()
	result := func(elapsed time.Duration) [3]float64 {
		return [3]float64{
			benchJobs / elapsed.Seconds(),
			(redistest.CPU(b, client) - redis0) / benchJobs * 1e6,
			(redistest.ProcessCPU() - proc0) / benchJobs * 1e6,
		}
	}
	var done atomic.Int64
	finished := make(chan struct{})
	handler := func(context.Context, *asynq.Task) error {
		if done.Add(1) == benchJobs {
			close(finished)
		}
		return nil
	}
	cfg := asynq.Config{
		Queues:                   map[string]int{qname: 1},
		Concurrency:              worker.ConcurrencyDefault,
		TaskCheckInterval:        worker.TaskCheckIntervalDefault,
		DelayedTaskCheckInterval: worker.DelayedTaskCheckIntervalDefault,
		LogLevel:                 asynq.FatalLevel,
	}
	b.StartTimer()
	start := time.Now()
	if lim == nil {
		mux := asynq.NewServeMux()
		mux.HandleFunc("noop", handler)
		srv := asynq.NewServerFromRedisClient(client, cfg)
		require.NoError(b, srv.Start(mux))
		<-finished
		elapsed := time.Since(start)
		b.StopTimer()
		r := result(elapsed)
		srv.Shutdown()
		return r
	}
	srv, err := worker.New(client, &worker.Config{Limiter: lim, Asynq: cfg, Gate: worker.GateConfig{Logger: quiet}})
	require.NoError(b, err)
	srv.HandleFunc("noop", handler)
	require.NoError(b, srv.Start())
	<-finished
	elapsed := time.Since(start)
	b.StopTimer()
	r := result(elapsed)
	srv.Shutdown()
	return r
}

// fill queues benchJobs no-op jobs of tenant acme with 16 producers.
func fill(b *testing.B, client *redis.Client, qname string) {
	ac := asynq.NewClientFromRedisClient(client)
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= benchJobs {
				_, err := ac.Enqueue(asynq.NewTaskWithHeaders("noop", nil, map[string]string{taskspec.TenantHeader: "acme"}), asynq.Queue(qname))
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
