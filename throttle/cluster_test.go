package throttle

import (
	"context"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// These tests run the limiter on the shared three-master Cluster in every
// pass, next to the shared single server where they compare the two.

// clusterEnv is setup over the shared Cluster, whatever SLUICE_TEST_CLUSTER
// says. Its keys get no TTLs: the TTLs follow the fake clock, and real time
// (slow on a busy machine) must not expire what the test compares.
func clusterEnv(t *testing.T, cfg *Config) *env {
	t.Helper()
	e := setupOn(t, redistest.ClusterClient(t), false, cfg)
	require.True(t, e.lim.cluster)
	e.lim.noExpire = true
	return e
}

// singleEnv is clusterEnv over the shared single server.
func singleEnv(t *testing.T, cfg *Config) *env {
	t.Helper()
	e := setupOn(t, redistest.Client(t), false, cfg)
	require.False(t, e.lim.cluster)
	e.lim.noExpire = true
	return e
}

// TestClusterTenantsSpread: a hundred tenants' keys spread over all three
// masters, every key of a tenant in its one slot (as CLUSTER KEYSLOT and the
// slot map say), on the master that serves that slot.
func TestClusterTenantsSpread(t *testing.T) {
	t.Parallel()
	e := clusterEnv(t, nil)
	cc := e.client.(*redis.ClusterClient)
	ctx := context.Background()
	e.policy(t, DefaultPolicy, "rate=10/s burst=2 window=5/s quota=100/day concurrency=2")
	e.policy(t, GlobalPolicy, "rate=1000/s burst=1000 concurrency=1000")
	tenants := []string{"a{b}", "}x{", "ünï code", "g", "t:g"}
	for i := 0; i < 100; i++ {
		tenants = append(tenants, fmt.Sprintf("tenant-%03d", i))
	}
	for _, tenant := range tenants {
		d, err := e.lim.Admit(ctx, tenant, "j1")
		require.NoError(t, err)
		require.True(t, d.Allowed, tenant)
		d, err = e.lim.Do(ctx, Request{Tenant: tenant, ID: "j2", Reserve: true})
		require.NoError(t, err)
		require.True(t, d.Allowed || d.Reserved, tenant)
		_, _, err = e.lim.room().Join(ctx, tenant, 0, waitroom.Waiter{ID: "j3"})
		require.NoError(t, err)
	}

	// the slot map: slot -> the master serving it
	slots, err := cc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	owner := func(slot int64) string {
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return s.Nodes[0].Addr
			}
		}
		t.Fatalf("slot %d is served by no master", slot)
		return ""
	}
	globalSlot := cc.ClusterKeySlot(ctx, keysFor(e.prefix, GlobalPolicy).state).Val()
	perMaster := map[string]int{}
	keyMaster := map[string]string{} // key -> the master it must live on
	for _, tenant := range tenants {
		keys := append(keysFor(e.prefix, tenant).all(), keysFor(e.prefix, tenant).line(waitroom.DefaultQueue))
		slot, err := cc.ClusterKeySlot(ctx, keys[0]).Result()
		require.NoError(t, err)
		require.Equal(t, int64(keySlot(keys[0])), slot, tenant)
		for _, k := range keys[1:] {
			require.Equal(t, slot, cc.ClusterKeySlot(ctx, k).Val(), "tenant %q key %q", tenant, k)
		}
		require.NotEqual(t, globalSlot, slot, "tenant %q shares @global's slot", tenant)
		perMaster[owner(slot)]++
		for _, k := range keys {
			keyMaster[k] = owner(slot)
		}
	}
	t.Logf("tenants per master: %v", perMaster)
	require.Len(t, perMaster, 3, "the tenants do not reach every master")
	for addr, n := range perMaster {
		require.GreaterOrEqual(t, n, 15, "master %s has only %d of %d tenants", addr, n, len(tenants))
	}

	// every key written is on the master of its slot, and every tenant's
	// state, window and line keys were written
	var mu sync.Mutex
	found := map[string]string{}
	require.NoError(t, redistest.ForEachMaster(ctx, cc, func(ctx context.Context, node redis.Cmdable) error {
		addr := node.(*redis.Client).Options().Addr
		keys, err := node.Keys(ctx, e.prefix+":{t:*").Result()
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			found[k] = addr
		}
		return err
	}))
	for _, tenant := range tenants {
		k := keysFor(e.prefix, tenant)
		for _, key := range []string{k.state, k.planned, k.line(waitroom.DefaultQueue)} {
			require.Contains(t, found, key)
		}
	}
	for k, addr := range found {
		require.Equal(t, keyMaster[k], addr, k)
	}
}

// stateOf is what a scope's state means, without the bookkeeping that an
// undo does not take back and that changes no decision (the window entries'
// sequence, the expiry mark, the lower bound of lease ends, the sweep
// cursor).
func stateOf(t *testing.T, e *env, scope string) *Stats {
	t.Helper()
	st, err := e.lim.Stats(context.Background(), scope)
	require.NoError(t, err)
	return st
}

// keysOf is the DUMP of every existing key of scope.
func keysOf(t *testing.T, e *env, scope string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range keysFor(e.prefix, scope).all() {
		v, err := e.client.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue
		}
		require.NoError(t, err, k)
		out[k] = v
	}
	return out
}

// TestClusterAllOrNothing: on a Cluster, tenant and @global are decided in
// two steps, and the effect is still all or nothing. When @global denies a
// job its tenant admitted, the tenant's charge is undone: its state is
// what it was, and what a single server leaves. When the tenant denies,
// @global is not touched at all. Every decision, then and afterwards, is a
// single server's.
func TestClusterAllOrNothing(t *testing.T) {
	t.Parallel()
	type op struct {
		tenant, id string
		reserve    bool
		release    bool
		advance    time.Duration
	}
	for _, c := range []struct {
		name     string
		policies map[string]string
		before   []op
		deny     op
		policy   string // the denying policy
		rule     string
		after    []op // what follows must be decided alike
	}{
		{"@global rate denies", map[string]string{
			"acme": "rate=100/s burst=10 window=10/min quota=10/hour concurrency=5", GlobalPolicy: "rate=1/min"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, GlobalPolicy, "rate[0]",
			[]op{{tenant: "acme", id: "c"}, {tenant: "acme", id: "b", advance: time.Minute}, {tenant: "acme", id: "d"}}},
		{"@global window denies", map[string]string{
			"acme": "rate=10/s burst=2 quota=5/hour concurrency=2", GlobalPolicy: "window=1/min"},
			[]op{{tenant: "other", id: "a"}}, op{tenant: "acme", id: "b"}, GlobalPolicy, "window",
			[]op{{tenant: "acme", id: "b", advance: time.Minute}, {tenant: "acme", id: "c", advance: time.Minute}, {tenant: "acme", id: "d", advance: time.Minute}}},
		{"@global quota denies", map[string]string{
			"acme": "rate=10/s burst=2 window=3/min quota=2/hour concurrency=2", GlobalPolicy: "quota=1/hour"},
			[]op{{tenant: "other", id: "a"}}, op{tenant: "acme", id: "b"}, GlobalPolicy, "quota",
			[]op{{tenant: "acme", id: "b", advance: time.Hour}, {tenant: "acme", id: "c", advance: time.Hour}, {tenant: "acme", id: "d"}}},
		{"@global concurrency full", map[string]string{
			"acme": "rate=10/s burst=2 window=3/min quota=3/hour concurrency=1", GlobalPolicy: "concurrency=1"},
			[]op{{tenant: "other", id: "a"}}, op{tenant: "acme", id: "b"}, GlobalPolicy, "concurrency",
			[]op{{tenant: "acme", id: "b", advance: time.Minute}, {tenant: "acme", id: "c", advance: time.Minute}}},
		{"@global denies a job on its reservation", map[string]string{
			"acme": "rate=1/s window=5/min quota=10/hour", GlobalPolicy: "rate=100/s burst=10 concurrency=1"},
			[]op{{tenant: "acme", id: "a"}, {tenant: "acme", id: "b", reserve: true}},
			op{tenant: "acme", id: "b", advance: time.Second}, GlobalPolicy, "concurrency",
			// b keeps its reservations and starts on them without being
			// charged again: c's slot comes right after b's.
			[]op{{tenant: "acme", id: "a", release: true}, {tenant: "acme", id: "b", advance: time.Second},
				{tenant: "acme", id: "c", reserve: true}}},
		{"tenant denies, @global untouched", map[string]string{
			"acme": "rate=1/min", GlobalPolicy: "rate=100/s burst=10 window=10/min quota=10/hour concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "acme", "rate[0]",
			[]op{{tenant: "other", id: "c"}, {tenant: "acme", id: "b", advance: time.Minute}}},
		{"tenant denies, both hold the reservation", map[string]string{
			"acme": "rate=1/min", GlobalPolicy: "rate=100/s burst=10 window=10/min quota=10/hour concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b", reserve: true}, "acme", "rate[0]",
			[]op{{tenant: "other", id: "c"}, {tenant: "acme", id: "b", advance: time.Minute}, {tenant: "acme", id: "d", reserve: true}}},
		{"tenant's concurrency full, @global untouched", map[string]string{
			"acme": "concurrency=1", GlobalPolicy: "rate=100/s burst=10 window=10/min concurrency=5"},
			[]op{{tenant: "acme", id: "a"}}, op{tenant: "acme", id: "b"}, "acme", "concurrency",
			[]op{{tenant: "other", id: "c"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			envs := []*env{singleEnv(t, nil), clusterEnv(t, nil)}
			for _, e := range envs {
				for name, text := range c.policies {
					e.policy(t, name, text)
				}
			}
			do := func(o op) []Decision {
				var out []Decision
				for _, e := range envs {
					e.clock.Advance(o.advance)
					if o.release {
						require.NoError(t, e.lim.Release(ctx, o.tenant, o.id, 0))
						continue
					}
					d, err := e.lim.Do(ctx, Request{Tenant: o.tenant, ID: o.id, Reserve: o.reserve})
					require.NoError(t, err)
					out = append(out, d)
				}
				if !o.release {
					requireSameDecision(t, decisionOf(out[0]), out[1], fmt.Sprintf("%+v on a Cluster", o))
				}
				return out
			}
			for _, o := range c.before {
				do(o)
			}
			cl := envs[1]
			for _, e := range envs {
				e.clock.Advance(c.deny.advance)
			}
			c.deny.advance = 0
			tenantKeys, globalKeys := keysOf(t, cl, c.deny.tenant), keysOf(t, cl, GlobalPolicy)
			tenantState, globalState := stateOf(t, cl, c.deny.tenant), stateOf(t, cl, GlobalPolicy)
			d := do(c.deny)[1]
			require.False(t, d.Allowed)
			require.Equal(t, c.policy, d.Policy)
			require.Equal(t, c.rule, d.Rule)
			if !d.Reserved {
				require.Equal(t, globalKeys, keysOf(t, cl, GlobalPolicy), "@global was written")
			}
			if c.policy == GlobalPolicy {
				// charged, then undone
				require.Equal(t, tenantState, stateOf(t, cl, c.deny.tenant), "the tenant's state changed")
			} else if !d.Reserved {
				require.Equal(t, tenantKeys, keysOf(t, cl, c.deny.tenant), "the tenant was written")
				require.Equal(t, globalState, stateOf(t, cl, GlobalPolicy))
			}
			for _, scope := range []string{c.deny.tenant, GlobalPolicy} {
				require.Equal(t, stateOf(t, envs[0], scope), stateOf(t, cl, scope), "%s on a Cluster and on a single server", scope)
			}
			for _, o := range c.after {
				do(o)
			}
		})
	}
}

// TestClusterKeepsTheLeaseOnDenial: a job that already holds its tenant's
// concurrency slot and is admitted again (a redelivery) has its lease
// renewed by the tenant's step; when @global then denies it, the lease and
// the claim it had are put back, as a single server leaves them. (The two
// steps once left the renewed lease behind.)
func TestClusterKeepsTheLeaseOnDenial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	envs := []*env{singleEnv(t, nil), clusterEnv(t, nil)}
	var ends []time.Time
	for _, e := range envs {
		e.policy(t, "acme", "concurrency=2 lease=10s")
		d, err := e.lim.Admit(ctx, "acme", "a")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		// @global's only slot is taken by another tenant's job
		e.policy(t, GlobalPolicy, "concurrency=1 lease=10s")
		d, err = e.lim.Admit(ctx, "other", "x")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		e.clock.Advance(time.Second)
		d, err = e.lim.Admit(ctx, "acme", "a")
		require.NoError(t, err)
		require.Equal(t, "concurrency", d.Rule)
		require.Equal(t, GlobalPolicy, d.Policy)
		st := stateOf(t, e, "acme")
		require.Len(t, st.Concurrency.Holders, 1)
		ends = append(ends, st.Concurrency.Holders[0].LeaseEnd.UTC())
	}
	start := fakeEpoch
	require.Equal(t, start.Add(10*time.Second), ends[0], "single server: the lease is untouched")
	require.Equal(t, start.Add(10*time.Second), ends[1], "Cluster: the lease is put back")
}

// TestClusterReservationSlots: the two steps of a reservation land on a slot
// both scopes accept, which is the slot a single server gives. @global's
// rate pushes the job's slot past the tenant's; a full quota window of
// @global pushes it into the next one, where the tenant follows.
func TestClusterReservationSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, time.March, 3, 10, 5, 0, 0, time.UTC)
	for _, c := range []struct {
		name     string
		policies map[string]string
		first    string // admitted first, of another tenant
		slot     time.Time
		rule     string
		policy   string
	}{
		{"@global's rate is slower", map[string]string{"acme": "rate=1/s", GlobalPolicy: "rate=1/min"}, "other",
			at.Add(time.Minute), "rate[0]", GlobalPolicy},
		{"the tenant's rate is slower", map[string]string{"acme": "rate=1/min", GlobalPolicy: "rate=1/s"}, "acme",
			at.Add(time.Minute), "rate[0]", "acme"},
		{"quota windows of both", map[string]string{
			"acme":       `quota=1 reset="*/10 * * * *"`,
			GlobalPolicy: `quota=1 reset="*/15 * * * *" rate=1/s burst=5`}, "acme",
			time.Date(2026, time.March, 3, 10, 15, 0, 0, time.UTC), "quota", GlobalPolicy},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var slots []time.Time
			for _, e := range []*env{singleEnv(t, nil), clusterEnv(t, nil)} {
				e.clock.Set(at)
				for name, text := range c.policies {
					e.policy(t, name, text)
				}
				d, err := e.lim.Admit(ctx, c.first, "first")
				require.NoError(t, err)
				require.True(t, d.Allowed)
				d, err = e.lim.Do(ctx, Request{Tenant: "acme", ID: "job", Reserve: true})
				require.NoError(t, err)
				require.True(t, d.Reserved, d.String())
				require.Equal(t, c.slot, d.Slot.UTC())
				require.Equal(t, c.slot.Sub(at), d.RetryAfter)
				require.Equal(t, c.rule, d.Rule)
				require.Equal(t, c.policy, d.Policy)
				// both scopes hold the job's reservation at that one slot
				for _, scope := range []string{"acme", GlobalPolicy} {
					st := stateOf(t, e, scope)
					require.Equal(t, int64(1), st.Reservations, scope)
					require.Equal(t, c.slot, st.FirstSlot.UTC(), scope)
					require.Equal(t, c.slot, st.LastSlot.UTC(), scope)
				}
				// at its slot the job starts on the reservations, charged
				// nothing more: another job right after it waits
				e.clock.Set(c.slot)
				d, err = e.lim.Admit(ctx, "acme", "job")
				require.NoError(t, err)
				require.True(t, d.Allowed, d.String())
				d, err = e.lim.Admit(ctx, "acme", "next")
				require.NoError(t, err)
				require.False(t, d.Allowed, d.String())
				slots = append(slots, d.Now.Add(d.RetryAfter))
			}
			require.Equal(t, slots[0], slots[1], "the next job's start on a single server and on a Cluster")
		})
	}
}

// TestClusterMatchesSingleNode feeds a single-server limiter and a Cluster
// limiter the same random sequences, mixes with and without @global: each
// matches its reference model at every step, and the two give the same
// decisions as long as nothing only a Cluster leaves behind has happened.
func TestClusterMatchesSingleNode(t *testing.T) {
	// not cut with -short: the Cluster pass of make test runs -short, and
	// this is its check of the Cluster's decisions (at 200 steps the blocks
	// scenario saw too few denials to mean anything)
	const steps = 400
	for i, mix := range modelMixes {
		t.Run(mix.name, func(t *testing.T) {
			t.Parallel()
			envs := []*env{singleEnv(t, modelConfig), clusterEnv(t, modelConfig)}
			runModelOn(t, envs, mix, uint64(200+i), steps, false, false)
		})
	}
}

// admitOn is the model's admission: a limiter on a Cluster decides over a
// tenant and @global in steps (split.go) and reaches a single server's
// decision, leaving the same state behind.
func (m *model) admitOn(cluster bool, now int64, tenant, id string, cost int64, flags int) modelDecision {
	return m.admit(now, tenant, id, cost, flags)
}

// decisionOf is a Decision in the model's terms, to compare two limiters.
func decisionOf(d Decision) modelDecision {
	md := modelDecision{allowed: d.Allowed, retry: -1, rule: d.Rule, policy: d.Policy,
		remaining: d.Remaining, reset: -1, inflight: d.InFlight}
	if !d.Allowed {
		md.retry = d.RetryAfter.Microseconds()
	}
	if d.ResetAfter >= 0 {
		md.reset = d.ResetAfter.Microseconds()
	}
	if d.Reserved {
		md.slot = d.Slot.UnixMicro()
	}
	return md
}
