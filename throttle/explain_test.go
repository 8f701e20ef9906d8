package throttle

import (
	"github.com/sluicehq/sluice/internal/waitroom"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestExplainHolds: what each rule says of a job with units of cost ahead
// of it and its own, from a tenant's state (a step table over Stats).
func TestExplainHolds(t *testing.T) {
	t.Parallel()
	now := fakeEpoch
	rate := func(text string, ahead time.Duration) RateStats {
		r, err := ParseRate(text)
		require.NoError(t, err)
		return RateStats{Rule: "rate[0]", Rate: r, Ahead: ahead}
	}
	type want struct {
		heldBy  string
		in      time.Duration
		running int64
	}
	for _, c := range []struct {
		name         string
		st           Stats
		ahead, units int64 // jobs ahead, units of cost ahead and its own
		want         want
	}{
		{"idle rate, head", Stats{Rates: []RateStats{rate("5/s", 0)}}, 0, 1, want{"turn", 0, 0}},
		{"idle rate, third", Stats{Rates: []RateStats{rate("5/s", 0)}}, 2, 3, want{"rate[0]", 400 * time.Millisecond, 0}},
		{"meter ahead", Stats{Rates: []RateStats{rate("5/s", time.Second)}}, 0, 1, want{"rate[0]", time.Second, 0}},
		{"burst absorbs the line", Stats{Rates: []RateStats{rate("5/s burst 4", 0)}}, 3, 4, want{"turn", 0, 0}},
		{"burst, fifth", Stats{Rates: []RateStats{rate("5/s burst 4", 0)}}, 4, 5, want{"rate[0]", 200 * time.Millisecond, 0}},
		{"cost weighs", Stats{Rates: []RateStats{rate("10/s", 0)}}, 1, 6, want{"rate[0]", 500 * time.Millisecond, 0}},
		{"cooldown beyond the rate", Stats{Rates: []RateStats{rate("5/s", 0)}, CooldownUntil: now.Add(3 * time.Second)}, 2, 3, want{"cooldown", 3 * time.Second, 0}},
		{"window full", Stats{Window: &WindowStats{Window: Window{Limit: 10, Period: time.Minute}, Started: 10, Planned: 10}}, 0, 1, want{"window", time.Minute, 0}},
		{"window with room", Stats{Window: &WindowStats{Window: Window{Limit: 10, Period: time.Minute}, Started: 3, Planned: 3}}, 6, 7, want{"turn", 0, 0}},
		{"quota used up", Stats{Quota: &QuotaStats{Quota: Quota{Limit: 100}, Used: 100, WindowStart: now.Add(-time.Hour), WindowEnd: now.Add(23 * time.Hour)}}, 0, 1, want{"quota", 23 * time.Hour, 0}},
		{"quota two windows on", Stats{Quota: &QuotaStats{Quota: Quota{Limit: 100}, Used: 100, WindowStart: now.Add(-time.Hour), WindowEnd: now.Add(23 * time.Hour)}}, 150, 151, want{"quota", 47 * time.Hour, 0}},
		{"concurrency full", Stats{Concurrency: &ConcurrencyStats{Concurrency: Concurrency{Limit: 2}, InFlight: 2}}, 3, 4, want{"concurrency", 0, 4}},
		{"concurrency free", Stats{Concurrency: &ConcurrencyStats{Concurrency: Concurrency{Limit: 5}, InFlight: 2}}, 2, 3, want{"turn", 0, 0}},
		{"rate over concurrency", Stats{Rates: []RateStats{rate("1/s", 0)}, Concurrency: &ConcurrencyStats{Concurrency: Concurrency{Limit: 1}, InFlight: 1}}, 1, 2, want{"rate[0]", time.Second, 2}},
	} {
		st := c.st
		st.Tenant, st.Now = "acme", now
		x := explainAt(&st, nil, lineEntry{id: "j", queue: waitroom.DefaultQueue, cost: 1}, c.ahead, c.units-1)
		require.Equal(t, c.want, want{x.HeldBy, x.Expected.Sub(now), x.RunningFirst}, c.name)
	}
	// @global's holds are named so
	st := Stats{Tenant: "acme", Now: now}
	gst := Stats{Tenant: GlobalPolicy, Now: now, Rates: []RateStats{rate("1/s", 0)}}
	x := explainAt(&st, &gst, lineEntry{id: "j", queue: waitroom.DefaultQueue, cost: 1}, 2, 2)
	require.Equal(t, "@global rate[0]", x.HeldBy)
	require.Equal(t, 2*time.Second, x.Expected.Sub(now))
}
