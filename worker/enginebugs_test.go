package worker_test

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// These tests pin down limiter (throttle package) bugs the worker's fault
// tests ran into. They fail until the engine is fixed, so they run only
// with -sluice.engine-bugs; each belongs in throttle/ once it passes.
var engineBugs = flag.Bool("sluice.engine-bugs", false, "run the tests of known engine bugs (they fail until fixed)")

func skipUnlessEngineBugs(t *testing.T) {
	t.Helper()
	if !*engineBugs {
		t.Skip("a known engine bug; run with -sluice.engine-bugs")
	}
}

// admitLoop runs callers goroutines that each admit jobs of tenant one
// after the other, as the gate does: the same identity until admitted,
// waiting the retry-after when denied and 100 ms after an error, then
// holding the job for hold and releasing it. It stops after n admissions
// or when stop is closed, and returns the admission times and the most
// jobs held at once.
func admitLoop(lim *throttle.Limiter, tenant string, callers, n int, hold time.Duration, stop <-chan struct{}) ([]time.Time, int) {
	var mu sync.Mutex
	var starts []time.Time
	var running, most atomic.Int64
	var seq atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("job-%d", seq.Add(1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				done := len(starts) >= n
				mu.Unlock()
				if done {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				d, err := lim.Do(ctx, throttle.Request{Tenant: tenant, ID: id, Reserve: true})
				cancel()
				switch {
				case err != nil:
					time.Sleep(100 * time.Millisecond)
					continue
				case !d.Allowed:
					time.Sleep(min(d.RetryAfter, 200*time.Millisecond))
					continue
				}
				mu.Lock()
				starts = append(starts, time.Now())
				mu.Unlock()
				r := running.Add(1)
				for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
				}
				time.Sleep(hold)
				running.Add(-1)
				_ = lim.Release(context.Background(), tenant, id)
				id = fmt.Sprintf("job-%d", seq.Add(1))
			}
		}()
	}
	wg.Wait()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	return starts, int(most.Load())
}

// On a Cluster a tenant and @global are admitted in two steps (split.go).
// With a rate rule in both, 50 concurrent callers with reservations get
// 8 of 100 admissions beyond the tenant's GCRA(20/s, burst 2+1) and take
// 8.1–8.5 s instead of 4.9 s; on a single server (one script) none, 4.9 s.
func TestEngineSplitAdmissionKeepsTheTenantRate(t *testing.T) {
	skipUnlessEngineBugs(t)
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=20/s burst=2")
	e.policy(t, "@global", "rate=1000/s")
	starts, _ := admitLoop(e.lim, "acme", 50, 100, 0, nil)
	t.Logf("Cluster: %t; 100 admissions over %s", redistest.ClusterMode(), starts[len(starts)-1].Sub(starts[0]).Round(time.Millisecond))
	require.Zero(t, nonConforming(starts, 20, 3))
}

// After a master failover on a Cluster, the two-step admission lets far
// more jobs hold @global's concurrency slots than its cap: with @global
// concurrency=4 and a tenant at rate=20/s, 50 callers hold up to 42–46 jobs
// at once in the seconds after the tenant's master (or @global's) is killed
// and its replica promoted. With the same rules in the tenant's own policy
// (one step) it stays at 2.
func TestEngineSplitAdmissionHoldsConcurrencyThroughAFailover(t *testing.T) {
	skipUnlessEngineBugs(t)
	c := redistest.NewCluster(t, &redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Second})
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	e := setup(t, client)
	ctx := context.Background()
	slotOf := func(key string) int {
		s, err := client.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		return int(s)
	}
	global := c.MasterOf(slotOf(e.prefix + ":{g}:s"))
	tenant := ""
	for i := 0; tenant == ""; i++ {
		if name := fmt.Sprintf("t%d", i); c.MasterOf(slotOf(e.prefix+":{t:"+name+"}:s")) != global {
			tenant = name
		}
	}
	e.policy(t, tenant, "rate=20/s burst=2")
	e.policy(t, "@global", "concurrency=4 lease=2s")
	stop := make(chan struct{})
	var most int
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, most = admitLoop(e.lim, tenant, 50, 1<<30, 20*time.Millisecond, stop)
	}()
	time.Sleep(2 * time.Second) // jobs flow
	c.MasterOf(slotOf(e.prefix + ":{t:" + tenant + "}:s")).Kill()
	c.Wait(t, 30*time.Second)
	time.Sleep(5 * time.Second) // jobs flow again
	close(stop)
	<-done
	require.LessOrEqual(t, most, 4, "@global's concurrency cap")
}

// Limiter.Do returns ctx's error at its deadline, but not when the policy
// cache is cold: PolicyStore.resolve reads Redis with a plain go-redis call,
// which does not end at the context's deadline (go-redis's
// ContextTimeoutEnabled is off by default) but at the client's timeouts. On
// a frozen Redis a Do given 300 ms returns after 5 s (the HELLO of a new
// connection); the gate's CallTimeout no longer bounds a decision, and
// TestFailClosedWhileRedisIsFrozen fails about one run in ten (when the
// policy store's watcher starts afresh during the freeze).
func TestEngineDoReturnsAtItsDeadline(t *testing.T) {
	skipUnlessEngineBugs(t)
	t.Parallel()
	server := redistest.NewServer(t, nil)
	lim, err := throttle.NewLimiter(server.Client(t), &throttle.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	defer lim.Close()
	require.NoError(t, server.Freeze())
	defer func() { _ = server.Thaw() }()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err = lim.Do(ctx, throttle.Request{Tenant: "acme", ID: "job-1"})
	require.Error(t, err)
	require.Less(t, time.Since(begin), time.Second)
}
