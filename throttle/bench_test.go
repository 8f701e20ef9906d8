package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// benchGoroutines is how many goroutines make decisions at once.
const benchGoroutines = 64

// benchTenants is how many tenants the decisions spread over.
const benchTenants = 10_000

func parallel64(b *testing.B, body func(pb *testing.PB)) {
	b.SetParallelism((benchGoroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.RunParallel(body)
}

func reportRate(b *testing.B, start time.Time, n int64) {
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "decisions/s")
}

var tenantNames = func() []string {
	out := make([]string, benchTenants)
	for i := range out {
		out[i] = "tenant-" + strconv.Itoa(i)
	}
	return out
}()

// BenchmarkDecisions compares, in one run, sluice's Admit (one rate rule),
// a full Admit+Release cycle (rate and concurrency) and redis_rate's Allow
// (the standard Go GCRA limiter), each with 64 goroutines over 10,000 tenants
// on a local redis-server. decisions/s is the figure to compare; a cycle
// counts as one decision.
func BenchmarkDecisions(b *testing.B) {
	ctx := context.Background()
	b.Run("sluice_admit_rate", func(b *testing.B) {
		lim, _ := benchLimiter(b, "rate=1000/s burst=1000")
		warm(b, lim)
		var n atomic.Int64
		start := time.Now()
		b.ResetTimer()
		parallel64(b, func(pb *testing.PB) {
			rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
			for pb.Next() {
				t := tenantNames[rng.IntN(benchTenants)]
				if _, err := lim.Admit(ctx, t, ""); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
		reportRate(b, start, n.Load())
	})
	b.Run("sluice_admit_release_rate_concurrency", func(b *testing.B) {
		lim, _ := benchLimiter(b, "rate=1000/s burst=1000 concurrency=100")
		warm(b, lim)
		var n, seq atomic.Int64
		start := time.Now()
		b.ResetTimer()
		parallel64(b, func(pb *testing.PB) {
			rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
			for pb.Next() {
				t := tenantNames[rng.IntN(benchTenants)]
				id := strconv.FormatInt(seq.Add(1), 36)
				d, err := lim.Admit(ctx, t, id)
				if err != nil {
					b.Error(err)
					return
				}
				if d.Allowed {
					if err := lim.Release(ctx, t, id); err != nil {
						b.Error(err)
						return
					}
				}
				n.Add(1)
			}
		})
		reportRate(b, start, n.Load())
	})
	b.Run("redis_rate_allow", func(b *testing.B) {
		client := redistest.Client(b)
		prefix := redistest.Prefix(b) + ":"
		rl := redis_rate.NewLimiter(client)
		limit := redis_rate.Limit{Rate: 1000, Burst: 1000, Period: time.Second}
		var n atomic.Int64
		start := time.Now()
		b.ResetTimer()
		parallel64(b, func(pb *testing.PB) {
			rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
			for pb.Next() {
				t := tenantNames[rng.IntN(benchTenants)]
				if _, err := rl.Allow(ctx, prefix+t, limit); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
		reportRate(b, start, n.Load())
	})
}

func benchLimiter(b *testing.B, defaultPolicy string) (*Limiter, string) {
	b.Helper()
	client := redistest.Client(b)
	prefix := redistest.Prefix(b)
	lim, err := NewLimiter(client, &Config{Prefix: prefix})
	require.NoError(b, err)
	b.Cleanup(func() { _ = lim.Close() })
	p, err := ParsePolicy(defaultPolicy)
	require.NoError(b, err)
	require.NoError(b, lim.Policies().Set(context.Background(), DefaultPolicy, p))
	return lim, prefix
}

// warm loads every tenant's policy into the cache, as a running worker has.
func warm(b *testing.B, lim *Limiter) {
	for _, t := range tenantNames {
		if _, err := lim.policies.resolve(context.Background(), t); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTenantMemory reports the Redis memory one active tenant with one
// rate rule takes, and what an idle one leaves behind.
func BenchmarkTenantMemory(b *testing.B) {
	ctx := context.Background()
	lim, prefix := benchLimiter(b, "rate=10/s")
	client := redistest.Client(b)
	var total int64
	for i := 0; i < b.N; i++ {
		t := fmt.Sprintf("mem-%d", i)
		if _, err := lim.Admit(ctx, t, ""); err != nil {
			b.Fatal(err)
		}
		for _, k := range keysFor(prefix, t).all() {
			n, err := client.MemoryUsage(ctx, k).Result()
			if err == nil {
				total += n
			}
		}
	}
	b.ReportMetric(float64(total)/float64(b.N), "B/active-tenant")
}
