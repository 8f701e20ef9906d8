package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/blocks"
	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// benchGoroutines is how many goroutines make decisions at once.
const benchGoroutines = 64

// benchTenants is how many tenants the decisions spread over.
const benchTenants = 10_000

var tenantNames = func() []string {
	out := make([]string, benchTenants)
	for i := range out {
		out[i] = "tenant-" + strconv.Itoa(i)
	}
	return out
}()

// benchKeys is how many keys below each tenant the keyed rows spread
// over: 80,000 key scopes in all.
const benchKeys = 8

var keyNames = func() []string {
	out := make([]string, benchKeys)
	for i := range out {
		out[i] = "user-" + strconv.Itoa(i)
	}
	return out
}()

// BenchmarkDecisions compares, in one run, sluice's Admit (one rate rule),
// a full Admit+Release cycle (rate and concurrency), an admission of cost
// 10 (rate, window and quota rules) alone and settled to 3 after
// (Limiter.Settle: the difference is a settlement's Redis time), jobs of
// three levels (the tenant's, @global's and a pool's rate; the tenant's,
// its key's and a pool's rate), a keyed admission of cost 10 settled to 3
// (the tenant's and its key's rate, window and quota rules) and
// redis_rate's Allow (the standard Go GCRA limiter), each with 64
// goroutines over 10,000 tenants (the keyed rows over 8 keys of each) on a
// local redis-server. Each iteration runs them for a second each, one
// after the other, so that a noisy machine hurts them alike; the figures
// are medians over the iterations: decisions/s (a cycle counts as one
// decision), the ratio of each to redis_rate, and the Redis CPU time per
// decision. Run with -benchtime Nx. It lives in the bench module, so that
// the library does not depend on redis_rate.
func BenchmarkDecisions(b *testing.B) {
	ctx := context.Background()
	client := redistest.Client(b)
	admitLim, _ := benchLimiter(b, "rate=1000/s burst=1000")
	warm(b, admitLim)
	cycleLim, _ := benchLimiter(b, "rate=1000/s burst=1000 concurrency=100")
	warm(b, cycleLim)
	settleLim, _ := benchLimiter(b, "rate=1000/s burst=1000 window=100000/min quota=10000000/day")
	warm(b, settleLim)
	// three levels: the tenant's rate, @global's and a shared pool's
	poolLim, _ := benchLimiter(b, "rate=1000/s burst=1000")
	for name, text := range map[string]string{throttle.GlobalPolicy: "rate=1000000/s burst=100000", "@api": "rate=1000000/s burst=100000"} {
		p, err := throttle.ParsePolicy(text)
		require.NoError(b, err)
		require.NoError(b, poolLim.Policies().Set(ctx, name, p))
	}
	warm(b, poolLim)
	// three levels below: the tenant's rate, its key's (*/*) and a pool's
	keyLim, _ := benchLimiter(b, "rate=1000/s burst=1000")
	for name, text := range map[string]string{"*/*": "rate=1000/s burst=1000", "@api": "rate=1000000/s burst=100000"} {
		p, err := throttle.ParsePolicy(text)
		require.NoError(b, err)
		require.NoError(b, keyLim.Policies().Set(ctx, name, p))
	}
	warmKeys(b, keyLim)
	// settled costs of keyed jobs: the tenant and its key under the
	// settle row's rules
	keySettleLim, _ := benchLimiter(b, "rate=1000/s burst=1000 window=100000/min quota=10000000/day")
	p, err := throttle.ParsePolicy("rate=1000/s burst=1000 window=100000/min quota=10000000/day")
	require.NoError(b, err)
	require.NoError(b, keySettleLim.Policies().Set(ctx, "*/*", p))
	warmKeys(b, keySettleLim)
	var seq atomic.Int64
	// busy tenants far from their limits: one decision and release per
	// job, or starts from blocks (internal/blocks, as the worker's gate
	// takes them), falling back to single decisions when no block is had
	busyLim, _ := benchLimiter(b, "rate=1000000/s burst=100000 concurrency=10000")
	warm(b, busyLim)
	pool := blocks.NewPool(blocks.Of(busyLim), &blocks.Config{Slots: func() int { return benchGoroutines }})
	// the gate resolves a job's policies once and takes its block under them
	type policies = jobpath.Policies[throttle.Policy, throttle.LearnedLimit, throttle.AdaptiveLimit]
	busyPath := jobpath.Of(busyLim).(jobpath.Engine[throttle.Request, throttle.Decision, *policies])
	defer pool.Close()
	busyCycle := func(t string) error {
		id := strconv.FormatInt(seq.Add(1), 36)
		d, err := busyLim.Admit(ctx, t, id)
		if err == nil && d.Allowed {
			err = busyLim.Release(ctx, t, id, d.Claim)
		}
		return err
	}
	rl := redis_rate.NewLimiter(client)
	rlPrefix := redistest.Prefix(b) + ":"
	limit := redis_rate.Limit{Rate: 1000, Burst: 1000, Period: time.Second}
	kinds := []benchRow{
		{"sluice_admit", func(t string) error {
			_, err := admitLim.Admit(ctx, t, "")
			return err
		}},
		{"sluice_admit_release", func(t string) error {
			id := strconv.FormatInt(seq.Add(1), 36)
			d, err := cycleLim.Admit(ctx, t, id)
			if err == nil && d.Allowed {
				err = cycleLim.Release(ctx, t, id, d.Claim)
			}
			return err
		}},
		{"redis_rate", func(t string) error {
			_, err := rl.Allow(ctx, rlPrefix+t, limit)
			return err
		}},
		// settled costs: a job admitted on an estimate of 10 (the general
		// engine: the quick path takes cost 1 only), and the same settled
		// to 3 once it ran; the difference is a settlement's cost
		{"sluice_admit_cost10", func(t string) error {
			_, err := settleLim.Do(ctx, throttle.Request{Tenant: t, Cost: 10})
			return err
		}},
		{"sluice_admit_3scopes", func(t string) error {
			_, err := poolLim.Do(ctx, throttle.Request{Tenant: t, Pools: []string{"@api"}})
			return err
		}},
		{"sluice_admit_settle", func(t string) error {
			req := throttle.Request{Tenant: t, Cost: 10}
			d, err := settleLim.Do(ctx, req)
			if err == nil && d.Allowed {
				err = settleLim.Settle(ctx, req, d, 3)
			}
			return err
		}},
		{"sluice_admit_key3", func(t string) error {
			_, err := keyLim.Do(ctx, throttle.Request{Tenant: t, Key: keyNames[rand.IntN(benchKeys)], Pools: []string{"@api"}})
			return err
		}},
		{"sluice_busy_admit_release", func(t string) error {
			return busyCycle(busyTenant(t))
		}},
		{"sluice_busy_block", func(t string) error {
			t = busyTenant(t)
			r, err := busyPath.Resolve(ctx, t)
			if err != nil {
				return err
			}
			if s, ok := pool.Take(ctx, t, r, 1, true); ok {
				s.Done()
				return nil
			}
			return busyCycle(t)
		}},
		{"sluice_admit_key_settle", func(t string) error {
			req := throttle.Request{Tenant: t, Key: keyNames[rand.IntN(benchKeys)], Cost: 10}
			d, err := keySettleLim.Do(ctx, req)
			if err == nil && d.Allowed {
				err = keySettleLim.Settle(ctx, req, d, 3)
			}
			return err
		}},
	}
	rates := make([][]float64, len(kinds))
	cpus := make([][]float64, len(kinds))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, kind := range kinds {
			cpu0 := redisCPU(b, client)
			n, elapsed := runFor(time.Second, kind.one, b)
			cpu1 := redisCPU(b, client)
			rates[k] = append(rates[k], float64(n)/elapsed.Seconds())
			cpus[k] = append(cpus[k], (cpu1-cpu0)*1e6/float64(n))
		}
	}
	b.StopTimer()
	// a row's median Redis time, by name
	row := func(name string) int {
		i := slices.IndexFunc(kinds, func(k benchRow) bool { return k.name == name })
		require.GreaterOrEqual(b, i, 0, name)
		return i
	}
	cpu := func(name string) float64 { return median(cpus[row(name)]) }
	base := median(rates[row("redis_rate")])
	for k, kind := range kinds {
		b.ReportMetric(median(rates[k]), kind.name+"/s")
		b.ReportMetric(median(cpus[k]), kind.name+"_redis-µs")
		if k < 2 {
			b.ReportMetric(median(rates[k])/base, kind.name+"/redis_rate")
		}
	}
	// a settlement's Redis time: the admission and settlement less the
	// admission alone
	b.ReportMetric(cpu("sluice_admit_settle")-cpu("sluice_admit_cost10"), "sluice_settle_redis-µs")
	// a job of three levels (tenant, @global, a pool) against one of its
	// tenant alone; one of a tenant, its key and a pool against both
	b.ReportMetric(cpu("sluice_admit_3scopes")/cpu("sluice_admit"), "sluice_3scopes/admit_redis")
	b.ReportMetric(cpu("sluice_admit_key3")/cpu("sluice_admit"), "sluice_key3/admit_redis")
	b.ReportMetric(cpu("sluice_admit_key3")/cpu("sluice_admit_3scopes"), "sluice_key3/3scopes_redis")
	// a start from a block against a decision and release of its own, for
	// busy tenants far from their limits (amortised Redis time per start)
	b.ReportMetric(cpu("sluice_busy_block")/cpu("sluice_busy_admit_release"), "sluice_block/cycle_redis")
	// a keyed settled job (tenant and key) against one of its tenant alone
	b.ReportMetric(cpu("sluice_admit_key_settle")/cpu("sluice_admit_settle"), "sluice_key_settle/settle_redis")
}

// busyTenants is how many tenants the busy rows spread over: a few, each
// with many jobs at once.
const busyTenants = 16

// busyTenant maps a random tenant to one of the busy rows' tenants.
func busyTenant(t string) string {
	var h uint32
	for i := 0; i < len(t); i++ {
		h = h*31 + uint32(t[i])
	}
	return "busy-" + strconv.Itoa(int(h%busyTenants))
}

// benchRow is a row of BenchmarkDecisions: one decision (or cycle) of a
// random tenant.
type benchRow struct {
	name string
	one  func(t string) error
}

// runFor makes decisions with 64 goroutines over random tenants for d.
func runFor(d time.Duration, one func(t string) error, b *testing.B) (int64, time.Duration) {
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for g := 0; g < benchGoroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(start.UnixNano())))
			for time.Now().Before(stop) {
				if err := one(tenantNames[rng.IntN(benchTenants)]); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		}(g)
	}
	wg.Wait()
	return n.Load(), time.Since(start)
}

// redisCPU is the server's CPU time so far, in seconds.
func redisCPU(b *testing.B, c redis.UniversalClient) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	require.NoError(b, err)
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return total
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func benchLimiter(b *testing.B, defaultPolicy string) (*throttle.Limiter, string) {
	b.Helper()
	client := redistest.Client(b)
	prefix := redistest.Prefix(b)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	require.NoError(b, err)
	b.Cleanup(func() { _ = lim.Close() })
	p, err := throttle.ParsePolicy(defaultPolicy)
	require.NoError(b, err)
	require.NoError(b, lim.Policies().Set(context.Background(), throttle.DefaultPolicy, p))
	return lim, prefix
}

// warm loads every tenant's policy into the cache, as a running worker has.
func warm(b *testing.B, lim *throttle.Limiter) {
	for _, t := range tenantNames {
		if _, err := lim.Do(context.Background(), throttle.Request{Tenant: t, ID: "warm", DryRun: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// warmKeys loads every tenant's and every key's policies into the cache,
// as a running worker has, with benchGoroutines goroutines (80,000 keys).
func warmKeys(b *testing.B, lim *throttle.Limiter) {
	var wg sync.WaitGroup
	for g := range benchGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < benchTenants; i += benchGoroutines {
				for _, k := range keyNames {
					req := throttle.Request{Tenant: tenantNames[i], Key: k, ID: "warm", DryRun: true}
					if _, err := lim.Do(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
