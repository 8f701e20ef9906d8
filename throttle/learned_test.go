package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMergeLearned(t *testing.T) {
	t.Parallel()
	ll := LearnedLimit{Limit: 40, Window: time.Second}
	for _, c := range []struct {
		policy, want, rule, note string
	}{
		{"rate=100/s burst=5", "rate=100/s burst=5 rate=40/s", "rate[1]", ""},
		{"", "rate=40/s", "rate[0]", ""},
		{"concurrency=3", "rate=40/s concurrency=3", "rate[0]", ""},
		{"rate=100/s rate=10000/min", "rate=100/s rate=10000/min rate=40/s", "rate[2]", ""},
		{"rate=100/s rate=1000/min", "rate=100/s rate=1000/min", "", "not below the policy's rate"},
		{"rate=10/s", "rate=10/s", "", "not below the policy's rate"},
		{"rate=40/s burst=10", "rate=40/s burst=10", "", "not below the policy's rate"},
		{"window=20/s", "window=20/s", "", "not below the policy's rate"},
		{"rate=100/s learn=false", "rate=100/s learn=false", "", "pinned: the policy says learn=false"},
	} {
		var base *Policy
		if c.policy != "" {
			base = mustPolicy(t, c.policy)
		}
		p, got := mergeLearned(base, ll)
		require.Equal(t, c.want, p.String(), c.policy)
		require.Equal(t, c.rule, got.Rule, c.policy)
		require.Equal(t, c.note, got.Note, c.policy)
		require.NoError(t, p.Validate())
		if c.policy != "" {
			require.Equal(t, c.policy, base.String(), "the stored policy is not changed")
		}
	}
}

// commands is how many commands Redis has run so far (INFO stats).
func commands(t *testing.T, e *env) int64 {
	t.Helper()
	return infoInt(t, e.client, "stats", "total_commands_processed")
}

func TestLearnedLimitReachesTheFleet(t *testing.T) {
	t.Parallel()
	// a private server: its command count is this test's alone
	e := setupOn(t, redistest.NewServer(t, nil).Client(t), true, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=100/s burst=5")
	e.policy(t, "pinned", "rate=100/s learn=false")
	// another process, which hears changes on pub/sub only
	other := otherWorker(t, &env{client: e.client, prefix: e.prefix, clock: &fakeClock{}}, time.Hour)
	other.clock = nil
	r, err := other.Policies().policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.Nil(t, r.Learned)
	require.Eventually(t, func() bool { return other.policies.gen.Load() >= 1 }, 5*time.Second, time.Millisecond, "other's subscription never went live")

	// a tenant without a learned limit costs no Redis command once cached
	_, err = other.Policies().policiesFor(ctx, "acme")
	require.NoError(t, err)
	before := commands(t, e)
	for range 1000 {
		r, err = other.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
	}
	// INFO itself is one command, and each store polls the versions every
	// 250 ms (one MGET): 1000 resolves cost nothing more
	require.LessOrEqual(t, commands(t, e)-before, int64(10))
	require.Equal(t, "rate=100/s burst=5", r.Policy.String())

	ll := LearnedLimit{Limit: 40, Window: time.Second, Source: "RateLimit-Policy", From: "200 from GET api.example.com/v1"}
	out, err := e.lim.Learn(ctx, "acme", ll)
	require.NoError(t, err)
	require.Equal(t, LearnStored, out)
	start := time.Now()
	require.Eventually(t, func() bool {
		r, err := other.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Learned != nil
	}, time.Second, time.Millisecond, "the learned limit did not reach the other process within 1s")
	t.Logf("learned limit seen by the other process after %s", time.Since(start).Round(time.Millisecond))
	r, err = other.Policies().policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, "rate=100/s burst=5 rate=40/s", r.Policy.String())
	require.Equal(t, "rate[1]", r.Learned.Rule)
	require.Equal(t, "RateLimit-Policy", r.Learned.Source)
	require.WithinDuration(t, time.Now().Add(LearnHoldDefault), r.Learned.Until, 2*time.Second)
	// the limit holds: back to back, the second job waits 25ms
	d, err := other.Admit(ctx, "acme", "j1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = other.Do(ctx, Request{Tenant: "acme", ID: "j2", DryRun: true})
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, "rate[1]", d.Rule)

	// the same limit again: nothing written
	out, err = e.lim.Learn(ctx, "acme", ll)
	require.NoError(t, err)
	require.Equal(t, LearnKept, out)
	// a pinned policy: nothing learned
	out, err = e.lim.Learn(ctx, "pinned", ll)
	require.NoError(t, err)
	require.Equal(t, LearnPinned, out)
	s, err := e.lim.Stats(ctx, "pinned")
	require.NoError(t, err)
	require.Nil(t, s.Learned)

	// stats show what was learned and the stored policy
	s, err = e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, "rate=100/s burst=5", s.Rules.String())
	require.NotNil(t, s.Learned)
	require.Len(t, s.Rates, 2)
	require.Equal(t, "rate[1]", s.Rates[1].Rule)

	// the downstream raises its limit above the policy: the learned one goes
	out, err = e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 1000, Window: time.Second})
	require.NoError(t, err)
	require.Equal(t, LearnCleared, out)
	require.Eventually(t, func() bool {
		r, err := other.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Learned == nil && r.Policy.String() == "rate=100/s burst=5"
	}, time.Second, time.Millisecond)

	// a learned limit lapses by itself, in every process
	out, err = e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 10, Window: time.Second, Until: time.Now().Add(300 * time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, LearnStored, out)
	require.Eventually(t, func() bool {
		r, err := other.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Learned != nil && r.Learned.Limit == 10
	}, time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		r, err := other.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Learned == nil
	}, 2*time.Second, 5*time.Millisecond)

	// a long window holds at most LearnHoldMax
	out, err = e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 1, Window: 365 * 24 * time.Hour})
	require.NoError(t, err)
	require.Equal(t, LearnStored, out)
	r, err = e.lim.Policies().policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(LearnHoldMax), r.Learned.Until, 2*time.Second)

	// bad input is refused with the value
	_, err = e.lim.Learn(ctx, "acme", LearnedLimit{Limit: 0, Window: time.Second})
	require.ErrorContains(t, err, "at least 1")
	_, err = e.lim.Learn(ctx, "@bad", ll)
	require.Error(t, err)
}

func TestLearnedLimitMissedAnnouncement(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=100/s")
	polling := otherWorker(t, &env{client: e.client, prefix: e.prefix, clock: &fakeClock{}}, 250*time.Millisecond)
	polling.clock = nil
	r, err := polling.Policies().policiesFor(ctx, "acme")
	require.NoError(t, err)
	require.Nil(t, r.Learned)
	// written without an announcement, as a lost message would leave it:
	// the learned version moved, and the poll drops the cache
	require.NoError(t, e.client.Set(ctx, keysFor(e.prefix, "acme").learned,
		`{"limit":5,"window_us":1000000,"source":"RateLimit-Policy"}`, time.Minute).Err())
	require.NoError(t, e.client.Incr(ctx, learnedVersionKey(e.prefix)).Err())
	require.Eventually(t, func() bool {
		r, err := polling.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Learned != nil && r.Learned.Limit == 5
	}, time.Second, 5*time.Millisecond)
	// one that cannot be read counts as none
	require.NoError(t, e.client.Set(ctx, keysFor(e.prefix, "acme").learned, `garbage`, time.Minute).Err())
	require.NoError(t, e.client.Incr(ctx, learnedVersionKey(e.prefix)).Err())
	require.Eventually(t, func() bool {
		r, err := polling.Policies().policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Learned == nil
	}, time.Second, 5*time.Millisecond)
}
