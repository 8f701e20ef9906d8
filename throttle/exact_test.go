package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// The tests of this file hold a tenant and @global to a single server's
// decisions on Redis Cluster, where they live in different slots and are
// decided in steps (split.go). Each runs on the shared three-master Cluster
// in every pass, and on the shared single server where it compares.

// realEnvs are a single-server and a Cluster limiter on Redis time.
func realEnvs(t *testing.T) []*env {
	t.Helper()
	single := setupOn(t, redistest.Client(t), true, nil)
	cluster := setupOn(t, redistest.ClusterClient(t), true, nil)
	require.True(t, cluster.lim.cluster)
	return []*env{single, cluster}
}

func envName(e *env) string {
	if e.lim.cluster {
		return "Cluster"
	}
	return "single server"
}

// 3,000 jobs admitted one after the other under @global concurrency=3 and a
// tenant rate of 2000/s, each admitted job released at once: no denial says
// RetryAfter -1, and no slot of @global is ever left held. On a Cluster this
// once admitted 15 jobs of 3,000: three denials came back with RetryAfter -1
// after @global (asked to admit "no earlier than" the tenant's retry time,
// already past by its own clock) had charged them a slot that was never
// given back, and @global sat at its cap for a whole lease.
func TestSequentialAdmissionsLeaveNoSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, e := range realEnvs(t) {
		t.Run(envName(e), func(t *testing.T) {
			t.Parallel()
			e.policy(t, GlobalPolicy, "concurrency=3")
			e.policy(t, "acme", "rate=2000/s")
			admitted := 0
			for i := range 3000 {
				id := "job-" + strconv.Itoa(i)
				d, err := e.lim.Admit(ctx, "acme", id)
				require.NoError(t, err)
				require.Equal(t, d.Allowed, d.RetryAfter == -1, "job %d: %s", i, d)
				if !d.Allowed {
					require.NotEmpty(t, d.Rule, "job %d: denied by no rule", i)
					require.Equal(t, "acme", d.Policy, "job %d: @global's slots are all free", i)
					continue
				}
				admitted++
				require.NoError(t, e.lim.Release(ctx, "acme", id, d.Claim))
				if i%250 == 0 {
					st := stateOf(t, e, GlobalPolicy)
					require.Zero(t, st.Concurrency.InFlight, "job %d: @global holds %v", i, st.Concurrency.Holders)
				}
			}
			st := stateOf(t, e, GlobalPolicy)
			require.Zero(t, st.Concurrency.InFlight, "@global holds %v", st.Concurrency.Holders)
			// every denial is the tenant's rate, so about a second's worth
			// of the 3,000 calls get in, whatever the machine's speed
			t.Logf("%s: %d of 3000 admitted", envName(e), admitted)
			require.Greater(t, admitted, 100)
		})
	}
}

// A storm: 64 goroutines admit jobs of 300 tenants, spread over the three
// masters, for 10 s under @global concurrency=3 and a rate. At no moment do
// more than 3 jobs run (as the callers count them), and once every job is
// released and the meters have run out, nothing is left: no holder, no
// reservation, no meter ahead, no leftover charge, in any scope.
func TestClusterStorm(t *testing.T) {
	redistest.SkipOnCluster(t, "runs on the shared Cluster in the single-node pass already")
	t.Parallel()
	e := setupOn(t, redistest.ClusterClient(t), true, nil)
	ctx := context.Background()
	e.policy(t, GlobalPolicy, "concurrency=3 rate=500/s burst=10")
	e.policy(t, DefaultPolicy, "rate=5000/s concurrency=2")
	tenants := make([]string, 300)
	masters := map[string]bool{}
	cc := e.client.(*redis.ClusterClient)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("storm-%03d", i)
		node, err := cc.MasterForKey(ctx, keysFor(e.prefix, tenants[i]).state)
		require.NoError(t, err)
		masters[node.Options().Addr] = true
	}
	require.Len(t, masters, 3, "the tenants do not reach every master")

	storm := 10 * time.Second
	var running, most, admitted, denied atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(storm)
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for n := 0; time.Now().Before(stop); n++ {
				tenant := tenants[rng.IntN(len(tenants))]
				id := fmt.Sprintf("g%d-%d", g, n)
				d, err := e.lim.Admit(ctx, tenant, id)
				if err != nil {
					errs <- err
					return
				}
				if !d.Allowed {
					denied.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				admitted.Add(1)
				r := running.Add(1)
				for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				running.Add(-1)
				if err := e.lim.Release(ctx, tenant, id, d.Claim); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("storm: %d admitted, %d denied, at most %d running", admitted.Load(), denied.Load(), most.Load())
	require.Positive(t, admitted.Load())
	require.LessOrEqual(t, most.Load(), int64(3), "@global's concurrency cap")

	// the meters run out within a second
	time.Sleep(time.Second + 100*time.Millisecond)
	for _, scope := range append([]string{GlobalPolicy}, tenants...) {
		st := stateOf(t, e, scope)
		require.Zero(t, st.Concurrency.InFlight, "%s: holders %v", scope, st.Concurrency.Holders)
		require.Zero(t, st.Reservations, scope)
		require.Zero(t, st.Leftovers, scope)
		for _, r := range st.Rates {
			require.Zero(t, r.Ahead, "%s %s", scope, r.Rule)
			require.Zero(t, r.StartedAhead, "%s %s", scope, r.Rule)
			require.Equal(t, r.Rate.Burst, r.Available, "%s %s", scope, r.Rule)
		}
	}
}

// Claims are fenced: once a job's concurrency slot has passed to another
// admission, Release and Renew under the old claim change nothing and say
// so (ErrClaimLost). A job admitted again while its claim is alive (a
// redelivery after its worker crashed) reuses its own slot under a new
// claim. The same on a single server and on a Cluster, where the tenant and
// @global each hold the slot.
func TestClaimsAreFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, e := range []*env{singleEnv(t, nil), clusterEnv(t, nil)} {
		t.Run(envName(e), func(t *testing.T) {
			e.policy(t, "acme", "concurrency=1 lease=1s")
			e.policy(t, GlobalPolicy, "concurrency=5 lease=1s")
			admit := func(id string) Decision {
				t.Helper()
				d, err := e.lim.Admit(ctx, "acme", id)
				require.NoError(t, err)
				require.True(t, d.Allowed, "%s: %s", id, d)
				require.NotZero(t, d.Claim, id)
				return d
			}
			holders := func() map[string]map[string]time.Time {
				t.Helper()
				out := map[string]map[string]time.Time{}
				for _, scope := range []string{"acme", GlobalPolicy} {
					out[scope] = map[string]time.Time{}
					for _, h := range stateOf(t, e, scope).Concurrency.Holders {
						out[scope][h.ID] = h.LeaseEnd
					}
				}
				return out
			}

			// a's lease runs out (its renewals stopped) and b takes the slot
			a := admit("a")
			e.clock.Advance(2 * time.Second)
			b := admit("b")
			before := holders()
			require.Len(t, before["acme"], 1)
			require.Contains(t, before["acme"], "b")
			require.ErrorIs(t, e.lim.Renew(ctx, "acme", "a", a.Claim), ErrClaimLost)
			require.ErrorIs(t, e.lim.Release(ctx, "acme", "a", a.Claim), ErrClaimLost)
			require.Equal(t, before, holders(), "the stale claim changed something")

			// the same job admitted again after its lease ran out (its worker
			// died): the old claim is fenced off
			require.NoError(t, e.lim.Release(ctx, "acme", "b", b.Claim))
			x1 := admit("x")
			e.clock.Advance(2 * time.Second)
			x2 := admit("x")
			require.NotEqual(t, x1.Claim, x2.Claim)
			before = holders()
			require.ErrorIs(t, e.lim.Renew(ctx, "acme", "x", x1.Claim), ErrClaimLost)
			require.ErrorIs(t, e.lim.Release(ctx, "acme", "x", x1.Claim), ErrClaimLost)
			require.Equal(t, before, holders(), "the stale claim changed something")
			e.clock.Advance(500 * time.Millisecond)
			require.NoError(t, e.lim.Renew(ctx, "acme", "x", x2.Claim))
			require.Equal(t, e.clock.Now().Add(time.Second).UnixMicro(), holders()["acme"]["x"].UnixMicro(), "renewed under the live claim")

			// admitted again while its claim is alive: the same slot
			x3 := admit("x")
			require.Equal(t, int64(1), x3.InFlight, "a second slot was taken")
			require.ErrorIs(t, e.lim.Release(ctx, "acme", "x", x2.Claim), ErrClaimLost)
			require.Len(t, holders()["acme"], 1)
			require.NoError(t, e.lim.Release(ctx, "acme", "x", x3.Claim))
			h := holders()
			require.Empty(t, h["acme"])
			require.Empty(t, h[GlobalPolicy])
			// a second release of the same claim finds nothing to give back
			require.ErrorIs(t, e.lim.Release(ctx, "acme", "x", x3.Claim), ErrClaimLost)
		})
	}
}

// A slot keeps its lease end and claim in one field, LEASE.CLAIM, which a
// sluice from before still reads as the lease end (Lua's tonumber); a slot
// such a sluice wrote (the lease end alone, the claim in c:<job>) counts
// until its lease ends and is held by no claim.
func TestSlotFieldAcrossVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, false, nil)
	e.policy(t, "acme", "concurrency=1 lease=1s")
	state := keysFor(e.prefix, "acme").state

	d, err := e.lim.Admit(ctx, "acme", "new")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	v, err := e.client.HGet(ctx, state, "h:new").Result()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%d.%d", e.clock.Now().Add(time.Second).UnixMicro(), d.Claim), v)
	lease, err := e.client.Eval(ctx, "return tonumber(redis.call('HGET', KEYS[1], 'h:new'))", []string{state}).Int64()
	require.NoError(t, err)
	// (read as a float, the claim's digits may round it up a microsecond)
	require.InDelta(t, e.clock.Now().Add(time.Second).UnixMicro(), lease, 1, "an older sluice's reading")
	require.NoError(t, e.lim.Release(ctx, "acme", "new", d.Claim))

	// a slot written before: it holds the only slot for its lease
	end := e.clock.Now().Add(time.Second).UnixMicro()
	require.NoError(t, e.client.HSet(ctx, state, "h:old", end, "c:old", 12345, "hc", 1, "hm", end).Err())
	d, err = e.lim.Admit(ctx, "acme", "other")
	require.NoError(t, err)
	require.False(t, d.Allowed, "the older slot was not counted")
	require.ErrorIs(t, e.lim.Release(ctx, "acme", "old", 12345), ErrClaimLost)
	require.Equal(t, int64(1), stateOf(t, e, "acme").Concurrency.InFlight)
	e.clock.Advance(1100 * time.Millisecond)
	d, err = e.lim.Admit(ctx, "acme", "other")
	require.NoError(t, err)
	require.True(t, d.Allowed, "the older slot outlived its lease: %s", d)
	require.Equal(t, int64(1), d.InFlight)
}

// A tenant's keys are gone a few seconds after its last slot is released
// (its meters full), not a lease later: a 30 s lease once kept them 31 s.
func TestReleasedTenantExpiresSoon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, e := range realEnvs(t) {
		t.Run(envName(e), func(t *testing.T) {
			t.Parallel()
			e.policy(t, "acme", "rate=100/s burst=2 concurrency=2 lease=30s")
			e.policy(t, GlobalPolicy, "concurrency=10 lease=30s")
			var claims []uint64
			for _, id := range []string{"a", "b"} {
				d, err := e.lim.Admit(ctx, "acme", id)
				require.NoError(t, err)
				require.True(t, d.Allowed, d.String())
				claims = append(claims, d.Claim)
			}
			require.NoError(t, e.lim.Release(ctx, "acme", "a", claims[0]))
			state := keysFor(e.prefix, "acme").state
			ttl, err := e.client.PTTL(ctx, state).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 25*time.Second, "b still runs: its lease keeps the state")
			released := time.Now()
			require.NoError(t, e.lim.Release(ctx, "acme", "b", claims[1]))
			// the start counter (for sluice top) is kept 5 s past the last
			// start; then the hash goes
			deadline := released.Add(10 * time.Second)
			for {
				n := int64(0)
				for _, k := range []string{state, keysFor(e.prefix, GlobalPolicy).state} {
					found, err := e.client.Exists(ctx, k).Result()
					require.NoError(t, err)
					n += found
				}
				if n == 0 {
					break
				}
				require.True(t, time.Now().Before(deadline), "keys still there %s after the last release", time.Since(released))
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s: keys gone %s after the last release", envName(e), time.Since(released).Round(100*time.Millisecond))
		})
	}
}

// An admission whose caller stopped waiting (Redis was frozen) may still
// land; the limiter then gives its slot back under that admission's claim.
// When the job has been admitted again in the meantime (its worker deferred
// it and it came back), the new admission keeps its slot. A worker once
// released such late slots by the job's id, and after a failover a tenant
// ran 3 jobs for its cap of 2.
func TestLateAnswerReleasesOnlyItsOwnClaim(t *testing.T) {
	redistest.SkipOnCluster(t, "freezes a private single server")
	t.Parallel()
	server := redistest.NewServer(t, nil)
	client := server.Client(t)
	e := setupOn(t, client, true, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=1 lease=30s")
	holders := func() []string {
		var ids []string
		for _, h := range stateOf(t, e, "acme").Concurrency.Holders {
			ids = append(ids, h.ID)
		}
		return ids
	}
	abandon := func(id string) {
		t.Helper()
		require.NoError(t, server.Freeze())
		// long enough for the call to reach the frozen server even on a
		// busy machine: a call given up before it was sent never lands
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := e.lim.Admit(cctx, "acme", id)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, server.Thaw())
	}
	eventuallyTrue := func(cond func() bool, what string) {
		t.Helper()
		deadline := time.Now().Add(lateRelease + 3*time.Second)
		for !cond() {
			require.True(t, time.Now().Before(deadline), what)
			time.Sleep(20 * time.Millisecond)
		}
	}

	// the policy is cached and the script loaded, so that the admission
	// itself is what waits
	d, err := e.lim.Admit(ctx, "acme", "warm-up")
	require.NoError(t, err)
	require.NoError(t, e.lim.Release(ctx, "acme", "warm-up", d.Claim))
	require.Empty(t, holders())

	// landed abandons an admission of id until one lands: on a busy
	// machine the call may be given up before it is even sent, and then
	// nothing lands (nor needs giving back)
	landed := func(id string) {
		t.Helper()
		for try := 0; ; try++ {
			abandon(id)
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) {
				if slices.Contains(holders(), id) {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			require.Less(t, try, 5, "the abandoned admission never landed")
			eventuallyTrue(func() bool { return len(holders()) == 0 }, "nothing held between tries")
		}
	}

	// nobody admits the job again: its late slot is given back
	landed("a")
	eventuallyTrue(func() bool { return len(holders()) == 0 }, "the abandoned admission's slot was never given back")

	// the job is admitted again before the late release: it keeps its slot
	landed("b")
	var again Decision
	eventuallyTrue(func() bool {
		d, err := e.lim.Admit(ctx, "acme", "b")
		require.NoError(t, err)
		again = d
		return d.Allowed
	}, "job b was never admitted again")
	time.Sleep(lateRelease + 500*time.Millisecond) // past the late release
	require.Equal(t, []string{"b"}, holders(), "the late release took the new admission's slot")
	require.NoError(t, e.lim.Release(ctx, "acme", "b", again.Claim))
}

// A listing of a tenant's slots removes every stale one, however many: a
// large fleet that died leaves thousands, and the script once passed them
// to one HDEL through Lua's unpack, which refuses about 8,000.
func TestManyStaleSlotsGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, false, nil)
	e.policy(t, "acme", "concurrency=20000 lease=1s")
	state := keysFor(e.prefix, "acme").state
	const n = 9000
	past := e.clock.Now().Add(-time.Second).UnixMicro()
	fields := make([]any, 0, 2*n+4)
	for i := 0; i < n; i++ {
		fields = append(fields, fmt.Sprintf("h:dead%d", i), fmt.Sprintf("%d.%d", past, i+1))
	}
	fields = append(fields, "hc", n, "hm", past)
	require.NoError(t, e.client.HSet(ctx, state, fields...).Err())
	d, err := e.lim.Admit(ctx, "acme", "new")
	require.NoError(t, err)
	require.True(t, d.Allowed, d.String())
	require.Equal(t, int64(1), d.InFlight)
	left, err := e.client.HKeys(ctx, state).Result()
	require.NoError(t, err)
	var slots []string
	for _, f := range left {
		if strings.HasPrefix(f, "h:") {
			slots = append(slots, f)
		}
	}
	require.Equal(t, []string{"h:new"}, slots, "the stale slots are gone")
}
