package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRangeEdgesAgainstRedis: a rate whose full bucket spans exactly
// MaxSpan admits a fresh tenant's first job, and the script's arithmetic
// stays exact (a float rounding would show in Available); one unit more is
// refused when the policy is stored, in text or built in Go. The policies
// of the report that a brand-new tenant was then denied forever with are
// refused.
func TestRangeEdgesAgainstRedis(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	// the clock near the end of its budget: 2^52 µs from 1970, the year 2112
	e.clock.Set(time.UnixMicro(1<<52 - 1_000_000))

	e.policy(t, "edge", "rate=1000000/s burst=4503599627370496") // 1 µs apart, 2^52 of them
	d, err := e.lim.Admit(ctx, "edge", "job-1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	st, err := e.lim.Stats(ctx, "edge")
	require.NoError(t, err)
	require.Equal(t, int64(1<<52-1), st.Rates[0].Available)

	e.policy(t, "slow", "rate=1/s burst=4503599627")
	for _, id := range []string{"a", "b", "c"} {
		d, err = e.lim.Admit(ctx, "slow", id)
		require.NoError(t, err)
		require.True(t, d.Allowed, id)
	}
	st, err = e.lim.Stats(ctx, "slow")
	require.NoError(t, err)
	require.Equal(t, int64(4503599627-3), st.Rates[0].Available)

	for _, text := range []string{
		"rate=1000000/s burst=4503599627370497",
		"rate=1/s burst=4503599628",
		"rate=1/s burst=10000000000000",
		"rate=1/h burst=3000000000",
		"rate=1/day burst=200000000",
	} {
		_, err := ParsePolicy(text)
		require.ErrorContains(t, err, "2^52 µs (about 142 years)", text)
	}
	err = e.store.Set(ctx, "built", &Policy{Rates: []Rate{{Limit: 1, Period: time.Second, Burst: 10_000_000_000_000}}})
	require.ErrorContains(t, err, "give burst 4503599627 or less")
	_, err = e.store.Get(ctx, "built")
	require.ErrorIs(t, err, ErrNoPolicy)

	// Stored by an older version: the tenant's jobs get a clear error (the
	// gate defers them and logs it) instead of a silent denial.
	require.NoError(t, e.client.HSet(ctx, policiesKey(e.prefix), "old", `{"policy":"rate=1/s burst=10000000000000"}`).Err())
	_, err = e.lim.Admit(ctx, "old", "job-1")
	var spe *StoredPolicyError
	require.ErrorAs(t, err, &spe)
	require.ErrorContains(t, err, "give burst 4503599627 or less")
}

func TestMulDivCeil(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ a, b, c, want int64 }{
		{1_000_000, 3, 7, 428572},
		{1_000_000, 10_000_000_000_000, 1, 1 << 62}, // past int64: saturates (was a negative offset)
		{3_600_000_000, 3_000_000_000, 1, 1 << 62},
		{4_000_000_000, 4_000_000_000, 3, 5333333333333333334},
	} {
		want := c.want
		if want == 1<<62 {
			want = 1<<63 - 1
		}
		require.Equal(t, want, mulDivCeil(c.a, c.b, c.c), "%d×%d/%d", c.a, c.b, c.c)
	}
}
