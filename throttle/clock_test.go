package throttle

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

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
// job waits for its slot) is never ahead of it.
func TestRedisClockAgainstRedis(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=1000/s")
	for range 20 {
		_, err := e.lim.Admit(ctx, "acme", "")
		require.NoError(t, err)
	}
	for range 50 {
		before := time.Now()
		lo := e.lim.estimatedNow()
		rt, err := e.client.Time(ctx).Result()
		require.NoError(t, err)
		hi := e.lim.latestNow()
		// Redis read its clock between before and now: the earliest bound,
		// read before the call, is not past it (TIME has µs precision)
		require.False(t, lo.After(rt.Add(time.Microsecond)), "estimated %s, Redis %s", lo, rt)
		require.False(t, hi.Before(rt.Add(-time.Microsecond)), "latest %s, Redis %s", hi, rt)
		require.Less(t, time.Since(before), time.Second)
	}
}
