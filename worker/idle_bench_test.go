package worker_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// idleWindow is how long each idle fleet is measured.
const idleWindow = 3 * time.Second

// BenchmarkIdle measures what idle workers cost Redis, side by side in one
// run: N idle sluice workers (worker.Server, each in its own goroutine,
// with its pump, its registration in the fleet's capacity and its policy
// watcher) against N stock asynq servers with the same TaskCheckInterval,
// for N = 1, 8 and 32 and each interval considered (SLUICE_IDLE_INTERVALS,
// a comma-separated list of durations; 10ms,100ms,1s by default). It reports
// Redis commands per second and Redis CPU per idle worker, and their ratio.
// BenchmarkWake measures the other side of the interval: how long a job
// takes from its enqueue to its handler on an idle fleet. Run them with:
//
//	go test -run '^$' -bench 'Idle|Wake' -benchtime 1x ./worker/
func BenchmarkIdle(b *testing.B) {
	for _, interval := range idleIntervals(b) {
		for _, n := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("interval=%s/workers=%d", interval, n), func(b *testing.B) {
				server := redistest.NewServer(b, nil)
				client := server.Client(b)
				prefix := redistest.Prefix(b)
				qname := "idle-" + prefix
				var stock, sluice [2]float64 // commands/s, Redis CPU ms/s, per worker
				for i := 0; i < b.N; i++ {
					stock = idleRound(b, client, n, func() func() {
						var srvs []*asynq.Server
						for range n {
							srv := asynq.NewServerFromRedisClient(client, asynq.Config{
								Queues: map[string]int{qname: 1}, Concurrency: 10,
								TaskCheckInterval: interval, LogLevel: asynq.FatalLevel,
							})
							require.NoError(b, srv.Start(asynq.NewServeMux()))
							srvs = append(srvs, srv)
						}
						return func() {
							for _, s := range srvs {
								s.Shutdown()
							}
						}
					})
					sluice = idleRound(b, client, n, func() func() {
						var srvs []*worker.Server
						for range n {
							srv, err := worker.New(client, &worker.Config{
								Prefix: prefix,
								Asynq: asynq.Config{
									Queues: map[string]int{qname: 1}, Concurrency: 10,
									TaskCheckInterval: interval, LogLevel: asynq.FatalLevel,
								},
								Gate: worker.GateConfig{Logger: quiet},
							})
							require.NoError(b, err)
							srv.HandleFunc("job", func(context.Context, *asynq.Task) error { return nil })
							require.NoError(b, srv.Start())
							srvs = append(srvs, srv)
						}
						return func() {
							for _, s := range srvs {
								s.Shutdown()
							}
						}
					})
				}
				b.ReportMetric(stock[0], "asynq-cmds/s/worker")
				b.ReportMetric(sluice[0], "sluice-cmds/s/worker")
				b.ReportMetric(sluice[0]/stock[0], "ratio")
				b.ReportMetric(stock[1], "asynq-redis-ms/s/worker")
				b.ReportMetric(sluice[1], "sluice-redis-ms/s/worker")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// idleIntervals are the TaskCheckIntervals BenchmarkIdle and BenchmarkWake
// consider.
func idleIntervals(b *testing.B) []time.Duration {
	list := os.Getenv("SLUICE_IDLE_INTERVALS")
	if list == "" {
		list = "10ms,100ms,1s"
	}
	var out []time.Duration
	for _, s := range strings.Split(list, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		require.NoError(b, err, "SLUICE_IDLE_INTERVALS")
		out = append(out, d)
	}
	return out
}

// idleRound starts a fleet of n idle workers, lets it settle, and measures
// the Redis commands and CPU it causes per second and per worker.
func idleRound(b *testing.B, client *redis.Client, n int, start func() func()) [2]float64 {
	b.Helper()
	stop := start()
	defer stop()
	time.Sleep(time.Second) // past the start-up's own reads
	cmds0, cpu0 := redisCommands(b, client), redistest.CPU(b, client)
	t0 := time.Now()
	time.Sleep(idleWindow)
	elapsed := time.Since(t0).Seconds()
	// the two INFO calls of the measurement are not the fleet's
	cmds := float64(redisCommands(b, client)-cmds0-1) / elapsed / float64(n)
	cpu := (redistest.CPU(b, client) - cpu0) * 1000 / elapsed / float64(n)
	return [2]float64{cmds, cpu}
}

// redisCommands is how many commands the Redis server has processed.
func redisCommands(b *testing.B, client *redis.Client) int64 {
	info, err := client.Info(context.Background(), "stats").Result()
	require.NoError(b, err)
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "total_commands_processed" {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatal("INFO stats has no total_commands_processed")
	return 0
}

// BenchmarkWake measures, for each TaskCheckInterval considered, how long
// a job takes from queue.Client.Enqueue to its handler on an idle sluice
// worker (its p50 and p99 over 40 jobs, enqueued at random moments).
func BenchmarkWake(b *testing.B) {
	for _, interval := range idleIntervals(b) {
		b.Run("interval="+interval.String(), func(b *testing.B) {
			server := redistest.NewServer(b, nil)
			client := server.Client(b)
			prefix := redistest.Prefix(b)
			qname := "wake-" + prefix
			lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
			require.NoError(b, err)
			defer lim.Close()
			q, err := queue.New(client, &queue.Config{Limiter: lim})
			require.NoError(b, err)
			defer q.Close()
			started := make(chan time.Time, 1)
			srv, err := worker.New(client, &worker.Config{
				Limiter: lim,
				Asynq:   asynq.Config{Queues: map[string]int{qname: 1}, TaskCheckInterval: interval, LogLevel: asynq.FatalLevel},
				Gate:    worker.GateConfig{Logger: quiet},
			})
			require.NoError(b, err)
			srv.HandleFunc("job", func(context.Context, *asynq.Task) error {
				started <- time.Now()
				return nil
			})
			require.NoError(b, srv.Start())
			defer srv.Shutdown()
			time.Sleep(time.Second)
			var lat []float64
			for i := 0; i < b.N*40; i++ {
				time.Sleep(time.Duration(i%7) * interval / 5)
				t0 := time.Now()
				_, err := q.Enqueue(context.Background(), "acme", asynq.NewTask("job", nil), asynq.Queue(qname))
				require.NoError(b, err)
				select {
				case at := <-started:
					lat = append(lat, float64(at.Sub(t0).Microseconds())/1000)
				case <-time.After(10 * time.Second):
					b.Fatal("the job did not start within 10s")
				}
			}
			sort.Float64s(lat)
			b.ReportMetric(lat[len(lat)/2], "p50-ms")
			b.ReportMetric(lat[len(lat)*99/100], "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
