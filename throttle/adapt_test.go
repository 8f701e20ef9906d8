package throttle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAdaptPolicyText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		text, want string
		rule       AdaptRule
	}{
		{"rate=50/s adapt=10..200/s", "", AdaptRule{Floor: 10, Ceiling: 200, Period: time.Second}},
		{"adapt=10..200/s rate=50/s burst=5", "rate=50/s burst=5 adapt=10..200/s", AdaptRule{Floor: 10, Ceiling: 200, Period: time.Second}},
		{"rate=50/s adapt=50..50/s", "", AdaptRule{Floor: 50, Ceiling: 50, Period: time.Second}},
		{"rate=600/min rate=20/s adapt=100..1200/min adapt_step=30 adapt_every=2s adapt_latency=500ms", "",
			AdaptRule{Floor: 100, Ceiling: 1200, Period: time.Minute, Step: 30, Every: 2 * time.Second, Latency: 500 * time.Millisecond}},
		{"rate=5/10s adapt=1..10/10s concurrency=3 learn=false", "rate=5/10s concurrency=3 learn=false adapt=1..10/10s", AdaptRule{Floor: 1, Ceiling: 10, Period: 10 * time.Second}},
	} {
		p, err := ParsePolicy(c.text)
		require.NoError(t, err, c.text)
		require.Equal(t, c.rule, *p.Adapt, c.text)
		want := c.want
		if want == "" {
			want = c.text
		}
		require.Equal(t, want, p.String())
		again, err := ParsePolicy(p.String())
		require.NoError(t, err)
		require.Equal(t, p, again)
	}

	// YAML: the same fields
	ps, err := ParsePolicyFile([]byte("acme:\n  rate: 50/s\n  adapt: 10..200/s\n  adapt_latency: 300ms\n"))
	require.NoError(t, err)
	require.Equal(t, "rate=50/s adapt=10..200/s adapt_latency=300ms", ps["acme"].String())
}

func TestAdaptPolicyInvalid(t *testing.T) {
	t.Parallel()
	// each error names the value and says what to do
	for _, c := range []struct {
		text string
		want []string
	}{
		{"rate=50/s adapt=200..10/s", []string{"adapt=200..10/s", "floor 200 is above the ceiling 10", "adapt=10..200/s"}},
		{"adapt=10..200/s", []string{"adapt=10..200/s", "has none", "rate=200/s adapt=10..200/s"}},
		{"rate=50/s adapt=60..200/s", []string{"adapt=60..200/s", "50/s", "outside", "rate=60/s"}},
		{"rate=500/s adapt=60..200/s", []string{"adapt=60..200/s", "500/s", "outside", "rate=200/s"}},
		{"rate=3000/min adapt=10..200/s", []string{"adapt=10..200/s", "no rate per s", "3000/min", "period of the rate"}},
		{"rate=50/s burst=5 rate=100/s adapt=10..200/s", []string{"adapt=10..200/s", "2 rates per s"}},
		{"rate=50/s adapt=0..200/s", []string{"adapt=0..200/s", "at least 1"}},
		{"rate=50/s adapt=10-200/s", []string{"adapt=10-200/s", "FLOOR..CEILING/PERIOD"}},
		{"rate=50/s adapt=10..200", []string{"adapt=10..200", "FLOOR..CEILING/PERIOD"}},
		{"rate=50/s adapt=ten..200/s", []string{"adapt=ten..200/s", "whole numbers"}},
		{"rate=50/s adapt=10..200/fortnight", []string{"adapt=10..200/fortnight", "period"}},
		{"rate=50/s adapt=10..2000000/s", []string{"adapt=10..2000000/s", "microsecond"}},
		{"rate=50/s adapt_step=5", []string{"adapt_step", "belongs to adapt", "adapt=FLOOR..CEILING/PERIOD"}},
		{"rate=50/s adapt_latency=1s", []string{"adapt_latency", "belongs to adapt"}},
		{"rate=50/s adapt=10..200/s adapt_step=0", []string{"adapt_step=0", "at least 1"}},
		{"rate=50/s adapt=10..200/s adapt_step=500", []string{"adapt_step=500", "above the ceiling 200"}},
		{"rate=50/s adapt=10..200/s adapt_every=10ms", []string{"adapt_every=10ms", "from 50ms to 1h"}},
		{"rate=50/s adapt=10..200/s adapt_every=soon", []string{"adapt_every=soon", "duration"}},
		{"rate=50/s adapt=10..200/s adapt_latency=-1s", []string{"adapt_latency=-1s", "positive"}},
		{"rate=50/s adapt=10..200/s adapt=10..300/s", []string{"adapt=10..300/s", "twice"}},
	} {
		p, err := ParsePolicy(c.text)
		require.Error(t, err, c.text)
		require.Nil(t, p, c.text)
		var pe *PolicyError
		require.ErrorAs(t, err, &pe, c.text)
		for _, w := range c.want {
			require.Contains(t, err.Error(), w, "policy %q", c.text)
		}
	}

	// @global cannot adapt: refused by the store and in a policy file,
	// and nothing is stored
	e := setup(t, false, nil)
	ctx := context.Background()
	p := mustPolicy(t, "rate=50/s adapt=10..200/s")
	err := e.store.Set(ctx, GlobalPolicy, p)
	require.ErrorContains(t, err, "@global cannot adapt")
	_, err = e.store.Get(ctx, GlobalPolicy)
	require.ErrorIs(t, err, ErrNoPolicy)
	_, err = ParsePolicyFile([]byte("\"@global\": rate=50/s adapt=10..200/s\n"))
	require.ErrorContains(t, err, "@global cannot adapt")
}

// adaptStep is one report to an adaptive rule, after advancing the clock.
type adaptStep struct {
	after      time.Duration
	rep        AdaptReport
	want       int64
	wantReason string
}

func runAdaptSteps(t *testing.T, e *env, tenant string, steps []adaptStep) {
	t.Helper()
	ctx := context.Background()
	for i, s := range steps {
		e.clock.Advance(s.after)
		c, err := e.lim.Adapt(ctx, tenant, s.rep)
		require.NoError(t, err, "step %d", i)
		require.Equal(t, s.want, c.To, "step %d (%+v): limit", i, s.rep)
		require.Equal(t, s.wantReason, c.Reason, "step %d (%+v): reason", i, s.rep)
	}
}

// TestAdaptSteps holds adapt.lua to AIMD: an increase per interval while
// the answers are good and the limit is used, a decrease on throttled or
// slow answers at most once per interval and never for answers sent under
// a limit older than the last decrease, never outside floor..ceiling.
func TestAdaptSteps(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	e.policy(t, "acme", "rate=50/s adapt=10..100/s adapt_step=5 adapt_every=1s")
	ms := time.Millisecond
	ok := func(n int64) AdaptReport { return AdaptReport{OK: n} }
	thr := func(n, seq int64) AdaptReport { return AdaptReport{Throttled: n, Seq: seq} }
	runAdaptSteps(t, e, "acme", []adaptStep{
		{0, ok(10), 50, "start"}, // seq 1
		{500 * ms, ok(30), 50, ""},
		// an interval with the limit used (60 of 55 in 1.1 s, more than half)
		{600 * ms, ok(30), 55, "increase"}, // seq 2
		// increases at most once per interval
		{500 * ms, ok(30), 55, ""},
		{600 * ms, ok(60), 60, "increase"}, // seq 3
		// a throttled answer cuts to three quarters
		{100 * ms, thr(3, 3), 45, "throttled"}, // seq 4
		// answers sent under the limit before the cut are old news
		{100 * ms, thr(5, 3), 45, ""},
		// fresh ones, within the interval of the cut: no second cut
		{100 * ms, thr(5, 4), 45, ""},
		// and no increase within an interval of a fresh throttled answer
		{900 * ms, ok(50), 45, ""},
		// past it: the next cut
		{200 * ms, thr(1, 4), 33, "throttled"}, // seq 5
		// a report that does not know its sequence number is fresh
		{1000 * ms, thr(1, 0), 24, "throttled"},
		{1000 * ms, thr(1, 0), 18, "throttled"},
		{1000 * ms, thr(1, 0), 13, "throttled"},
		// never below the floor
		{1000 * ms, thr(1, 0), 10, "throttled"},
		{1000 * ms, thr(1, 0), 10, ""},
		// a limit nobody uses is not raised (4 of 10/s over 1.1 s)
		{1100 * ms, ok(4), 10, ""},
		{1100 * ms, ok(4), 10, ""},
		// used again: raised
		{1100 * ms, ok(8), 15, "increase"},
		// slow answers: a tenth or fewer count as good ones
		{1100 * ms, AdaptReport{OK: 18, Slow: 2}, 20, "increase"},
		// more than a tenth cut like a 429
		{1100 * ms, AdaptReport{OK: 8, Slow: 2}, 15, "latency"},
	})

	// never above the ceiling
	e.policy(t, "high", "rate=95/s adapt=10..100/s adapt_step=10 adapt_every=1s")
	runAdaptSteps(t, e, "high", []adaptStep{
		{0, ok(1), 95, "start"},
		{1100 * ms, ok(200), 100, "increase"},
		{1100 * ms, ok(200), 100, ""},
	})

	// the fleet's policy cache follows: the rule at its current limit
	r, err := e.store.policiesFor(context.Background(), "high")
	require.NoError(t, err)
	require.Equal(t, "rate=100/s adapt=10..100/s adapt_step=10 adapt_every=1s", r.Policy.String())
	require.Equal(t, int64(100), r.Adaptive.Rate.Limit)
	require.Equal(t, "rate[0]", r.Adaptive.Rule)
	require.Equal(t, int64(2), r.Adaptive.Seq)

	// a tenant whose policy does not adapt: nothing written
	e.policy(t, "fixed", "rate=50/s")
	c, err := e.lim.Adapt(context.Background(), "fixed", ok(100))
	require.NoError(t, err)
	require.Equal(t, AdaptChange{}, c)
	n, err := e.client.Exists(context.Background(), keysFor(e.prefix, "fixed").adapt).Result()
	require.NoError(t, err)
	require.Zero(t, n)

	// bad reports change nothing
	_, err = e.lim.Adapt(context.Background(), "acme", AdaptReport{OK: -1})
	require.ErrorContains(t, err, "must not be negative")
	_, err = e.lim.Adapt(context.Background(), "", ok(1))
	require.ErrorIs(t, err, ErrInvalidTenant)
}

// TestAdaptPolicyChange: a policy change that keeps the rule's start
// clamps the adapted limit into the new range; a new start resets it.
// The state lapses adaptIdle after the last report.
func TestAdaptPolicyChange(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=50/s adapt=10..100/s adapt_step=20")
	ms := time.Millisecond
	runAdaptSteps(t, e, "acme", []adaptStep{
		{0, AdaptReport{OK: 1}, 50, "start"},
		{1100 * ms, AdaptReport{OK: 100}, 70, "increase"},
		{1100 * ms, AdaptReport{OK: 100}, 90, "increase"},
	})
	// a lower ceiling: the cached policy is clamped at once, the state at
	// the next report
	e.policy(t, "acme", "rate=50/s adapt=10..60/s adapt_step=20")
	r, err := e.store.policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(60), r.Policy.Rates[0].Limit)
	runAdaptSteps(t, e, "acme", []adaptStep{{100 * ms, AdaptReport{OK: 1}, 60, "policy"}})
	// a new start: from it
	e.policy(t, "acme", "rate=30/s adapt=10..60/s adapt_step=20")
	r, err = e.store.policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(30), r.Policy.Rates[0].Limit)
	runAdaptSteps(t, e, "acme", []adaptStep{{100 * ms, AdaptReport{OK: 1}, 30, "policy"}})

	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, "rate=30/s adapt=10..60/s adapt_step=20", st.Rules.String(), "the policy as stored")
	require.Equal(t, int64(30), st.Rates[0].Rate.Limit)
	var reasons []string
	for _, h := range st.Adaptive.History {
		reasons = append(reasons, fmt.Sprintf("%d→%d %s", h.From, h.To, h.Reason))
	}
	require.Equal(t, []string{"50→50 start", "50→70 increase", "70→90 increase", "90→60 policy", "60→30 policy"}, reasons)
	require.Equal(t, int64(2), st.Adaptive.Increases)
	require.Equal(t, int64(0), st.Adaptive.Decreases)

	// the state lives adaptIdle after the last report
	ttl, err := e.client.PTTL(ctx, keysFor(e.prefix, "acme").adapt).Result()
	require.NoError(t, err)
	require.InDelta(t, adaptIdle, ttl, float64(5*time.Second))
}

// TestAdaptHistoryCapped: the history keeps the last adaptHistory changes.
func TestAdaptHistoryCapped(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=100/s adapt=1..100000/s adapt_step=1 adapt_every=50ms")
	for range adaptHistory + 20 {
		e.clock.Advance(60 * time.Millisecond)
		_, err := e.lim.Adapt(ctx, "acme", AdaptReport{OK: 1000})
		require.NoError(t, err)
	}
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, st.Adaptive.History, adaptHistory)
	last := st.Adaptive.History[adaptHistory-1]
	require.Equal(t, int64(169), last.To, "69 increases after the start")
	require.Equal(t, int64(169), st.Adaptive.Rate.Limit)
	require.Equal(t, int64(120), st.Adaptive.History[0].To, "the oldest kept: the 21st change")
}

// TestAdaptReachesTheFleet: another process's policy cache follows a
// change at once (announced), and a declared limit below the adapted one
// still holds.
func TestAdaptReachesTheFleet(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=50/s adapt=10..200/s adapt_step=10 adapt_every=50ms")
	other := otherWorker(t, &env{client: e.client, prefix: e.prefix, clock: &fakeClock{}}, time.Hour)
	other.clock = nil
	r, err := other.Policies().policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(50), r.Policy.Rates[0].Limit)
	require.Eventually(t, func() bool { return other.policies.gen.Load() >= 1 }, 5*time.Second, time.Millisecond, "other's subscription never went live")

	// the state begins at the policy's rate, and is cut
	c, err := e.lim.Adapt(ctx, "acme", AdaptReport{Throttled: 1})
	require.NoError(t, err)
	require.Equal(t, AdaptChange{At: c.At, From: 50, To: 37, Reason: "throttled"}, c)
	require.Eventually(t, func() bool {
		r, err := other.Policies().policiesFor(ctx, "acme")
		return err == nil && r.Policy.Rates[0].Limit == 37 && r.Adaptive.Seq == 1
	}, 5*time.Second, time.Millisecond, "the other process follows the cut")

	// a declared limit: compared with the ceiling, and merged after the
	// adapted rule (the lower of the two holds)
	out, err := e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 20, Window: time.Second})
	require.NoError(t, err)
	require.Equal(t, LearnStored, out)
	out, err = e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 150, Window: time.Second})
	require.NoError(t, err)
	require.Equal(t, LearnStored, out, "below the ceiling 200/s: learned")
	out, err = e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 20, Window: time.Second})
	require.NoError(t, err)
	require.Equal(t, LearnStored, out)
	require.Eventually(t, func() bool {
		r, err := other.Policies().policiesFor(ctx, "acme")
		return err == nil && r.Policy.String() == "rate=37/s rate=20/s adapt=10..200/s adapt_step=10 adapt_every=50ms" && r.Learned.Rule == "rate[1]"
	}, 5*time.Second, time.Millisecond, "the learned limit after the adapted rule")
}
