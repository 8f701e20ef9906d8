package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// maxInWindow is the largest number of times in any half-open interval
// [t, t+d); the busiest interval always starts at one of the times.
func maxInWindow(times []time.Time, d time.Duration) (n int, at time.Time) {
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	j := 0
	for i := range times {
		for j < len(times) && times[j].Before(times[i].Add(d)) {
			j++
		}
		if j-i > n {
			n, at = j-i, times[i]
		}
	}
	return n, at
}

func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(100, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	n, _ := maxInWindow(at(0, 999, 1000, 1999), time.Second)
	require.Equal(t, 2, n) // half-open: 0 and 1000 are never together
	n, start := maxInWindow(at(5, 0, 1500, 1200, 1000, 2100), time.Second)
	require.Equal(t, 3, n)
	require.Equal(t, t0.Add(time.Second), start)
}

// TestWindowRealClock: many goroutines hammer one tenant's sliding window
// with the real clock; on the recorded start times no interval of the
// window's length ever holds more than its limit, and the limit is used.
func TestWindowRealClock(t *testing.T) {
	t.Parallel()
	const limit, window = 20, 500 * time.Millisecond
	const workers, run = 32, 2 * time.Second
	e := setup(t, true, nil)
	e.policy(t, stepTenant, fmt.Sprintf("window=%d/%s", limit, window))
	ctx := context.Background()
	var mu sync.Mutex
	var starts []time.Time
	var denials int
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	stop := time.Now().Add(run)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				d, err := e.lim.Admit(ctx, stepTenant, fmt.Sprintf("w%d-%d", w, i))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if d.Allowed {
					starts = append(starts, d.Now)
				} else {
					denials++
				}
				mu.Unlock()
				if !d.Allowed {
					if d.Rule != "window" || d.RetryAfter <= 0 || d.RetryAfter > window {
						errs <- fmt.Errorf("denial %s", d)
						return
					}
					// come back when the window says, like a worker would
					time.Sleep(d.RetryAfter)
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	n, at := maxInWindow(starts, window)
	first, last := starts[0], starts[len(starts)-1]
	t.Logf("%d starts, %d denials over %s; busiest %s-window holds %d", len(starts), denials, last.Sub(first), window, n)
	require.LessOrEqual(t, n, limit, "%d starts in [%s, +%s)", n, at.Format(time.RFC3339Nano), window)
	require.Equal(t, limit, n, "the window was never used to the full")
	require.Positive(t, denials)
	// close to the limit throughout: from the first start to the last, at
	// most limit*(spans+1) could start
	most := limit * (int(last.Sub(first)/window) + 1)
	require.GreaterOrEqual(t, len(starts), most*3/4, "only %d starts where %d could", len(starts), most)
}

// holding is one job's hold on a concurrency slot, as the job itself saw
// it: from its admission until its lease ran out or it began releasing.
type holding struct {
	id          string
	from, until time.Time
}

// TestConcurrencyRealClock: 64 goroutines admit and release jobs against
// one tenant's concurrency limit with the real clock, some crashing while
// they hold a slot. Counted from the jobs' own records, never more than M
// hold a slot at any instant; a crashed job's slot comes back after its
// lease; a job admitted again keeps the slot it has.
func TestConcurrencyRealClock(t *testing.T) {
	t.Parallel()
	const limit, lease = 5, time.Second
	const workers, run = 64, 2 * time.Second
	e := setup(t, true, nil)
	e.policy(t, stepTenant, fmt.Sprintf("concurrency=%d lease=%s", limit, lease))
	ctx := context.Background()
	var mu sync.Mutex
	var holds []holding
	var admissions []time.Time
	crashes := map[string]time.Time{} // id -> lease end
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	// the run lasts until every crashed job's lease has been over a while
	stop := time.Now().Add(run)
	running := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Before(stop)
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			fail := func(err error) { errs <- fmt.Errorf("worker %d: %w", w, err) }
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; running(); i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				d, err := e.lim.Admit(ctx, stepTenant, id)
				if err != nil {
					fail(err)
					return
				}
				if !d.Allowed {
					if d.Rule != "concurrency" || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
						fail(fmt.Errorf("denial %s", d))
						return
					}
					time.Sleep(min(d.RetryAfter, time.Duration(1+rng.IntN(5))*time.Millisecond))
					continue
				}
				if d.InFlight < 1 || d.InFlight > limit || d.Lease != lease {
					fail(fmt.Errorf("admission %+v", d))
					return
				}
				h := holding{id: id, from: d.Now, until: d.Now.Add(d.Lease)}
				mu.Lock()
				admissions = append(admissions, d.Now)
				mu.Unlock()
				// one worker in sixteen crashes holding its first slot:
				// no release, no renewal
				if w%16 == 0 {
					mu.Lock()
					holds = append(holds, h)
					crashes[id] = h.until
					if end := time.Now().Add(lease + 300*time.Millisecond); end.After(stop) {
						stop = end
					}
					mu.Unlock()
					return
				}
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if rng.IntN(4) == 0 {
					// the same job admitted again (a redelivery) keeps its slot
					again, err := e.lim.Admit(ctx, stepTenant, id)
					if err != nil {
						fail(err)
						return
					}
					if !again.Allowed {
						fail(fmt.Errorf("job %s admitted again while holding its slot: %s", id, again))
						return
					}
					h.until = again.Now.Add(again.Lease)
				}
				// the slot is surely held until the release starts
				now, err := e.client.Time(ctx).Result()
				if err != nil {
					fail(err)
					return
				}
				if now.Before(h.until) {
					h.until = now
				}
				if err := e.lim.Release(ctx, stepTenant, id, 0); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				holds = append(holds, h)
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, crashes, workers/16)
	// at every admission, count the jobs surely holding a slot
	sort.Slice(holds, func(i, j int) bool { return holds[i].from.Before(holds[j].from) })
	peak := 0
	for _, at := range admissions {
		live := 0
		for _, h := range holds {
			if h.from.After(at) {
				break
			}
			if at.Before(h.until) {
				live++
			}
		}
		require.LessOrEqual(t, live, limit, "%d jobs held a slot at %s", live, at.Format(time.RFC3339Nano))
		peak = max(peak, live)
	}
	// the crashed jobs' slots came back: jobs started after their leases
	var lastCrash time.Time
	for _, end := range crashes {
		if end.After(lastCrash) {
			lastCrash = end
		}
	}
	after := 0
	for _, at := range admissions {
		if !at.Before(lastCrash) {
			after++
		}
	}
	t.Logf("%d admissions, peak %d holders of %d; %d admissions after the crashed leases ended", len(admissions), peak, limit, after)
	require.Equal(t, limit, peak, "the limit was never reached")
	require.Positive(t, after)
}

// TestConcurrencyCrashedLease: slots held by crashed jobs come back after
// their lease and not before; a holder admitted again keeps its one slot.
func TestConcurrencyCrashedLease(t *testing.T) {
	t.Parallel()
	const limit, lease = 3, time.Second
	e := setup(t, true, nil)
	e.policy(t, stepTenant, fmt.Sprintf("concurrency=%d lease=%s", limit, lease))
	ctx := context.Background()
	var firstEnd time.Time
	for i := 0; i < limit; i++ {
		d, err := e.lim.Admit(ctx, stepTenant, fmt.Sprintf("crashed-%d", i))
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, int64(i+1), d.InFlight)
		if i == 0 {
			firstEnd = d.Now.Add(lease)
		}
	}
	// admitted again, a holder keeps its one slot, even when all are taken
	d, err := e.lim.Admit(ctx, stepTenant, "crashed-2")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, int64(limit), d.InFlight)

	deadline := time.Now().Add(lease + 3*time.Second)
	for {
		d, err := e.lim.Admit(ctx, stepTenant, "next")
		require.NoError(t, err)
		if d.Allowed {
			require.False(t, d.Now.Before(firstEnd), "admitted at %s, before the first lease ended at %s", d.Now, firstEnd)
			require.Less(t, d.Now.Sub(firstEnd), time.Second, "admitted long after the lease ended")
			break
		}
		require.Equal(t, "concurrency", d.Rule)
		require.LessOrEqual(t, d.RetryAfter, lease)
		require.True(t, time.Now().Before(deadline), "the crashed job's slot never came back")
		time.Sleep(d.RetryAfter)
	}
	// the other crashed holders are gone by now as well, or soon
	err = e.lim.Renew(ctx, stepTenant, "crashed-0", 0)
	require.ErrorIs(t, err, ErrClaimLost, "a lease that ran out was renewed")
}

// tenantKeys lists the keys of tenant that exist.
func tenantKeys(t *testing.T, e *env, tenant string) []string {
	t.Helper()
	var out []string
	for _, k := range keysFor(e.prefix, tenant).all() {
		n, err := e.client.Exists(context.Background(), k).Result()
		require.NoError(t, err)
		if n == 1 {
			out = append(out, k)
		}
	}
	return out
}

// TestIdleTenantsLeaveNoKeys: once a tenant's state has recovered, every
// one of its keys is gone by itself, whatever rules it used.
func TestIdleTenantsLeaveNoKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, true, &Config{Grace: 200 * time.Millisecond})
	ctx := context.Background()
	policies := map[string]string{
		"rate":         "rate=20/s burst=5 rate=100/min burst=10",
		"window":       "window=5/500ms",
		"concurrency":  "concurrency=2 lease=1s",
		"reservations": "rate=10/s window=20/s",
		"all":          "rate=10/s burst=2 window=4/s concurrency=1 lease=1s",
	}
	for name, text := range policies {
		e.policy(t, name, text)
	}
	for tenant := range policies {
		for i := 0; i < 8; i++ {
			_, err := e.lim.Do(ctx, Request{Tenant: tenant, ID: fmt.Sprintf("j%d", i), Reserve: tenant == "reservations" || tenant == "all"})
			require.NoError(t, err)
		}
	}
	_, err := e.lim.Cooldown(ctx, "window", 300*time.Millisecond)
	require.NoError(t, err)
	for tenant := range policies {
		require.NotEmpty(t, tenantKeys(t, e, tenant), tenant)
	}
	st, err := e.lim.Stats(ctx, "reservations")
	require.NoError(t, err)
	require.Equal(t, int64(7), st.Reservations)

	// the state hash outlives the last start by ~5s (the starts counter)
	deadline := time.Now().Add(15 * time.Second)
	for tenant := range policies {
		for {
			left := tenantKeys(t, e, tenant)
			if len(left) == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "tenant %q still has keys %q", tenant, left)
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestTenantMemory reports what one active tenant with one rate rule costs
// in Redis.
func TestTenantMemory(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	e.policy(t, DefaultPolicy, "rate=100/s")
	const tenant = "customer-000042"
	d, err := e.lim.Admit(ctx, tenant, "job-1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	var total int64
	for _, k := range tenantKeys(t, e, tenant) {
		n, err := e.client.MemoryUsage(ctx, k).Result()
		require.NoError(t, err)
		t.Logf("%s: %d B", k, n)
		total += n
	}
	t.Logf("MEMORY USAGE of one active tenant with one rate rule: %d B (target 200 B)", total)
	require.Positive(t, total)
	require.LessOrEqual(t, total, int64(200))
}
