package throttle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQuotaDST: a daily quota in Los Angeles resets exactly at local
// midnight, on the days around both daylight-saving changes of 2026 (the
// days are 24h, 23h, 24h and 25h long), never at UTC midnight.
func TestQuotaDST(t *testing.T) {
	t.Parallel()
	la, err := time.LoadLocation("America/Los_Angeles")
	require.NoError(t, err)
	for _, c := range []struct {
		midnight time.Time
		day      time.Duration // length of the local day that starts at midnight
	}{
		{time.Date(2026, 3, 7, 0, 0, 0, 0, la), 24 * time.Hour},
		{time.Date(2026, 3, 8, 0, 0, 0, 0, la), 23 * time.Hour},
		{time.Date(2026, 3, 9, 0, 0, 0, 0, la), 24 * time.Hour},
		{time.Date(2026, 10, 31, 0, 0, 0, 0, la), 24 * time.Hour},
		{time.Date(2026, 11, 1, 0, 0, 0, 0, la), 25 * time.Hour},
		{time.Date(2026, 11, 2, 0, 0, 0, 0, la), 24 * time.Hour},
	} {
		t.Run(c.midnight.Format("2006-01-02"), func(t *testing.T) {
			t.Parallel()
			m := c.midnight
			require.NotZero(t, m.UTC().Hour(), "local midnight must not be UTC midnight")
			next := m.Add(c.day)
			require.Equal(t, 0, next.In(la).Hour())

			e := setup(t, false, &Config{Horizon: 48 * time.Hour})
			e.policy(t, stepTenant, "quota=3/day tz=America/Los_Angeles")
			e.clock.Set(m.Add(-time.Hour))
			runSteps(t, e, []step{
				{id: "a", allowed: true, check: counts(2, time.Hour, -1)},
				{id: "b", allowed: true},
				{id: "c", allowed: true},
				{id: "d", retry: time.Hour, rule: "quota"},
				{advance: time.Hour - time.Microsecond, id: "d", retry: time.Microsecond, rule: "quota"},
				// midnight: a new day, as long as the calendar says
				{advance: time.Microsecond, id: "d", allowed: true, check: counts(2, c.day, -1)},
				{advance: time.Minute, id: "e", cost: 2, allowed: true},
				{id: "f", retry: c.day - time.Minute, rule: "quota"},
				{id: "f", reserve: true, retry: c.day - time.Minute, rule: "quota", reserved: true, slot: time.Hour + c.day},
			})
			e.clock.Set(next.Add(-time.Microsecond))
			d, err := e.lim.Admit(context.Background(), stepTenant, "g")
			require.NoError(t, err)
			require.Equal(t, time.Microsecond, d.RetryAfter)
			require.Equal(t, "quota", d.Rule)
			e.clock.Set(next)
			// f's reservation took the first unit of the next day
			d, err = e.lim.Admit(context.Background(), stepTenant, "g")
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, int64(1), d.Remaining)

			// with the default horizon (1h), a job is told to come back at the horizon
			e2 := setup(t, false, nil)
			e2.policy(t, stepTenant, "quota=1/day tz=America/Los_Angeles")
			e2.clock.Set(m.Add(time.Minute))
			runSteps(t, e2, []step{
				{id: "a", allowed: true},
				{id: "b", reserve: true, retry: HorizonDefault, rule: "quota"},
			})
		})
	}
}

func TestQuotaWindow(t *testing.T) {
	t.Parallel()
	la, err := time.LoadLocation("America/Los_Angeles")
	require.NoError(t, err)
	day := func(y int, mo time.Month, d int) time.Time { return time.Date(y, mo, d, 0, 0, 0, 0, la) }
	for _, c := range []struct {
		policy     string
		at         time.Time
		start, end time.Time
	}{
		{"quota=1/day tz=America/Los_Angeles", day(2026, 3, 8).Add(12 * time.Hour), day(2026, 3, 8), day(2026, 3, 9)},
		{"quota=1/day tz=America/Los_Angeles", day(2026, 11, 1).Add(24*time.Hour + 30*time.Minute), day(2026, 11, 1), day(2026, 11, 2)},
		{"quota=1/day tz=America/Los_Angeles", day(2026, 11, 2), day(2026, 11, 2), day(2026, 11, 3)},
		{"quota=1/day tz=America/Los_Angeles", day(2026, 11, 2).Add(-time.Nanosecond), day(2026, 11, 1), day(2026, 11, 2)},
		{"quota=1/day", time.Date(2026, 3, 8, 23, 59, 0, 0, time.UTC), time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)},
		{"quota=1/hour tz=Asia/Kolkata", time.Date(2026, 3, 8, 10, 10, 0, 0, time.UTC), time.Date(2026, 3, 8, 9, 30, 0, 0, time.UTC), time.Date(2026, 3, 8, 10, 30, 0, 0, time.UTC)},
		{"quota=1/week tz=UTC", time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), time.Date(2026, 4, 27, 0, 0, 0, 0, time.UTC), time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)},
		{"quota=1/month tz=Europe/Paris", time.Date(2026, 2, 28, 23, 30, 0, 0, time.UTC), time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC), time.Date(2026, 3, 31, 22, 0, 0, 0, time.UTC)},
		{`quota=1 reset="*/2 * * * *"`, time.Date(2026, 5, 1, 10, 3, 59, 0, time.UTC), time.Date(2026, 5, 1, 10, 2, 0, 0, time.UTC), time.Date(2026, 5, 1, 10, 4, 0, 0, time.UTC)},
		{`quota=1 reset="0 9 * * 1-5" tz=America/New_York`, time.Date(2026, 5, 2, 12, 0, 0, 0, time.UTC), time.Date(2026, 5, 1, 13, 0, 0, 0, time.UTC), time.Date(2026, 5, 4, 13, 0, 0, 0, time.UTC)},
		{`quota=1 reset="0 0 1 1 *"`, time.Date(2026, 5, 2, 12, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		p, err := ParsePolicy(c.policy)
		require.NoError(t, err)
		start, end := p.Quota.windowAt(c.at)
		where := fmt.Sprintf("%s at %s", c.policy, c.at)
		require.True(t, c.start.Equal(start), "%s: start %s, want %s", where, start, c.start)
		require.True(t, c.end.Equal(end), "%s: end %s, want %s", where, end, c.end)
	}
}
