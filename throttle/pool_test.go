package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/waitroom"
)

// TestPools: a shared pool's rules apply with the tenants', all or
// nothing, fleet-wide across tenants: a job the pool denies is charged
// nothing in its tenant, a job its tenant denies nothing in the pool; a
// pool's concurrency slots are held, renewed and given back with the
// job's. It runs on the Cluster pass too, where the pool lives in
// @global's slot and the tenant in its own (two steps).
func TestPools(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "a", "rate=100/s burst=100")
	e.policy(t, "b", "rate=1/s burst=1")
	e.policy(t, "@api", "rate=4/s burst=4")
	api := []string{"@api"}
	do := func(tenant, id string) Decision {
		t.Helper()
		d, err := e.lim.Do(ctx, Request{Tenant: tenant, ID: id, Pools: api})
		require.NoError(t, err)
		return d
	}
	remaining := func(name string) int64 {
		t.Helper()
		st, err := e.lim.Stats(ctx, name)
		require.NoError(t, err)
		require.NotNil(t, st.Rates, name)
		return st.Rates[0].Available
	}
	require.True(t, do("a", "a1").Allowed)
	require.True(t, do("b", "b1").Allowed)
	require.Equal(t, int64(2), remaining("@api"), "two of the pool's four starts are taken, by two tenants")
	// b's own rate denies its second job: the pool is not charged
	d := do("b", "b2")
	require.False(t, d.Allowed)
	require.Equal(t, "b", d.Policy)
	require.Equal(t, int64(2), remaining("@api"))
	require.True(t, do("a", "a2").Allowed)
	require.True(t, do("a", "a3").Allowed)
	// the pool is spent: a's job is denied by it, and a is not charged
	before := remaining("a")
	d = do("a", "a4")
	require.False(t, d.Allowed)
	require.Equal(t, "@api", d.Policy)
	require.Equal(t, "rate[0]", d.Rule)
	require.Equal(t, before, remaining("a"))
	// the pool fills again at its rate
	e.clock.Advance(time.Second / 4)
	require.True(t, do("a", "a4").Allowed)

	// a job that names no pool is not held back by it
	d, err := e.lim.Do(ctx, Request{Tenant: "a", ID: "free"})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	// a pool without a policy limits nothing; a pool named twice counts once
	d, err = e.lim.Do(ctx, Request{Tenant: "a", ID: "x", Pools: []string{"@nolimit", "@nolimit"}})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	// a bad pool name: a clear error, nothing written
	before = remaining("a")
	_, err = e.lim.Do(ctx, Request{Tenant: "a", ID: "y", Pools: []string{"openai"}})
	require.ErrorContains(t, err, `pool "openai": a pool's name starts with @`)
	_, err = e.lim.Do(ctx, Request{Tenant: "a", ID: "y", Pools: []string{"@Open AI"}})
	require.ErrorContains(t, err, "use lowercase letters, digits")
	_, err = e.lim.Do(ctx, Request{Tenant: "a", ID: "y", Pools: []string{GlobalPolicy}})
	require.ErrorContains(t, err, "@global applies to every job already")
	require.Equal(t, before, remaining("a"))

	// a pool with state is listed with the tenants (sluice stats, top);
	// its keys read back as the pool's
	ts, err := e.lim.Tenants(ctx)
	require.NoError(t, err)
	require.Contains(t, ts, "@api")
	require.NotContains(t, ts, "@nolimit", "a pool without a policy has no state")
	for _, k := range keysFor("sluice", "@smtp-eu.2").admitKeys() {
		got, ok := scopeFromKey("sluice", k)
		require.True(t, ok, k)
		require.Equal(t, "@smtp-eu.2", got)
	}
}

// TestPoolConcurrency: a pool's concurrency cap is shared by the tenants'
// jobs; a job's pool slot is renewed with its other slots and given back
// when it ends (Release with its pools).
func TestPoolConcurrency(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "a", "concurrency=5")
	e.policy(t, "@db", "concurrency=1")
	db := []string{"@db"}
	d1, err := e.lim.Do(ctx, Request{Tenant: "a", ID: "j1", Pools: db})
	require.NoError(t, err)
	require.True(t, d1.Allowed)
	require.NotZero(t, d1.Claim)
	d, err := e.lim.Do(ctx, Request{Tenant: "b", ID: "j2", Pools: db})
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, "@db", d.Policy)
	require.Equal(t, "concurrency", d.Rule)
	st, err := e.lim.Stats(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight, "j1 holds a's slot; j2 of b took nothing")

	e.clock.Advance(time.Second)
	require.Equal(t, []error{nil}, e.lim.renewAll(ctx, []jobpath.Held{{Tenant: "a", ID: "j1", Claim: d1.Claim, Pools: db}}))
	st, err = e.lim.Stats(ctx, "@db")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight)
	require.Equal(t, e.clock.Now().Add(LeaseDefault).UnixMicro(), st.Concurrency.Holders[0].LeaseEnd.UnixMicro(), "renewed with the job")

	require.NoError(t, e.lim.room().Release(ctx, "a", "", "j1", d1.Claim, waitroom.Scopes{Pools: db}, nil, nil))
	st, err = e.lim.Stats(ctx, "@db")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight)
	require.ErrorIs(t, e.lim.room().Release(ctx, "a", "", "j1", d1.Claim, waitroom.Scopes{Pools: db}, nil, nil), ErrClaimLost, "a second release says the claim holds nothing")
	d, err = e.lim.Do(ctx, Request{Tenant: "b", ID: "j2", Pools: db})
	require.NoError(t, err)
	require.True(t, d.Allowed)
}

// TestPoolSettle: a job's pools are settled with it: a refund gives the
// pool's window back what the job did not use, in the pool and the tenant
// alike.
func TestPoolSettle(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "window=100/min")
	e.policy(t, "@llm", "window=10/min")
	req := Request{Tenant: "acme", ID: "j1", Cost: 8, Pools: []string{"@llm"}}
	d, err := e.lim.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	deny, err := e.lim.Do(ctx, Request{Tenant: "other", ID: "j2", Cost: 5, Pools: []string{"@llm"}, DryRun: true})
	require.NoError(t, err)
	require.False(t, deny.Allowed, "8 of the pool's 10 are used")
	require.NoError(t, e.lim.Settle(ctx, req, d, 3))
	ok, err := e.lim.Do(ctx, Request{Tenant: "other", ID: "j2", Cost: 5, Pools: []string{"@llm"}, DryRun: true})
	require.NoError(t, err)
	require.True(t, ok.Allowed, "the job used 3: 7 are free in the pool")
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(3), st.Window.Started, "the tenant is settled too")
}
