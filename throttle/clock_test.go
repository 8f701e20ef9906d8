package throttle

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestRedisClockBounds: replies with random ways there and back (mostly
// short, some long, as on a loaded machine) always bound the true offset,
// the bounds narrow to the quickest ways seen rather than follow the last
// reply, they widen with age by clockDrift, and a clock that is set anew
// (bounds that no longer meet) starts them again from the new reply.
func TestRedisClockBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	const offset = 123_456_789 // µs, Redis minus local
	way := func() int64 {
		if rng.IntN(4) == 0 {
			return 1_000 + rng.Int64N(5_000) // a loaded process reads late
		}
		return 20 + rng.Int64N(300)
	}
	var c redisClock
	_, _, ok := c.bounds(0)
	require.False(t, ok, "no bounds before a reply")
	local := int64(1_000_000_000)
	var lastLo int64
	for i := range 2000 {
		sent := local
		there, back := way(), way()
		redis := sent + there + offset
		got := sent + there + back
		c.observe(redis, sent, got)
		local = got + rng.Int64N(2_000)
		lo, hi, ok := c.bounds(local)
		require.True(t, ok)
		require.LessOrEqual(t, lo, int64(offset), "reply %d: the earliest bound is past Redis time", i)
		require.GreaterOrEqual(t, hi, int64(offset), "reply %d: the latest bound is before Redis time", i)
		if i > 100 {
			// the quickest ways set the bounds: within a few hundred µs,
			// however late the last reply was read
			require.Less(t, hi-lo, int64(700), "reply %d: bounds %d wide", i, hi-lo)
			require.Less(t, offset-lo, int64(400), "reply %d", i)
		}
		lastLo = lo
	}

	// a second later with no reply: widened by clockDrift both ways
	lo, hi, _ := c.bounds(local)
	lo2, hi2, _ := c.bounds(local + 1_000_000)
	require.Equal(t, lo-clockDrift, lo2)
	require.Equal(t, hi+clockDrift, hi2)
	require.Equal(t, lastLo, lo)

	// Redis's clock set back by 50 ms: the next reply's bounds do not meet
	// the old ones, and replace them
	local += 10_000
	c.observe(local+100+offset-50_000, local, local+200)
	lo, hi, _ = c.bounds(local + 200)
	require.Equal(t, int64(offset-50_000+100-200), lo)
	require.Equal(t, int64(offset-50_000+100), hi)
}

// TestRedisClockAgainstRedis: after a few calls to a real server, the
// bounds hold Redis time as TIME reads it, and the earliest (by which a
// job waits for its slot) is never ahead of it. On a Cluster each tenant's
// master's own bounds (clockFor) hold that master's TIME.
func TestRedisClockAgainstRedis(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	tenants := []string{"acme", "globex", "initech", "umbrella", "hooli", "stark"}
	for _, tenant := range tenants {
		e.policy(t, tenant, "rate=1000/s")
		for range 20 {
			_, err := e.lim.Admit(ctx, tenant, "")
			require.NoError(t, err)
		}
	}
	for i := range 60 {
		key := keysFor(e.lim.cfg.Prefix, tenants[i%len(tenants)]).state
		c, node := e.lim.clockFor(ctx, key)
		if e.lim.cluster {
			require.NotNil(t, node, "a Cluster's tenant's master is known")
			require.NotSame(t, &e.lim.rclock, c, "a master's own bounds")
		}
		var timer redis.Cmdable = e.client
		if node != nil {
			timer = node
		}
		before := time.Now()
		lo := e.lim.nowFor(ctx, key, false)
		rt, err := timer.Time(ctx).Result()
		require.NoError(t, err)
		hi := e.lim.nowFor(ctx, key, true)
		// Redis read its clock between before and now: the earliest bound,
		// read before the call, is not past it (TIME has µs precision)
		require.False(t, lo.After(rt.Add(time.Microsecond)), "estimated %s, Redis %s", lo, rt)
		require.False(t, hi.Before(rt.Add(-time.Microsecond)), "latest %s, Redis %s", hi, rt)
		require.Less(t, time.Since(before), time.Second)
	}
}

// TestMasterClocksKeepApart: on a Cluster whose masters' clocks disagree
// (here by 5 ms), every master keeps bounds of its own, so a job waits for
// its slot by its tenant's master's clock however the replies of the
// other masters come in between; one set of bounds for all would start
// again with every reply from another master, and be as far off as the
// clocks are apart for half the tenants.
func TestMasterClocksKeepApart(t *testing.T) {
	t.Parallel()
	offsets := map[string]time.Duration{"a": 0, "b": 5 * time.Millisecond, "c": -3 * time.Millisecond}
	l := &Limiter{cluster: true}
	l.masterOf = func(_ context.Context, key string) (*redis.Client, string) {
		return nil, key[:1]
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 5))
	for range 300 {
		key := []string{"a:1", "b:1", "c:1"}[rng.IntN(3)]
		sent := time.Now()
		// Redis read its clock between the call's sending and its reply
		way := time.Since(sent)
		redis := sent.Add(time.Duration(rng.Int64N(int64(way)+1)) + offsets[key[:1]])
		l.observed(ctx, key, redis.UnixMicro(), sent)
	}
	for m, off := range offsets {
		key := m + ":2"
		before := time.Now()
		lo, hi := l.nowFor(ctx, key, false), l.nowFor(ctx, key, true)
		after := time.Now()
		// the master's time now is between before+off and after+off
		require.False(t, lo.After(after.Add(off)), "master %s: earliest %s past its time", m, lo.Sub(after))
		require.False(t, hi.Before(before.Add(off)), "master %s: latest %s before its time", m, hi.Sub(before))
		require.Less(t, hi.Sub(lo), time.Millisecond, "master %s: bounds %s wide", m, hi.Sub(lo))
	}
	// the limiter's own bounds follow the last reply's master: off by the
	// clocks' difference for another master's tenants
	lo := l.redisNow(false)
	var far time.Duration
	for _, off := range offsets {
		far = max(far, (lo.Sub(time.Now().Add(off))).Abs())
	}
	require.Greater(t, far, 2*time.Millisecond)
}

// TestTicketWiderBoundsAskRedis: a job at its slot whose process cannot
// tell by its bounds of Redis time whether it is still in its ticket's
// window (bounds wider than the window, as a loaded process's quickest
// replies make them) is not refused for it: Redis's own time decides, as
// it does any admission, and the job starts on its decision instead of
// losing its slot. A job the bounds show late is refused with no call.
func TestTicketWiderBoundsAskRedis(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=5/s")
	req := Request{Tenant: "acme", ID: "j1"}
	_, err := e.lim.Do(ctx, req) // a reply: the bounds are set
	require.NoError(t, err)
	r, scopes, err := e.lim.jobScopes(ctx, req)
	require.NoError(t, err)
	key := scopes[0].keys.state
	// decided for a slot that has come, with a window of 2 s after it (a
	// loaded machine's delays stay inside it), and bounds whose latest is
	// 3 s past the truth
	tk := ticket{slot: e.lim.nowFor(ctx, key, false).UnixMicro(), late: 2_000_000, fp: printWith(r.fingerprint(), scopes)}
	widen := func() {
		c, _ := e.lim.clockFor(ctx, key)
		now := time.Now().UnixMicro()
		lo, hi, ok := c.bounds(now)
		require.True(t, ok)
		c.b.Store(&clockBounds{lo: lo, hi: hi + 3_000_000, at: now})
	}
	widen()
	require.True(t, e.lim.nowFor(ctx, key, true).After(time.UnixMicro(tk.slot+tk.late)), "the bounds cannot tell")
	d, ok, err := e.lim.redeem(ctx, req, tk.String())
	require.NoError(t, err)
	require.True(t, ok, "in its window by Redis time")
	require.True(t, d.Allowed)
	require.False(t, d.Now.Before(time.UnixMicro(tk.slot)))

	// late by the earliest bound: refused, without asking Redis
	tk.slot -= 3_000_000
	widen()
	before := e.lim.rclock.b.Load()
	_, ok, err = e.lim.redeem(ctx, req, tk.String())
	require.NoError(t, err)
	require.False(t, ok, "too late for its slot")
	require.Same(t, before, e.lim.rclock.b.Load(), "no reply observed: no call")
}
