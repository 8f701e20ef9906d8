package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/blocks"
	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/waitroom"
)

// modelMix is one randomised scenario: the policies in force and how time moves.
type modelMix struct {
	name     string
	policies map[string]string
	tenants  []string
	// change, when set, replaces policies half way through.
	change map[string]string
	// maxStep is the longest single advance of the clock.
	maxStep time.Duration
	// pools, when set, are shared pools (their policies in policies): a
	// third of the jobs name none, a third the first, a third all of them
	pools []string
	// keys, when set, are keys below the tenants (their policies
	// TENANT/KEY, TENANT/* and */* in policies): a job of a tenant has
	// none or one of them, by its id
	keys []string
}

var modelMixes = []modelMix{
	{
		name:     "rate",
		policies: map[string]string{"a": "rate=10/s burst=3"},
		tenants:  []string{"a"},
		maxStep:  20 * time.Second,
	},
	{
		name:     "rates+window",
		policies: map[string]string{"a": "rate=5/s burst=2 rate=150/min burst=4 window=8/2s"},
		tenants:  []string{"a"},
		maxStep:  3 * time.Second,
	},
	{
		// the common case: one scope, rates and concurrency only
		name: "rates+concurrency",
		policies: map[string]string{
			"a": "rate=8/s burst=3 rate=100/min burst=5 concurrency=3 lease=1s",
			"b": "concurrency=2 lease=2s",
		},
		tenants: []string{"a", "b"},
		maxStep: 20 * time.Second,
	},
	{
		// admit.lua's quick path: one scope, at most one rate, concurrency
		name: "rate+concurrency",
		policies: map[string]string{
			"a": "rate=8/s burst=3 concurrency=2 lease=1s",
			"b": "concurrency=1 lease=2s",
			"c": "rate=20/s burst=5 concurrency=4 lease=1s",
		},
		tenants: []string{"a", "b", "c"},
		change: map[string]string{
			"a": "rate=12/s burst=2 concurrency=3 lease=1s",
			"c": "rate=20/s burst=5",
		},
		maxStep: 5 * time.Second,
	},
	{
		name:     "window+concurrency",
		policies: map[string]string{"a": "window=5/s concurrency=2 lease=2s"},
		tenants:  []string{"a"},
		maxStep:  1500 * time.Millisecond,
	},
	{
		name:     "quota+rate across hours",
		policies: map[string]string{"a": "rate=50/min burst=5 quota=30/hour tz=America/Los_Angeles"},
		tenants:  []string{"a"},
		maxStep:  10 * time.Minute,
	},
	{
		name:     "cron quota",
		policies: map[string]string{"a": `rate=2/s burst=3 quota=25 reset="*/2 * * * *"`},
		tenants:  []string{"a"},
		maxStep:  5 * time.Minute,
	},
	{
		name: "default+global+tenants",
		policies: map[string]string{
			"*":       "rate=3/s burst=2 concurrency=3 lease=1s",
			"@global": "rate=8/s burst=4 window=20/5s",
			"b":       "rate=6/s burst=3 quota=40/hour",
		},
		tenants: []string{"a", "b", "c"},
		change: map[string]string{
			"*":       "rate=5/s burst=2 concurrency=2 lease=1s",
			"@global": "rate=6/s burst=4 concurrency=4 lease=2s",
			"b":       "rate=6/s burst=3",
		},
		maxStep: 2 * time.Second,
	},
	{
		// @global with every rule kind over tenants of every kind, the
		// two-step admission's whole surface on a Cluster
		name: "global with every rule",
		policies: map[string]string{
			"@global": `rate=12/s burst=4 window=10/s quota=200 reset="*/3 * * * *" concurrency=3 lease=1s`,
			"*":       "rate=4/s burst=2 concurrency=2 lease=2s",
			"b":       "window=4/s quota=40/hour",
			"c":       "rate=30/s burst=6 rate=100/min burst=8",
			"d":       "concurrency=1 lease=1s",
		},
		tenants: []string{"a", "b", "c", "d", ""},
		change: map[string]string{
			"@global": `rate=8/s burst=3 window=6/s quota=120 reset="*/3 * * * *" concurrency=2 lease=2s`,
			"b":       "window=3/s quota=30/hour concurrency=2 lease=1s",
		},
		maxStep: 3 * time.Second,
	},
	{
		// shared pools over tenants and @global: every job is decided in
		// its tenant's, @global's and its pools' scopes at once (on a
		// Cluster, @global and the pools as one side of the two steps)
		name: "pools",
		policies: map[string]string{
			"a":       "rate=10/s burst=3 concurrency=3 lease=1s",
			"b":       "window=6/s",
			"@global": "rate=20/s burst=6",
			"@p1":     "rate=6/s burst=2 concurrency=2 lease=1s",
			"@p2":     "rate=4/s burst=3 window=5/2s quota=60/hour",
		},
		tenants: []string{"a", "b", ""},
		pools:   []string{"@p1", "@p2"},
		change: map[string]string{
			"@p1": "rate=3/s burst=2 concurrency=1 lease=2s",
			"@p2": "window=4/s",
		},
		maxStep: 2 * time.Second,
	},
	{
		// keys below tenants with their tenants, @global and a pool: every
		// job is decided in its tenant's, its key's, @global's and its
		// pools' scopes at once (on a Cluster, the tenant and its key as
		// one side of the two steps, @global and the pool as the other)
		name: "keys",
		policies: map[string]string{
			"a":       "rate=10/s burst=4 concurrency=3 lease=1s",
			"a/*":     "rate=4/s burst=2 concurrency=1 lease=1s",
			"a/k2":    "window=3/s quota=40/hour",
			"*/*":     "rate=3/s burst=2",
			"@global": "rate=20/s burst=6",
			"@p1":     "rate=6/s burst=2 concurrency=2 lease=1s",
		},
		tenants: []string{"a", "b", ""},
		keys:    []string{"k1", "k2"},
		pools:   []string{"@p1"},
		change: map[string]string{
			"a/*":  "window=3/2s concurrency=2 lease=2s",
			"a/k2": "rate=2/s burst=2",
		},
		maxStep: 2 * time.Second,
	},
	{
		name:     "no policy, global only",
		policies: map[string]string{"@global": "rate=4/s burst=2 concurrency=2 lease=1s"},
		tenants:  []string{"", "a"},
		maxStep:  time.Second,
	},
	{
		// roomy policies: blocks of starts and slots (block.lua) among
		// single decisions
		name: "blocks",
		policies: map[string]string{
			"a": "rate=50/s burst=40 concurrency=12 lease=1s",
			"b": "rate=30/s burst=20 rate=900/min burst=200",
			"c": "concurrency=16 lease=2s",
		},
		tenants: []string{"a", "b", "c"},
		change: map[string]string{
			"a": "rate=20/s burst=30 concurrency=8 lease=1s",
		},
		maxStep: 3 * time.Second,
	},
}

// TestModel drives admit.lua and the Go reference model with the same random
// sequences (over 10,000 steps in all) and requires identical decisions.
func TestModel(t *testing.T) {
	steps := 2000
	if testing.Short() {
		steps = 600
	}
	for i, mix := range modelMixes {
		t.Run(mix.name, func(t *testing.T) {
			t.Parallel()
			runModel(t, mix, uint64(i+1), steps, false)
		})
	}
}

// runModel runs one scenario. With expire set, keys of the tenant are
// deleted as soon as their TTL (counted on the fake clock) runs out, which
// must not change any decision either.
func runModel(t *testing.T, mix modelMix, seed uint64, steps int, expire bool) (deleted int) {
	return runModelOn(t, []*env{setup(t, false, modelConfig)}, mix, seed, steps, expire, false)
}

var modelConfig = &Config{Horizon: 30 * time.Second, Grace: 2 * time.Second}

// runModelOn runs one scenario on several limiters side by side (a single
// server and a Cluster, say), each with its own reference model: every
// limiter must reach the model's decisions, and so each other's. With
// sameState, every limiter's keys must also hold the same state after
// every step.
func runModelOn(t *testing.T, envs []*env, mix modelMix, seed uint64, steps int, expire, sameState bool) (deleted int) {
	ctx := context.Background()
	models := make([]*model, len(envs))
	expiries := make([]map[string]time.Time, len(envs)) // fake-clock time each key dies at
	poolsOf := func(id string) []string {
		if len(mix.pools) == 0 {
			return nil
		}
		var n int
		fmt.Sscanf(id, "job-%d", &n)
		switch n % 3 {
		case 1:
			return mix.pools[:1]
		case 2:
			return mix.pools
		}
		return nil
	}
	keyOf := func(tenant, id string) string {
		if len(mix.keys) == 0 || tenant == "" {
			return ""
		}
		var n int
		fmt.Sscanf(id, "job-%d", &n)
		if n%4 == 0 {
			return ""
		}
		return mix.keys[n%len(mix.keys)]
	}
	for i, e := range envs {
		e.lim.noExpire = !expire
		models[i] = newModel(e.lim.cfg)
		models[i].jobPools = poolsOf
		models[i].jobKey = keyOf
		expiries[i] = map[string]time.Time{}
	}
	apply := func(policies map[string]string) {
		for name, text := range policies {
			p, err := ParsePolicy(text)
			require.NoError(t, err)
			for i, e := range envs {
				require.NoError(t, e.store.Set(ctx, name, p))
				models[i].policies[name] = p
			}
		}
	}
	apply(mix.policies)
	rng := rand.New(rand.NewPCG(seed, 42))
	settleRng := rand.New(rand.NewPCG(seed, 43))
	blockRng := rand.New(rand.NewPCG(seed, 44))
	type openBlock struct {
		g  *blocks.Grant
		mb *modelBlock
	}
	open := make([][]openBlock, len(envs)) // blocks granted, per limiter
	ids := make([]string, 24)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%d", i)
	}
	var tally [6]int
	// the decisions that started jobs, per limiter, for their settlement
	type started struct {
		d    Decision
		cost int64
	}
	decided := make([]map[string]started, len(envs))
	for i := range decided {
		decided[i] = map[string]started{}
	}
	for step := 0; step < steps; step++ {
		if mix.change != nil && step == steps/2 {
			apply(mix.change)
		}
		// advance the clock
		var advance time.Duration
		switch r := rng.IntN(100); {
		case r < 20:
		case r < 70:
			advance = time.Duration(rng.IntN(50_000)) * time.Microsecond
		case r < 95:
			advance = time.Duration(50_000+rng.IntN(450_000)) * time.Microsecond
		default:
			advance = time.Duration(rng.Int64N(int64(mix.maxStep)))
		}
		for i, e := range envs {
			e.clock.Advance(advance)
			if expire {
				n := expireKeys(t, e, expiries[i], e.clock.Now())
				if i == 0 {
					deleted += n
				}
			}
		}
		now := envs[0].clock.Now()
		// real time when the step's scripts begin: a TTL read later has
		// run down by the real time since (recordExpiries)
		began := time.Now()
		tenant := mix.tenants[rng.IntN(len(mix.tenants))]
		id := ids[rng.IntN(len(ids))]
		where := fmt.Sprintf("%s step %d at +%s tenant %q job %s", mix.name, step, now.Sub(time.Unix(0, 0)).Truncate(time.Millisecond), tenant, id)
		op := rng.IntN(100)
		switch {
		case op < 70:
			cost := int64(1)
			if rng.IntN(4) == 0 {
				cost = 2
			}
			flags := flagHold
			req := Request{Tenant: tenant, ID: id, Cost: cost, Pools: poolsOf(id), Key: keyOf(tenant, id)}
			if rng.IntN(10) < 6 {
				req.Reserve = true
				flags |= flagReserve
			}
			if rng.IntN(20) == 0 {
				req.DryRun = true
				flags |= flagDry
			}
			plan := rng.IntN(10) == 0
			if plan {
				flags = flagReserve | flagPlan
			}
			var first Decision
			for i, e := range envs {
				var got Decision
				var err error
				if plan {
					got, err = e.lim.Reserve(ctx, Request{Tenant: tenant, ID: id, Cost: cost, Pools: poolsOf(id), Key: keyOf(tenant, id)})
				} else {
					got, err = e.lim.Do(ctx, req)
				}
				lane := fmt.Sprintf("%s (limiter %d of %d)", where, i+1, len(envs))
				require.NoError(t, err, lane)
				require.Equal(t, got.Allowed, got.RetryAfter == -1, lane+": RetryAfter is -1 exactly when allowed")
				want := models[i].admitOn(e.lim.cluster, now.UnixMicro(), tenant, id, cost, flags)
				requireSameDecision(t, want, got, lane)
				if got.Allowed && !plan && !req.DryRun {
					decided[i][tenant+"/"+id] = started{got, cost}
				}
				if i == 0 {
					first = got
				} else {
					requireSameDecision(t, decisionOf(first), got, lane+": differs from limiter 1")
				}
			}
			tally[0]++
			if first.Allowed {
				tally[1]++
			}
			if first.Reserved {
				tally[2]++
			}
		case op < 85:
			for i, e := range envs {
				require.NoError(t, e.lim.Release(ctx, tenant, id, 0), where)
				require.NoError(t, e.lim.releaseBelow(ctx, tenant, id, 0, waitroom.Scopes{Pools: poolsOf(id), Key: keyOf(tenant, id)}, true), where)
				models[i].release(tenant, id)
			}
		case op < 97:
			for i, e := range envs {
				err := e.lim.renewAll(ctx, []jobpath.Held{{Tenant: tenant, ID: id, Pools: poolsOf(id), Key: keyOf(tenant, id)}})[0]
				if !errors.Is(err, ErrClaimLost) {
					require.NoError(t, err, where)
				}
				require.Equal(t, models[i].renew(now.UnixMicro(), tenant, id), err == nil, "renew: "+where)
			}
		default:
			if tenant == "" {
				continue
			}
			d := time.Duration(rng.IntN(3000)) * time.Millisecond
			if d == 0 {
				d = time.Millisecond
			}
			for i, e := range envs {
				until, err := e.lim.Cooldown(ctx, tenant, d)
				require.NoError(t, err, where)
				require.Equal(t, models[i].cooldown(now.UnixMicro(), tenant, micros(d)), until.UnixMicro(), "cooldown: "+where)
			}
			tally[3]++
		}
		// blocks (drawn from a generator of their own, as settlements):
		// a grant, or an open block's return or renewal
		if tenant != "" && blockRng.IntN(100) < 12 {
			switch k := blockRng.IntN(10); {
			case k < 5 || len(open[0]) == 0:
				want, kwant := 1+blockRng.Int64N(40), blockRng.IntN(6)
				vmax := time.Duration(5+blockRng.IntN(200)) * time.Millisecond
				for i, e := range envs {
					e.lim.blockID = func() string { return fmt.Sprint("s", step) }
					r, err := e.lim.Policies().policiesFor(ctx, tenant)
					require.NoError(t, err, where)
					g, err := blocks.Of(e.lim).Grant(ctx, blocks.Want{Tenant: tenant, Policies: &r, Starts: want, Slots: kwant, Window: vmax})
					mb, v, ok := models[i].grantBlock(now.UnixMicro(), tenant, fmt.Sprint("s", step), want, kwant, micros(vmax))
					if !ok {
						require.ErrorIs(t, err, blocks.ErrNoBlock, where+": block")
						continue
					}
					require.NoError(t, err, where+": block")
					require.Equal(t, [3]int64{mb.n, v, int64(mb.slots)}, [3]int64{g.Starts, micros(g.Window), int64(g.Slots)}, where+": block's starts, window and slots")
					open[i] = append(open[i], openBlock{g, mb})
					if i == 0 {
						tally[5]++
					}
				}
			case k < 8:
				j := blockRng.IntN(len(open[0]))
				unused := blockRng.Int64N(open[0][j].mb.n + 1)
				last := open[0][j].g.At.Add(time.Duration(blockRng.Int64N(int64(open[0][j].g.Window) + 1)))
				for i, e := range envs {
					b := open[i][j]
					require.NoError(t, blocks.Of(e.lim).Return(ctx, b.g, unused, last), where+": block's return")
					models[i].returnBlock(b.mb, unused, last.UnixMicro())
					open[i] = slices.Delete(open[i], j, j+1)
				}
			default:
				j := blockRng.IntN(len(open[0]))
				for i, e := range envs {
					n, err := blocks.Of(e.lim).Renew(ctx, open[i][j].g)
					require.NoError(t, err, where+": block's renewal")
					require.Equal(t, models[i].renewBlock(now.UnixMicro(), open[i][j].mb), n, where+": block's renewal")
				}
			}
		}
		// the job ran and reports its actual cost: settled before or after
		// other jobs' charges, cheaper or dearer (drawn from a generator of
		// its own, so that the other steps' sequence is unchanged)
		settled := false
		if settleRng.IntN(100) < 12 {
			actual := settleRng.Int64N(6)
			if expire {
				// the op's expiries first: a release's shortens the hash's
				// life, a settlement's (like an admission's) only extends
				for i, e := range envs {
					recordExpiries(t, e, expiries[i], now, began, tenant, op >= 70 && op < 85, scopesBelow(tenant, mix)...)
				}
				settled = true
			}
			for i, e := range envs {
				s, ok := decided[i][tenant+"/"+id]
				require.Equal(t, ok, models[i].settle(now.UnixMicro(), tenant, id, actual), where+": the model and the limiter agree whether the job started")
				if !ok {
					continue
				}
				delete(decided[i], tenant+"/"+id)
				require.NoError(t, e.lim.Settle(ctx, Request{Tenant: tenant, ID: id, Cost: s.cost, Pools: poolsOf(id), Key: keyOf(tenant, id)}, s.d, actual), where+": settle")
				if i == 0 {
					tally[4]++
				}
			}
		}
		for i, e := range envs {
			// the state every limiter reports is the model's
			if tenant != "" {
				requireStatsMatch(t, models[i], e, tenant, now.UnixMicro(), where)
			}
			if models[i].policies[GlobalPolicy].HasRules() {
				requireStatsMatch(t, models[i], e, GlobalPolicy, now.UnixMicro(), where)
			}
			for _, p := range mix.pools {
				if models[i].policies[p].HasRules() {
					requireStatsMatch(t, models[i], e, p, now.UnixMicro(), where)
				}
			}
			if k := keyOf(tenant, id); k != "" {
				if _, p := models[i].keyPolicy(tenant, k); p.HasRules() {
					requireStatsMatch(t, models[i], e, tenant+"/"+k, now.UnixMicro(), where)
				}
			}
			if expire {
				// a release is the one script that shortens a key's life
				recordExpiries(t, e, expiries[i], now, began, tenant, op >= 70 && op < 85 && !settled, scopesBelow(tenant, mix)...)
			} else {
				// no script set a TTL, which real time (slower or faster
				// than the fake clock) could run out
				requireNoTTL(t, e, where, tenant, scopesBelow(tenant, mix)...)
			}
		}
		if sameState {
			requireSameState(t, envs, tenant, where)
		}
	}
	t.Logf("%s: %d decisions, %d allowed, %d reserved, %d cooldowns, %d settlements, %d blocks", mix.name, tally[0], tally[1], tally[2], tally[3], tally[4], tally[5])
	// the sequence must have exercised both outcomes
	require.Greater(t, tally[1], tally[0]/20, "too few admissions to mean anything")
	require.Greater(t, tally[0]-tally[1], tally[0]/20, "too few denials to mean anything")
	return deleted
}

func requireSameDecision(t *testing.T, want modelDecision, got Decision, where string) {
	t.Helper()
	gotRetry := int64(-1)
	if !got.Allowed {
		gotRetry = got.RetryAfter.Microseconds()
	}
	var gotSlot int64
	if got.Reserved {
		gotSlot = got.Slot.UnixMicro()
	}
	gotReset := int64(-1)
	if got.ResetAfter >= 0 {
		gotReset = got.ResetAfter.Microseconds()
	}
	wantS := fmt.Sprintf("allowed=%v retry=%d rule=%q policy=%q remaining=%d reset=%d inflight=%d slot=%d",
		want.allowed, want.retry, want.rule, want.policy, want.remaining, want.reset, want.inflight, want.slot)
	gotS := fmt.Sprintf("allowed=%v retry=%d rule=%q policy=%q remaining=%d reset=%d inflight=%d slot=%d",
		got.Allowed, gotRetry, got.Rule, got.Policy, got.Remaining, gotReset, got.InFlight, gotSlot)
	require.Equal(t, wantS, gotS, where)
}

// scopesBelow are the scopes of a tenant's jobs besides its own and
// @global's in mix: the pools, and the tenant's keys.
func scopesBelow(tenant string, mix modelMix) []string {
	out := append([]string(nil), mix.pools...)
	if tenant != "" {
		for _, k := range mix.keys {
			out = append(out, tenant+"/"+k)
		}
	}
	return out
}

// recordExpiries notes, on the fake clock, when each key of the tenant (and
// @global) expires given the TTL the script just set, then removes the TTL
// so that real time (which the fake clock outruns or lags) never deletes a
// key: expireKeys does it at the fake-clock moment instead. Like Redis, a
// later, shorter TTL does not shorten a longer one the script set before,
// except after a release (shorten), which sets a hash's TTL outright.
// A TTL read has run down by the real time since the script set it, at
// most the time since began (the step's first script): that time is added
// back, so a slow machine (the race detector, a Cluster's round trips, one
// read per key) never makes a key die earlier than its script said.
func recordExpiries(t *testing.T, e *env, expiries map[string]time.Time, now, began time.Time, tenant string, shorten bool, pools ...string) {
	ctx := context.Background()
	var keys []string
	for _, s := range append([]string{tenant, GlobalPolicy}, pools...) {
		if s != "" {
			keys = append(keys, keysFor(e.prefix, s).admitKeys()...)
		}
	}
	for _, k := range keys {
		ttl, err := e.client.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if ttl > 0 {
			if at := now.Add(ttl + time.Since(began) + 5*time.Millisecond); at.After(expiries[k]) || shorten {
				expiries[k] = at
			}
			require.NoError(t, e.client.Persist(ctx, k).Err())
		}
	}
}

// requireNoTTL checks that the keys of tenant, @global and pools have no
// TTL: with noExpire no script sets one (renew.lua and cooldown.lua
// included), so a slow machine's real time cannot end a key's life while
// the fake clock stands.
func requireNoTTL(t *testing.T, e *env, where string, tenant string, pools ...string) {
	ctx := context.Background()
	for _, s := range append([]string{tenant, GlobalPolicy}, pools...) {
		if s != "" {
			for _, k := range keysFor(e.prefix, s).admitKeys() {
				d, err := e.client.PTTL(ctx, k).Result()
				require.NoError(t, err)
				require.Less(t, d, time.Duration(0), "%s: %s has a TTL", where, k)
			}
		}
	}
}

// expireKeys deletes every key whose fake-clock expiry has passed.
func expireKeys(t *testing.T, e *env, expiries map[string]time.Time, now time.Time) int {
	n := 0
	for k, at := range expiries {
		if !at.After(now) {
			require.NoError(t, e.client.Del(context.Background(), k).Err())
			delete(expiries, k)
			n++
		}
	}
	return n
}

// TestModelWithExpiry runs the scenarios again, deleting each key the moment
// its TTL runs out: decisions must stay identical to the model (which never
// forgets anything), so correctness never depends on a key's lifetime, and
// keys do go away.
func TestModelWithExpiry(t *testing.T) {
	steps := 1000
	if testing.Short() {
		steps = 600
	}
	for i, mix := range modelMixes {
		t.Run(mix.name, func(t *testing.T) {
			t.Parallel()
			deleted := runModel(t, mix, uint64(100+i), steps, true)
			require.Positive(t, deleted, "no key ever expired: the test would not notice a TTL that is too short")
		})
	}
}

// requireStatsMatch requires the limiter's Stats of scope (a tenant or
// @global) to be the model's state: both meters of every rate, the window's
// entries, the quota's counts, the running jobs (each one a job answered
// Allowed and not released since), the reservations, the cooldown, and no
// leftover charge.
func requireStatsMatch(t *testing.T, m *model, e *env, scope string, now int64, where string) {
	t.Helper()
	st, err := e.lim.Stats(context.Background(), scope)
	require.NoError(t, err, where)
	where = fmt.Sprintf("%s: Stats of %s", where, scope)
	p := m.policies[GlobalPolicy]
	if t, k, ok := strings.Cut(scope, "/"); ok {
		_, p = m.keyPolicy(t, k)
	} else if scope != GlobalPolicy {
		p = m.resolve(scope, "")[0].policy
	}
	ms := m.scope(scope)
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	require.Len(t, st.Rates, len(p.Rates), where)
	for i, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		var planned, started int64
		if i < len(ms.planned) {
			planned, started = ms.meters(i, unit, now)
		}
		tat := max(planned, started, now)
		want := RateStats{Rule: ruleName(kindRate, int64(i+1)), Rate: r, Available: max((now+off-tat)/unit, 0),
			Ahead: us(max(planned, now) - now), StartedAhead: us(max(started, now) - now)}
		require.Equal(t, want, st.Rates[i], where)
	}
	if w := p.Window; w != nil {
		d := micros(w.Period)
		require.Equal(t, &WindowStats{Window: *w, Started: countAfter(ms.startedLog, now-d), Planned: countAfter(ms.plannedLog, now-d)}, st.Window, where)
	}
	if q := p.Quota; q != nil {
		start, end := q.windowAt(time.UnixMicro(now))
		used := ms.quota[start.UnixMicro()]
		require.Equal(t, used, st.Quota.Used, where+": quota used")
		require.Equal(t, ms.quota[end.UnixMicro()], st.Quota.ReservedInNextWindow, where+": quota in the next window")
	}
	if c := p.Concurrency; c != nil {
		var want []Holder
		for id, until := range ms.holders {
			if until > now {
				want = append(want, Holder{ID: id, LeaseEnd: time.UnixMicro(until)})
			}
		}
		got := append([]Holder(nil), st.Concurrency.Holders...)
		for _, hs := range [][]Holder{want, got} {
			sort.Slice(hs, func(i, j int) bool { return hs[i].ID < hs[j].ID })
		}
		require.Equal(t, int64(len(want)), st.Concurrency.InFlight, where+": in flight")
		require.Equal(t, len(want), len(got), where+": holders")
		for i := range want {
			require.Equal(t, want[i].ID, got[i].ID, where+": holder")
			require.Equal(t, want[i].LeaseEnd.UnixMicro(), got[i].LeaseEnd.UnixMicro(), where+": lease of "+want[i].ID)
		}
	}
	var n, first, last int64
	for _, slot := range ms.reservations {
		if slot+micros(m.cfg.Grace) > now {
			n++
			if first == 0 || slot < first {
				first = slot
			}
			last = max(last, slot)
		}
	}
	require.Equal(t, n, st.Reservations, where+": reservations")
	if n > 0 {
		require.Equal(t, first, st.FirstSlot.UnixMicro(), where+": first slot")
		require.Equal(t, last, st.LastSlot.UnixMicro(), where+": last slot")
	}
	var cooldown time.Time
	if ms.cooldown > now {
		cooldown = time.UnixMicro(ms.cooldown)
	}
	require.Equal(t, cooldown.UnixMicro(), st.CooldownUntil.UnixMicro(), where+": cooldown")
	if st.CooldownUntil.IsZero() {
		require.True(t, cooldown.IsZero(), where+": cooldown")
	}
	require.Zero(t, st.Leftovers, where+": leftover charges")
}

// TestQuickPath holds admit.lua's quick path to its general engine: the
// same random sequences, on one limiter whose admissions of the quick
// path's shape take it and on one made to decide them all with the general
// engine, must reach the same decisions (and the model's) and leave the
// same state in every key after every step.
func TestQuickPath(t *testing.T) {
	steps := 2000
	if testing.Short() {
		steps = 600
	}
	for i, mix := range modelMixes {
		if !quickShaped(mix) {
			continue
		}
		t.Run(mix.name, func(t *testing.T) {
			t.Parallel()
			quick, general := setup(t, false, modelConfig), setup(t, false, modelConfig)
			general.lim.general = true
			runModelOn(t, []*env{quick, general}, mix, uint64(300+i), steps, false, true)
		})
	}
}

// quickShaped says whether a scenario has admissions of the quick path's
// shape: a policy of at most one rate and a concurrency rule, without
// @global rules beside it (the scenarios with none are the general
// engine's alone).
func quickShaped(mix modelMix) bool {
	for _, ps := range []map[string]string{mix.policies, mix.change} {
		for name, text := range ps {
			p, err := ParsePolicy(text)
			if err != nil || len(p.Rates) > 1 || p.Window != nil || p.Quota != nil {
				continue
			}
			if _, global := mix.policies[GlobalPolicy]; name == GlobalPolicy || !global {
				return true
			}
		}
	}
	return false
}

// requireSameState requires the keys of the tenant (and @global) to hold
// the same fields and entries under every limiter's prefix, claim tokens
// aside (each limiter draws its own).
func requireSameState(t *testing.T, envs []*env, tenant, where string) {
	t.Helper()
	ctx := context.Background()
	var first []string
	for i, e := range envs {
		var state []string
		for _, s := range []string{tenant, GlobalPolicy} {
			if s == "" {
				continue
			}
			keys := keysFor(e.prefix, s).admitKeys()
			h, err := e.client.HGetAll(ctx, keys[0]).Result()
			require.NoError(t, err)
			for f, v := range h {
				if lease, _, ok := strings.Cut(v, "."); ok && strings.HasPrefix(f, "h:") {
					v = lease + ".(claim)"
				}
				state = append(state, s+" "+f+"="+v)
			}
			for _, k := range keys[1:] {
				z, err := e.client.ZRangeWithScores(ctx, k, 0, -1).Result()
				require.NoError(t, err)
				for _, m := range z {
					state = append(state, fmt.Sprintf("%s %s: %v@%d", s, strings.TrimPrefix(k, e.prefix), m.Member, int64(m.Score)))
				}
			}
		}
		sort.Strings(state)
		if i == 0 {
			first = state
		} else {
			require.Equal(t, first, state, "%s: the state of limiter %d differs from limiter 1", where, i+1)
		}
	}
}

// TestQuickPathTickets holds the quick path to the general engine for the
// gate's commonest question after the room's: a job decided once (a
// ticket from an arrival that went straight) that comes late for its slot
// and is decided anew, its own charges taken back first. Random arrivals,
// late decisions, plain admissions and releases on two limiters, one
// deciding everything with the general engine: the same decisions, and
// the same state in every key after every step.
func TestQuickPathTickets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for i, rule := range []string{
		"rate=100/s burst=20 concurrency=6",
		"rate=200/s burst=60",
		"rate=1000/s burst=400 concurrency=8",
	} {
		t.Run(rule, func(t *testing.T) {
			t.Parallel()
			quick, general := setup(t, false, modelConfig), setup(t, false, modelConfig)
			general.lim.general = true
			envs := []*env{quick, general}
			for _, e := range envs {
				e.policy(t, "acme", rule)
			}
			rng := rand.New(rand.NewPCG(uint64(500+i), 7))
			tickets := make([]map[string]string, len(envs))
			for k := range tickets {
				tickets[k] = map[string]string{}
			}
			var late, lateAllowed, arrivals int
			for step := 0; step < 1500; step++ {
				advance := time.Duration(rng.IntN(8_000)) * time.Microsecond
				if rng.IntN(10) == 0 {
					advance = time.Duration(rng.IntN(400)) * time.Millisecond
				}
				id := fmt.Sprintf("job-%d", rng.IntN(6))
				op := rng.IntN(100)
				burst := 1 + rng.IntN(12)
				where := fmt.Sprintf("%s step %d job %s op %d", rule, step, id, op)
				var first Decision
				for k, e := range envs {
					e.clock.Advance(advance)
					var d Decision
					var err error
					switch {
					case op < 30:
						var a waitroom.Arrived
						a, err = e.lim.room().Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: id, MayGo: true})
						require.NoError(t, err, where)
						if a.Straight && a.Ticket != "" {
							tickets[k][id] = a.Ticket
						}
						d = Decision{Allowed: a.Straight, Slot: a.Slot, RetryAfter: -1}
						if k == 0 {
							arrivals++
						}
					case op < 60:
						tk, ok := tickets[k][id]
						if !ok {
							continue
						}
						delete(tickets[k], id)
						d, err = e.lim.Do(ctx, Request{Tenant: "acme", ID: id, Reserve: true, Ticket: tk})
						require.NoError(t, err, where)
						if k == 0 {
							late++
							if d.Allowed {
								lateAllowed++
							}
						}
					case op < 75:
						// other jobs, which use up the burst
						for n := range burst {
							d, err = e.lim.Do(ctx, Request{Tenant: "acme", ID: fmt.Sprintf("other-%d", n%3)})
							require.NoError(t, err, where)
						}
					default:
						require.NoError(t, e.lim.Release(ctx, "acme", id, 0), where)
						for n := range 3 {
							require.NoError(t, e.lim.Release(ctx, "acme", fmt.Sprintf("other-%d", n), 0), where)
						}
						delete(tickets[k], id)
					}
					if k == 0 {
						first = d
					} else {
						require.Equal(t, first.Allowed, d.Allowed, where)
						require.Equal(t, first.Slot, d.Slot, where)
						requireSameDecision(t, decisionOf(first), d, where+": differs from the general engine")
					}
				}
				requireSameState(t, envs, "acme", where)
			}
			t.Logf("%s: %d arrivals, %d late decisions (%d allowed)", rule, arrivals, late, lateAllowed)
			require.Greater(t, late, 80, "too few late decisions to mean anything")
			require.Greater(t, lateAllowed, late/2, "too few late decisions allowed (the quick path's case)")
		})
	}
}
