package throttle

import (
	"context"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestReservationsEvenlySpaced: 10,000 denied jobs get 10,000 distinct
// slots, period/N apart, with no gap and no shared instant; a job coming
// back for its slot starts without being charged again.
func TestReservationsEvenlySpaced(t *testing.T) {
	t.Parallel()
	const jobs = 10_000
	const interval = 10 * time.Millisecond // rate=100/s
	e := setup(t, false, nil)
	e.policy(t, stepTenant, "rate=100/s")
	ctx := context.Background()
	start := e.clock.Now()
	d, err := e.lim.Admit(ctx, stepTenant, "first")
	require.NoError(t, err)
	require.True(t, d.Allowed)

	slots := make([]time.Time, jobs)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < jobs; i += 8 {
				d, err := e.lim.Do(ctx, Request{Tenant: stepTenant, ID: fmt.Sprintf("job-%d", i), Reserve: true})
				switch {
				case err != nil:
					errs <- err
					return
				case d.Allowed || !d.Reserved || d.Rule != "rate[0]" || d.RetryAfter != d.Slot.Sub(start):
					errs <- fmt.Errorf("job %d: decision %+v", i, d)
					return
				}
				slots[i] = d.Slot
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	byTime := make([]int, jobs)
	for i := range byTime {
		byTime[i] = i
	}
	sort.Slice(byTime, func(a, b int) bool { return slots[byTime[a]].Before(slots[byTime[b]]) })
	for k, i := range byTime {
		require.Equal(t, time.Duration(k+1)*interval, slots[i].Sub(start), "slot %d (job %d)", k, i)
	}
	st, err := e.lim.Stats(ctx, stepTenant)
	require.NoError(t, err)
	require.Equal(t, int64(jobs), st.Reservations)
	require.Equal(t, time.Duration(jobs+1)*interval, st.Rates[0].Ahead)

	// jobs come back at their slots, in order: each starts on its
	// reservation; none is charged again (the meter stays where it was)
	for _, k := range []int{0, 1, 2, 500, 9_999} {
		i := byTime[k]
		e.clock.Set(slots[i])
		d, err := e.lim.Admit(ctx, stepTenant, fmt.Sprintf("job-%d", i))
		require.NoError(t, err)
		require.True(t, d.Allowed, "job %d at its slot: %s", i, d)
		st, err := e.lim.Stats(ctx, stepTenant)
		require.NoError(t, err)
		require.Equal(t, start.Add(time.Duration(jobs+1)*interval).Sub(slots[i]), st.Rates[0].Ahead)
	}
	d, err = e.lim.Do(ctx, Request{Tenant: stepTenant, ID: "late", Reserve: true})
	require.NoError(t, err)
	require.Equal(t, time.Duration(jobs+1)*interval, d.Slot.Sub(start))
}

func TestCostError(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "r", "rate=10/s burst=5 rate=100/min burst=50")
	e.policy(t, "w", "window=3/s")
	e.policy(t, "q", "quota=4/day")
	e.policy(t, "qc", `quota=4 reset="0 6 * * *"`)
	e.policy(t, GlobalPolicy, "window=20/s")
	for _, c := range []struct {
		tenant string
		cost   int64
		max    int64
		rule   string
		fix    string // what the message tells the user to change
	}{
		{"r", 6, 5, "r rate[0] (10/s burst 5)", "must fit its burst; give that rate burst=6 or more (rate=10/s burst=6), or split the job into jobs of cost 5 or less"},
		{"w", 4, 3, "w window (3/s)", "must fit its window; raise the window to window=4/s or more, or split the job into jobs of cost 3 or less"},
		{"q", 5, 4, "q quota (4/day)", "must fit its quota; raise the quota to quota=5/day or more, or split the job into jobs of cost 4 or less"},
		{"qc", 5, 4, `qc quota (4 reset="0 6 * * *")`, "must fit its quota; raise the quota to quota=5 or more, or split"},
		{"other", 21, 20, "@global window (20/s)", "must fit its window; raise the window to window=21/s or more"},
	} {
		e.clock.Advance(time.Second)
		// checkCost (queue.Client's, for the jobs it sends on undecided)
		// says so too, deciding nothing
		var ce *CostError
		require.ErrorAs(t, e.lim.checkCost(ctx, Request{Tenant: c.tenant, Cost: c.cost}), &ce, c.tenant)
		require.Equal(t, CostError{Tenant: c.tenant, Cost: c.cost, Max: c.max, Rule: c.rule}, *ce)
		require.NoError(t, e.lim.checkCost(ctx, Request{Tenant: c.tenant, Cost: c.max}))
		_, err := e.lim.Do(ctx, Request{Tenant: c.tenant, ID: "j", Cost: c.cost})
		require.ErrorAs(t, err, &ce, c.tenant)
		require.Equal(t, CostError{Tenant: c.tenant, Cost: c.cost, Max: c.max, Rule: c.rule}, *ce)
		require.Contains(t, err.Error(), fmt.Sprintf("a job of cost %d can never start: %s admits at most %d at once", c.cost, c.rule, c.max))
		require.Contains(t, err.Error(), c.fix)
		// the largest cost that fits is admitted
		d, err := e.lim.Do(ctx, Request{Tenant: c.tenant, ID: "j", Cost: c.max})
		require.NoError(t, err)
		require.True(t, d.Allowed, c.tenant)
	}

	// a pool's rules bound the cost of the jobs that name it
	p := setup(t, false, nil)
	p.policy(t, "@openai", "rate=90000/min burst=20000")
	err := p.lim.checkCost(ctx, Request{Tenant: "acme", Cost: 30000, Pools: []string{"@openai"}})
	require.EqualError(t, err, `tenant "acme": a job of cost 30000 can never start: @openai rate[0] (90000/min burst 20000) admits at most 20000 at once, and a job's cost must fit its burst; give that rate burst=30000 or more (rate=90000/min burst=30000), or split the job into jobs of cost 20000 or less`)
	require.NoError(t, p.lim.checkCost(ctx, Request{Tenant: "acme", Cost: 4000, Pools: []string{"@openai"}}))
}

func TestBadInputs(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "c", "concurrency=2")
	long := strings.Repeat("x", MaxTenantLen+1)
	for _, c := range []struct {
		name string
		call func() error
		want []string
	}{
		{"long tenant", func() error { _, err := e.lim.Admit(ctx, long, "j"); return err }, []string{"257 bytes", "at most 256"}},
		{"default as tenant", func() error { _, err := e.lim.Admit(ctx, "*", "j"); return err }, []string{`"*"`, "reserved"}},
		{"@ name as tenant", func() error { _, err := e.lim.Admit(ctx, "@x", "j"); return err }, []string{`"@x"`, "reserved"}},
		{"@global as tenant", func() error { _, err := e.lim.Admit(ctx, GlobalPolicy, "j"); return err }, []string{`"@global"`, "reserved"}},
		{"not UTF-8", func() error { _, err := e.lim.Admit(ctx, "a\xffb", "j"); return err }, []string{`"a\xffb"`, "UTF-8"}},
		{"empty tenant cooldown", func() error { _, err := e.lim.Cooldown(ctx, "", time.Second); return err }, []string{"empty"}},
		{"empty tenant stats", func() error { _, err := e.lim.Stats(ctx, ""); return err }, []string{"empty"}},
		{"empty tenant line", func() error { _, _, err := e.lim.room().Join(ctx, "", 0, waitroom.Waiter{ID: "j"}); return err }, []string{"empty"}},
		{"empty tenant policy", func() error { return e.store.Set(ctx, "", &Policy{}) }, []string{"empty"}},
		{"long tenant release", func() error { return e.lim.Release(ctx, long, "j", 0) }, []string{"257 bytes"}},
		{"long tenant renew", func() error { return e.lim.Renew(ctx, long, "j", 0) }, []string{"257 bytes"}},
	} {
		err := c.call()
		require.ErrorIs(t, err, ErrInvalidTenant, c.name)
		for _, w := range c.want {
			require.Contains(t, err.Error(), w, c.name)
		}
	}
	for _, c := range []struct {
		name string
		call func() error
		want []string
	}{
		{"negative cost", func() error { _, err := e.lim.Do(ctx, Request{Tenant: "t", ID: "j", Cost: -3}); return err }, []string{"cost -3"}},
		{"reserve negative cost", func() error { _, err := e.lim.Reserve(ctx, Request{Tenant: "t", ID: "j", Cost: -1}); return err }, []string{"cost -1"}},
		{"no id with concurrency", func() error { _, err := e.lim.Admit(ctx, "c", ""); return err }, []string{`"c"`, "concurrency", "id"}},
		{"no id to reserve", func() error { _, err := e.lim.Reserve(ctx, Request{Tenant: "t"}); return err }, []string{"id"}},
		{"cooldown of 0", func() error { _, err := e.lim.Cooldown(ctx, "t", 0); return err }, []string{`"t"`, "0s", "positive"}},
	} {
		err := c.call()
		require.Error(t, err, c.name)
		for _, w := range c.want {
			require.Contains(t, err.Error(), w, c.name)
		}
	}
	// a job without a tenant follows @global only; with no @global it starts
	d, err := e.lim.Admit(ctx, "", "j")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	// 256 bytes is fine
	d, err = e.lim.Admit(ctx, long[1:], "j")
	require.NoError(t, err)
	require.True(t, d.Allowed)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	client := setup(t, false, nil).client
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Prefix: "a{b"}, `"a{b"`},
		{Config{Horizon: 500 * time.Millisecond}, "Horizon 500ms"},
		{Config{Grace: 10 * time.Millisecond}, "Grace 10ms"},
		{Config{MaxBatch: 20_000}, "MaxBatch 20000"},
		{Config{Pipelines: -1}, "Pipelines -1"},
		{Config{ConcurrencyRetry: time.Microsecond}, "ConcurrencyRetry 1µs"},
	} {
		_, err := NewLimiter(client, &c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	_, err := NewLimiter(nil, nil)
	require.Error(t, err)
	_, err = newPolicyStore(client, &storeConfig{Prefix: "x}"})
	require.ErrorContains(t, err, `"x}"`)
}

// snapshot is every key under the test's prefix with its DUMP, from every
// master of a Cluster.
func snapshot(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	out := map[string]string{}
	err := redistest.ForEachMaster(ctx, e.client, func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, e.prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			v, err := node.Dump(ctx, k).Result()
			if err != nil {
				return fmt.Errorf("DUMP %s: %w", k, err)
			}
			mu.Lock()
			out[k] = v
			mu.Unlock()
		}
		return iter.Err()
	})
	require.NoError(t, err)
	return out
}

// TestAllOrNothing: a denied job changes nothing, in any rule, of its
// tenant or of @global: every key is byte-identical before and after.
func TestAllOrNothing(t *testing.T) {
	t.Parallel()
	type op struct {
		tenant, id string
		cost       int64
		reserve    bool
		cooldown   time.Duration
	}
	for _, c := range []struct {
		name     string
		policies map[string]string
		before   []op
		deny     op
		rule     string
		policy   string
	}{
		{"rate denies", map[string]string{"acme": "rate=1/min window=10/min quota=10/hour concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "rate[0]", "acme"},
		{"window denies", map[string]string{"acme": "rate=100/s burst=10 window=1/min quota=10/hour concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "window", "acme"},
		{"quota denies", map[string]string{"acme": "rate=100/s burst=10 window=10/min quota=1/hour concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "quota", "acme"},
		{"cost over what is left", map[string]string{"acme": "rate=10/min burst=5 window=10/min quota=3/hour"},
			[]op{{tenant: "acme", id: "a", cost: 2}}, op{tenant: "acme", id: "b", cost: 2}, "quota", "acme"},
		{"concurrency full, rates allow", map[string]string{"acme": "rate=100/s burst=10 window=10/min quota=10/hour concurrency=1"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "concurrency", "acme"},
		{"rates deny, concurrency allows", map[string]string{"acme": "rate=1/min rate=100/min burst=5 concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "rate[0]", "acme"},
		{"@global denies on top of tenant", map[string]string{
			"acme": "rate=100/s burst=10 window=10/min quota=10/hour concurrency=5", GlobalPolicy: "rate=1/min window=10/min"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "rate[0]", GlobalPolicy},
		{"@global concurrency full", map[string]string{
			"acme": "rate=100/s burst=10 window=10/min quota=10/hour concurrency=5", GlobalPolicy: "rate=100/s burst=10 concurrency=1"},
			[]op{{tenant: "other", id: "a"}}, op{tenant: "acme", id: "b"}, "concurrency", GlobalPolicy},
		{"tenant denies under @global", map[string]string{
			"acme": "rate=1/min", GlobalPolicy: "rate=100/s burst=10 window=10/min quota=10/hour concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "rate[0]", "acme"},
		{"default policy and @global", map[string]string{
			"*": "window=2/min concurrency=3", GlobalPolicy: "rate=100/s burst=10 quota=10/hour"},
			[]op{{tenant: "x", id: "a"}, {tenant: "x", id: "b"}}, op{tenant: "x", id: "c"}, "window", "*"},
		{"cooldown", map[string]string{"acme": "rate=100/s burst=10 window=10/min concurrency=5", GlobalPolicy: "window=10/min"},
			[]op{{tenant: "acme", id: "a"}, {tenant: "acme", cooldown: time.Minute}}, op{tenant: "acme", id: "b"}, "cooldown", "acme"},
		{"own slot not due", map[string]string{"acme": "rate=1/min window=10/min quota=10/hour concurrency=5", GlobalPolicy: "rate=100/s burst=10"},
			[]op{{tenant: "acme", id: "a"}, {tenant: "acme", id: "b", reserve: true}}, op{tenant: "acme", id: "b"}, "reserved", "acme"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, false, nil)
			ctx := context.Background()
			for name, text := range c.policies {
				e.policy(t, name, text)
			}
			for _, o := range c.before {
				if o.cooldown > 0 {
					_, err := e.lim.Cooldown(ctx, o.tenant, o.cooldown)
					require.NoError(t, err)
					continue
				}
				_, err := e.lim.Do(ctx, Request{Tenant: o.tenant, ID: o.id, Cost: o.cost, Reserve: o.reserve})
				require.NoError(t, err)
			}
			e.clock.Advance(time.Millisecond)
			before := snapshot(t, e)
			require.NotEmpty(t, before)
			tenantState := stateOf(t, e, c.deny.tenant)
			d, err := e.lim.Do(ctx, Request{Tenant: c.deny.tenant, ID: c.deny.id, Cost: c.deny.cost})
			require.NoError(t, err)
			require.False(t, d.Allowed, d.String())
			require.Equal(t, c.rule, d.Rule)
			require.Equal(t, c.policy, d.Policy)
			after := snapshot(t, e)
			if e.lim.cluster && d.Policy == GlobalPolicy {
				// On a Cluster the tenant was charged, then its charge
				// undone (split.go): its keys keep some bookkeeping, its
				// state is what it was. TestClusterAllOrNothing compares it
				// with a single server's.
				require.Equal(t, tenantState, stateOf(t, e, c.deny.tenant), "the undo left the tenant's state changed")
				for _, k := range keysFor(e.prefix, c.deny.tenant).all() {
					delete(before, k)
					delete(after, k)
				}
			}
			require.Equal(t, before, after, "a denial wrote to Redis")
			before = snapshot(t, e)
			// a dry run writes nothing either, allowed or not
			for _, tenant := range []string{c.deny.tenant, "fresh"} {
				_, err = e.lim.Do(ctx, Request{Tenant: tenant, ID: "dry", DryRun: true, Reserve: true})
				require.NoError(t, err)
				require.Equal(t, before, snapshot(t, e), "a dry run wrote to Redis")
			}
		})
	}
}

// crc16 is the CRC-16/XMODEM Redis Cluster hashes keys with.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for i := 0; i < 8; i++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// clusterTag is the part of a key Redis Cluster hashes: the text between
// the first { and the next }, when not empty; otherwise the whole key.
func clusterTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

func keySlot(key string) uint16 { return crc16([]byte(clusterTag(key))) % 16384 }

func TestKeySlot(t *testing.T) {
	t.Parallel()
	// the reference values of the Redis Cluster specification
	require.Equal(t, uint16(0x31C3), crc16([]byte("123456789")))
	require.Equal(t, keySlot("{user1000}.following"), keySlot("{user1000}.followers"))
	require.Equal(t, "user1000", clusterTag("foo{user1000}bar{x}"))
	require.Equal(t, "foo{}{bar}", clusterTag("foo{}{bar}"))
	require.Equal(t, uint16(12182), keySlot("foo"))
}

// TestTenantKeys: awkward tenant names get distinct keys, all keys of one
// tenant hash to one Cluster slot, and the tenants' states are independent.
func TestTenantKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	e.clock.Set(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC))
	ctx := context.Background()
	e.policy(t, DefaultPolicy, "rate=1/min window=5/min quota=10/day concurrency=2")
	tenants := []string{"a{b}", "}x{", "x:y", "ünï code", "a b", "%7B", "{", "a%7Bb%7D", "a%20b", "g", "t:g", "p", "x", "a\u00a0b", "a\u200bb"}
	owner := map[string]string{} // key -> tenant
	tags := map[string]string{}  // hash tag -> tenant
	for _, tenant := range tenants {
		keys := keysFor(e.prefix, tenant)
		tag := clusterTag(keys.state)
		require.NotContains(t, tags, tag, "tenant %q shares its hash tag with %q", tenant, tags[tag])
		tags[tag] = tenant
		slot := keySlot(keys.state)
		for _, k := range keys.all() {
			require.NotContains(t, owner, k, "tenant %q shares key %q with %q", tenant, k, owner[k])
			owner[k] = tenant
			require.Equal(t, tag, clusterTag(k), k)
			require.Equal(t, slot, keySlot(k), k)
		}
	}
	require.NotContains(t, tags, clusterTag(keysFor(e.prefix, GlobalPolicy).state))
	require.NotContains(t, tags, clusterTag(policiesKey(e.prefix)))

	// every tenant's first job starts and its second is denied: no tenant
	// sees another's state
	for _, tenant := range tenants {
		d, err := e.lim.Admit(ctx, tenant, "j1")
		require.NoError(t, err)
		require.True(t, d.Allowed, tenant)
		d, err = e.lim.Do(ctx, Request{Tenant: tenant, ID: "j2", Reserve: true})
		require.NoError(t, err)
		require.Equal(t, "rate[0]", d.Rule, tenant)
		require.True(t, d.Reserved, tenant)
		st, err := e.lim.Stats(ctx, tenant)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.Concurrency.InFlight, tenant)
		require.Equal(t, int64(2), st.Quota.Used, tenant)
	}
	// what was written is exactly the keys built for the tenants (and the
	// policy store's), every tenant's in one slot
	written := snapshot(t, e)
	slots := map[string]uint16{}
	for k := range written {
		if clusterTag(k) == clusterTag(policiesKey(e.prefix)) {
			continue
		}
		tenant, ok := owner[k]
		require.True(t, ok, "key %q belongs to no tenant", k)
		if s, seen := slots[tenant]; seen {
			require.Equal(t, s, keySlot(k), k)
		}
		slots[tenant] = keySlot(k)
	}
	require.Len(t, slots, len(tenants))
	for _, tenant := range tenants {
		keys := keysFor(e.prefix, tenant)
		for _, k := range []string{keys.state, keys.planned, keys.started} {
			require.Contains(t, written, k, tenant)
		}
	}

	// a tenant of 257 bytes is refused and writes nothing
	_, err := e.lim.Admit(ctx, strings.Repeat("é", 128)+"x", "j")
	require.ErrorIs(t, err, ErrInvalidTenant)
	_, err = e.lim.Cooldown(ctx, strings.Repeat("y", 257), time.Second)
	require.ErrorIs(t, err, ErrInvalidTenant)
	require.Equal(t, written, snapshot(t, e))
}

func TestEscapeTenant(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"acme":     "acme",
		"a{b}":     "a%7Bb%7D",
		"}x{":      "%7Dx%7B",
		"x:y":      "x%3Ay",
		"ünï code": "ünï%20code",
		"%7B":      "%257B",
		"a\tb\r\n": "a%09b%0D%0A",
	} {
		require.Equal(t, want, escapeTenant(in), in)
	}
}
