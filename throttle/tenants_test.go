package throttle

import (
	"context"
	"github.com/sluicehq/sluice/internal/waitroom"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestTenantsKeyRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tenant := range []string{"acme", "we{ir}d: name%", "ünïcödé", "%41", "a\tb\r\nc", "x:{t:y}:s", GlobalPolicy} {
		for _, k := range keysFor("sluice", tenant).all() {
			got, ok := scopeFromKey("sluice", k)
			require.True(t, ok, k)
			require.Equal(t, tenant, got)
		}
		for _, q := range []string{"default", "a:b", "x}:l:y", "x}:lh:y"} {
			for _, key := range keysFor("sluice", tenant).lines(q) {
				got, queue, ok := scopeAndQueue("sluice", key)
				require.True(t, ok, key)
				require.Equal(t, tenant, got)
				require.Equal(t, q, queue)
			}
		}
	}
	for _, key := range []string{
		"sluice:{p}:policies", "sluice:{p}:version", "other:{t:a}:s", "sluice:{t:}:s",
		"sluice:{t:a%4}:s", "sluice:{t:a%zz}:s", "sluice:{t:a}:", "sluice:{t:a}", "sluice:{x:a}:s",
	} {
		_, ok := scopeFromKey("sluice", key)
		require.False(t, ok, key)
	}
	require.Equal(t, `p\*\?\[x\]\\:{[tg]*}:[swaqgljde]*`, scopeKeyPattern(`p*?[x]\`))
	require.Equal(t, `p\*:{t:*}:l*:*`, lineKeyPattern(`p*`))
}

func TestTenants(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()

	got, err := e.lim.Tenants(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{}, got)

	e.policy(t, "acme", "rate=10/s")
	e.policy(t, "policy-only", "rate=10/s")
	e.policy(t, DefaultPolicy, "rate=100/s")
	e.policy(t, GlobalPolicy, "concurrency=100")
	weird := "we{ir}d: name%"
	for _, tenant := range []string{"acme", weird, "ünï"} {
		d, err := e.lim.Admit(ctx, tenant, "job-"+tenant)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	_, _, err = e.lim.room().Join(ctx, "waiting-only", 0, waitroom.Waiter{ID: "job-1"})
	require.NoError(t, err)
	_, err = e.lim.Cooldown(ctx, "cooling", time.Minute)
	require.NoError(t, err)

	// Another prefix's tenants are not listed.
	other := setup(t, true, nil)
	_, err = other.lim.Cooldown(ctx, "elsewhere", time.Minute)
	require.NoError(t, err)

	got, err = e.lim.Tenants(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{GlobalPolicy, "acme", "cooling", "waiting-only", weird, "ünï"}, got)

	require.NoError(t, e.lim.Reset(ctx, "cooling"))
	got, err = e.lim.Tenants(ctx)
	require.NoError(t, err)
	require.NotContains(t, got, "cooling")
}

func TestTenantsPrefixWithGlobCharacters(t *testing.T) {
	t.Parallel()
	client := redistest.UniversalClient(t)
	ctx := context.Background()
	base := redistest.Prefix(t)
	lim, err := NewLimiter(client, &Config{Prefix: base + "*"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, lim.Close()) })
	_, err = lim.Cooldown(ctx, "mine", time.Minute)
	require.NoError(t, err)
	// A key that an unescaped "*" would match.
	require.NoError(t, client.HSet(ctx, base+"X:{t:not-mine}:s", "cd", 1).Err())
	t.Cleanup(func() { client.Del(context.Background(), base+"X:{t:not-mine}:s") })

	got, err := lim.Tenants(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"mine"}, got)
}

func TestTenantsCluster(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t, &redistest.Options{Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}})
	ctx := context.Background()
	node := srv.Client(t)
	require.NoError(t, node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := node.ClusterInfo(ctx).Result()
		require.NoError(t, err)
		if strings.Contains(info, "cluster_state:ok") {
			break
		}
		require.True(t, time.Now().Before(deadline), "cluster did not become ok: %s", info)
		time.Sleep(20 * time.Millisecond)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}})
	t.Cleanup(func() { _ = cc.Close() })
	lim, err := NewLimiter(cc, &Config{Prefix: "cl"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, lim.Close()) })
	for _, tenant := range []string{"a", "b{1}", GlobalPolicy} {
		_, err := lim.Cooldown(ctx, tenant, time.Minute)
		require.NoError(t, err)
	}
	got, err := lim.Tenants(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{GlobalPolicy, "a", "b{1}"}, got)
}
