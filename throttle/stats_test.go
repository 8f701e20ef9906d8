package throttle

import (
	"context"
	"github.com/sluicehq/sluice/internal/waitroom"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStats(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	const text = "rate=10/s burst=2 rate=100/min burst=10 window=10/s quota=100/hour concurrency=3 lease=10s backlog=100"
	e.policy(t, stepTenant, text)
	now := time.Date(2026, 5, 1, 10, 30, 0, 0, time.UTC)
	e.clock.Set(now)

	// an untouched tenant: everything at rest
	st, err := e.lim.Stats(ctx, stepTenant)
	require.NoError(t, err)
	require.Equal(t, []RateStats{
		{Rule: "rate[0]", Rate: Rate{Limit: 10, Period: time.Second, Burst: 2}, Available: 2},
		{Rule: "rate[1]", Rate: Rate{Limit: 100, Period: time.Minute, Burst: 10}, Available: 10},
	}, st.Rates)
	require.Equal(t, int64(0), st.Quota.Used)
	require.Equal(t, int64(100), st.Quota.Remaining)

	for _, id := range []string{"j1", "j2"} {
		d, err := e.lim.Admit(ctx, stepTenant, id)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	for i, id := range []string{"r1", "r2"} {
		d, err := e.lim.Reserve(ctx, Request{Tenant: stepTenant, ID: id})
		require.NoError(t, err)
		require.Equal(t, time.Duration(i+1)*100*time.Millisecond, d.Slot.Sub(now))
	}
	joined, _, err := e.lim.room().Join(ctx, stepTenant, 100, waitroom.Waiter{ID: "b1"}, waitroom.Waiter{ID: "b2"}, waitroom.Waiter{ID: "b3"})
	require.NoError(t, err)
	require.Equal(t, 3, joined)
	until, err := e.lim.Cooldown(ctx, stepTenant, 5*time.Second)
	require.NoError(t, err)

	st, err = e.lim.Stats(ctx, stepTenant)
	require.NoError(t, err)
	require.Equal(t, stepTenant, st.Tenant)
	require.Equal(t, stepTenant, st.Policy)
	require.Equal(t, text, st.Rules.String())
	require.Equal(t, now.UnixMicro(), st.Now.UnixMicro())
	require.Equal(t, []RateStats{
		// two starts and two reservations: 400ms of the first bucket
		// planned, beyond its burst of 200ms; 2.4s of the second's 6s; the
		// started meters count the two starts only
		{Rule: "rate[0]", Rate: Rate{Limit: 10, Period: time.Second, Burst: 2}, Available: 0, Ahead: 400 * time.Millisecond, StartedAhead: 200 * time.Millisecond},
		{Rule: "rate[1]", Rate: Rate{Limit: 100, Period: time.Minute, Burst: 10}, Available: 6, Ahead: 2400 * time.Millisecond, StartedAhead: 1200 * time.Millisecond},
	}, st.Rates)
	require.Equal(t, &WindowStats{Window: Window{Limit: 10, Period: time.Second}, Started: 2, Planned: 4}, st.Window)
	require.Equal(t, int64(4), st.Quota.Used)
	require.Equal(t, int64(96), st.Quota.Remaining)
	require.Equal(t, int64(0), st.Quota.ReservedInNextWindow)
	require.Equal(t, time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC), st.Quota.WindowStart.UTC())
	require.Equal(t, time.Date(2026, 5, 1, 11, 0, 0, 0, time.UTC), st.Quota.WindowEnd.UTC())
	require.Equal(t, int64(100), st.Quota.Quota.Limit)
	require.Equal(t, Concurrency{Limit: 3, Lease: 10 * time.Second}, st.Concurrency.Concurrency)
	require.Equal(t, int64(2), st.Concurrency.InFlight)
	require.Len(t, st.Concurrency.Holders, 2)
	for i, h := range st.Concurrency.Holders {
		require.Equal(t, []string{"j1", "j2"}[i], h.ID)
		require.Equal(t, now.Add(10*time.Second).UnixMicro(), h.LeaseEnd.UnixMicro())
	}
	require.Equal(t, int64(2), st.Reservations)
	require.Equal(t, now.Add(100*time.Millisecond).UnixMicro(), st.FirstSlot.UnixMicro())
	require.Equal(t, now.Add(200*time.Millisecond).UnixMicro(), st.LastSlot.UnixMicro())
	require.Equal(t, now.Add(5*time.Second).UnixMicro(), st.CooldownUntil.UnixMicro())
	require.Equal(t, until.UnixMicro(), st.CooldownUntil.UnixMicro())
	require.Equal(t, int64(3), st.Waiting)
	require.Equal(t, int64(2), st.Started)

	// later: the cooldown is over, a holder left, the meters drained
	require.NoError(t, e.lim.Release(ctx, stepTenant, "j1", 0))
	e.clock.Advance(6 * time.Second)
	st, err = e.lim.Stats(ctx, stepTenant)
	require.NoError(t, err)
	require.True(t, st.CooldownUntil.IsZero())
	require.Equal(t, int64(2), st.Rates[0].Available)
	require.Equal(t, time.Duration(0), st.Rates[0].Ahead)
	require.Equal(t, int64(10), st.Rates[1].Available) // (6s + 6s - 2.4s) / 0.6s, capped at the burst
	require.Equal(t, int64(0), st.Window.Planned)
	require.Equal(t, int64(1), st.Concurrency.InFlight)
	require.Equal(t, "j2", st.Concurrency.Holders[0].ID)
	require.Equal(t, int64(2), st.Reservations) // unused, within the grace
	require.Equal(t, int64(4), st.Quota.Used)

	// Reset forgets the throttle state, keeps the policy and the backlog
	require.NoError(t, e.lim.Reset(ctx, stepTenant))
	st, err = e.lim.Stats(ctx, stepTenant)
	require.NoError(t, err)
	require.Equal(t, stepTenant, st.Policy)
	require.Equal(t, int64(2), st.Rates[0].Available)
	require.Equal(t, int64(10), st.Rates[1].Available)
	require.Equal(t, int64(0), st.Quota.Used)
	require.Equal(t, int64(0), st.Concurrency.InFlight)
	require.Empty(t, st.Concurrency.Holders)
	require.Equal(t, int64(0), st.Reservations)
	require.True(t, st.FirstSlot.IsZero())
	require.Equal(t, int64(0), st.Started)
	require.Equal(t, int64(3), st.Waiting)
	d, err := e.lim.Admit(ctx, stepTenant, "r2") // its reservation is gone: charged as new
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, int64(1), d.Remaining)
}

func TestStatsQuotaNextWindow(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, stepTenant, "quota=2/hour tz=Asia/Kolkata")
	e.clock.Set(time.Date(2026, 5, 1, 10, 50, 0, 0, time.UTC))
	for _, id := range []string{"a", "b", "c"} {
		_, err := e.lim.Do(ctx, Request{Tenant: stepTenant, ID: id, Reserve: true})
		require.NoError(t, err)
	}
	st, err := e.lim.Stats(ctx, stepTenant)
	require.NoError(t, err)
	// Kolkata is UTC+5:30: its hours start at :30 UTC
	require.Equal(t, &QuotaStats{
		Quota: *st.Rules.Quota, Used: 2, Remaining: 0, ReservedInNextWindow: 1,
		WindowStart: time.Date(2026, 5, 1, 10, 30, 0, 0, time.UTC), WindowEnd: time.Date(2026, 5, 1, 11, 30, 0, 0, time.UTC),
	}, normaliseQuotaStats(st.Quota))
	require.Equal(t, int64(1), st.Reservations)
	require.Equal(t, time.Date(2026, 5, 1, 11, 30, 0, 0, time.UTC), st.FirstSlot.UTC())
}

func normaliseQuotaStats(q *QuotaStats) *QuotaStats {
	c := *q
	c.WindowStart, c.WindowEnd = c.WindowStart.UTC(), c.WindowEnd.UTC()
	return &c
}

func TestStatsPolicies(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	// no policy anywhere: nothing applies
	st, err := e.lim.Stats(ctx, "nobody")
	require.NoError(t, err)
	require.Equal(t, "", st.Policy)
	require.Nil(t, st.Rules)
	require.Empty(t, st.Rates)
	require.Nil(t, st.Window)
	require.Nil(t, st.Quota)
	require.Nil(t, st.Concurrency)

	e.policy(t, DefaultPolicy, "rate=5/s")
	e.policy(t, GlobalPolicy, "concurrency=4")
	st, err = e.lim.Stats(ctx, "nobody")
	require.NoError(t, err)
	require.Equal(t, DefaultPolicy, st.Policy)
	require.Equal(t, "rate=5/s", st.Rules.String())

	_, err = e.lim.Admit(ctx, "nobody", "j")
	require.NoError(t, err)
	st, err = e.lim.Stats(ctx, GlobalPolicy)
	require.NoError(t, err)
	require.Equal(t, GlobalPolicy, st.Policy)
	require.Equal(t, int64(1), st.Concurrency.InFlight)
	require.Equal(t, int64(1), st.Started)
	_, err = e.lim.Cooldown(ctx, GlobalPolicy, time.Minute)
	require.NoError(t, err)
	st, err = e.lim.Stats(ctx, GlobalPolicy)
	require.NoError(t, err)
	require.Equal(t, time.Minute, st.CooldownUntil.Sub(st.Now))
	d, err := e.lim.Admit(ctx, "somebody", "k")
	require.NoError(t, err)
	require.Equal(t, "cooldown", d.Rule)
	require.Equal(t, GlobalPolicy, d.Policy)
	require.NoError(t, e.lim.Reset(ctx, GlobalPolicy))
	// the denial charged "somebody" nothing, on a Cluster too
	d, err = e.lim.Admit(ctx, "somebody", "k")
	require.NoError(t, err)
	require.True(t, d.Allowed)
}
