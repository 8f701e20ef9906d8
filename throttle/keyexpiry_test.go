package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/waitroom"
)

// TestKeyStateExpires: a key's state below its tenant expires as its
// tenant's does. After an admission under rate and window rules each of
// the key's keys lives as long as its tenant's (until its meters are
// full, plus the few seconds the start counter is kept for sluice top);
// while a job holds the key's concurrency slot, a lease; once the job is
// released, a few seconds, not a lease. Then every key is gone by itself.
// It runs on the Cluster pass too, where a key lives in its tenant's slot.
func TestKeyStateExpires(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	const rule = "rate=100/s burst=10 window=50/s"
	e.policy(t, "acme", rule)
	e.policy(t, "acme/*", rule)
	e.policy(t, "beta", "concurrency=4 lease=30s")
	e.policy(t, "beta/*", "concurrency=2 lease=30s")
	pttl := func(k string) time.Duration {
		t.Helper()
		ttl, err := e.client.PTTL(ctx, k).Result()
		require.NoError(t, err)
		return ttl
	}
	// sameTTLs requires each key of key's scope to live as the same key
	// of its tenant's does (both missing, or both expiring within 200ms
	// of each other: one script run set them), and returns the longest
	sameTTLs := func(tenant, key string) time.Duration {
		t.Helper()
		var longest time.Duration
		tk, kk := keysFor(e.prefix, tenant).admitKeys(), keysFor(e.prefix, keyPolicyName(tenant, key)).admitKeys()
		for i := range tk {
			want, got := pttl(tk[i]), pttl(kk[i])
			if want == -2 {
				require.Equal(t, want, got, "%s is missing, %s is not", tk[i], kk[i])
				continue
			}
			require.Positive(t, want, "%s has no TTL", tk[i])
			require.Positive(t, got, "%s has no TTL", kk[i])
			require.InDelta(t, want, got, float64(200*time.Millisecond), "%s lives %s, %s %s", kk[i], got, tk[i], want)
			longest = max(longest, got)
		}
		require.Positive(t, longest, "%s/%s has no state", tenant, key)
		return longest
	}

	// rate and window: the meters are full 100ms later, the start counter
	// is kept 5 s past the start, the hash's expiry a second further
	d, err := e.lim.Do(ctx, Request{Tenant: "acme", Key: "u1"})
	require.NoError(t, err)
	require.True(t, d.Allowed, d.String())
	started := time.Now()
	require.LessOrEqual(t, sameTTLs("acme", "u1"), 6*time.Second+10*time.Millisecond)

	// concurrency: the held slot keeps the key's state a lease, as the
	// tenant's; the release lets both go a few seconds later
	d, err = e.lim.Do(ctx, Request{Tenant: "beta", Key: "k1", ID: "j1"})
	require.NoError(t, err)
	require.True(t, d.Allowed, d.String())
	require.Greater(t, sameTTLs("beta", "k1"), 25*time.Second, "j1 still runs: its lease keeps the state")
	_, err = e.lim.release(ctx, "beta", "", "j1", d.Claim, waitroom.Scopes{Key: "k1"})
	require.NoError(t, err)
	released := time.Now()
	require.LessOrEqual(t, sameTTLs("beta", "k1"), 8*time.Second, "released: a few seconds, not a lease")
	st, err := e.lim.Stats(ctx, "beta/k1")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight)

	// then every key of the keys and their tenants goes by itself
	var keys []string
	for _, s := range []string{"acme", "acme/u1", "beta", "beta/k1"} {
		keys = append(keys, keysFor(e.prefix, s).admitKeys()...)
	}
	deadline := released.Add(10 * time.Second)
	for {
		var left []string
		for _, k := range keys {
			n, err := e.client.Exists(ctx, k).Result()
			require.NoError(t, err)
			if n == 1 {
				left = append(left, k)
			}
		}
		if len(left) == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "keys %q still there %s after the release", left, time.Since(released))
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("keys gone %s after the keyed admission, %s after the release",
		time.Since(started).Round(100*time.Millisecond), time.Since(released).Round(100*time.Millisecond))
}
