package throttle

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// The engine's comparison with redis_rate (BenchmarkDecisions) lives in the
// bench module (bench/engine), so that the library does not depend on it.

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
