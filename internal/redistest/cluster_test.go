package redistest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/redisurl"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// keyOn returns a key that hashes to a slot served by master.
func keyOn(t *testing.T, c *redistest.Cluster, cc *redis.ClusterClient, master *redistest.Server) string {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("k%d", i)
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		if c.MasterOf(int(slot)) == master {
			return k
		}
	}
	t.Fatalf("no key of 1000 lands on %s", master.Addr())
	return ""
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := redistest.NewCluster(t, &redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Second})
	ctx := context.Background()
	require.Equal(t, 6, c.Len())
	masters := c.Masters()
	require.Equal(t, []*redistest.Server{c.Node(0), c.Node(1), c.Node(2)}, masters)
	require.Len(t, c.Addrs(), 6)
	require.Equal(t, "redis+cluster://"+strings.Join(c.Addrs(), ","), c.URL())

	// every node is its own process, directory and port (bus port = port+10000)
	seen := map[string]bool{}
	for i := 0; i < c.Len(); i++ {
		n := c.Node(i)
		require.Positive(t, n.Pid())
		require.False(t, seen[n.Dir()], n.Dir())
		seen[n.Dir()] = true
		require.Less(t, n.Port()+10000, 65536)
		role, err := n.Client(t).Do(ctx, "ROLE").Slice()
		require.NoError(t, err)
		if i < 3 {
			require.Equal(t, "master", role[0], "node %d", i)
		} else {
			require.Equal(t, "slave", role[0], "node %d", i)
			require.Equal(t, int64(c.Node(i-3).Port()), role[2], "node %d follows master %d", i, i-3)
		}
	}
	// the slots are split evenly, one range per master
	for i, m := range masters {
		require.Same(t, m, c.MasterOf(i*redistest.ClusterSlots/3))
		require.Same(t, m, c.MasterOf((i+1)*redistest.ClusterSlots/3-1))
	}

	// the URL works through internal/redisurl, as --redis would use it
	u, err := redisurl.Parse(c.URL())
	require.NoError(t, err)
	uc := u.NewClient()
	t.Cleanup(func() { _ = uc.Close() })
	_, isCluster := uc.(*redis.ClusterClient)
	require.True(t, isCluster)
	cc := c.Client(t)
	keys := make([]string, 3)
	for i, m := range masters {
		keys[i] = keyOn(t, c, cc, m)
		require.NoError(t, uc.Set(ctx, keys[i], i, 0).Err())
		got, err := m.Client(t).Get(ctx, keys[i]).Int()
		require.NoError(t, err, "the key lives on master %d", i)
		require.Equal(t, i, got)
	}

	// a master killed: its replica takes over, with the data
	victim := c.MasterOf(0)
	require.Same(t, c.Node(0), victim)
	n, err := victim.Client(t).Do(ctx, "WAIT", 1, 5000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n, "the replica has the data before its master dies")
	victim.Kill()
	require.Zero(t, victim.Pid())
	c.Wait(t, 20*time.Second)
	require.Same(t, c.Node(3), c.MasterOf(0))
	require.Equal(t, []*redistest.Server{c.Node(3), c.Node(1), c.Node(2)}, c.Masters())
	// go-redis notices a new slot map by itself only every 10 s
	cc.ReloadState(ctx)
	require.Eventually(t, func() bool {
		v, err := cc.Get(ctx, keys[0]).Int()
		return err == nil && v == 0
	}, 10*time.Second, 20*time.Millisecond, "the promoted replica serves the slot")

	// the old master comes back as a replica of the new one
	require.NoError(t, victim.Restart())
	c.Wait(t, 20*time.Second)
	require.Same(t, c.Node(3), c.MasterOf(0))
	role, err := victim.Client(t).Do(ctx, "ROLE").Slice()
	require.NoError(t, err)
	require.Equal(t, "slave", role[0])
}

func TestClusterFreeze(t *testing.T) {
	t.Parallel()
	c := redistest.NewCluster(t, &redistest.ClusterOptions{NodeTimeout: 500 * time.Millisecond})
	ctx := context.Background()
	n := c.Node(1)
	require.NoError(t, n.Freeze())
	require.True(t, n.Frozen())
	// the others notice: without a replica the Cluster is down
	other := c.Node(0).Client(t)
	require.Eventually(t, func() bool {
		info, err := other.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:fail")
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, n.Thaw())
	require.False(t, n.Frozen())
	c.Wait(t, 20*time.Second)
	require.Equal(t, []*redistest.Server{c.Node(0), c.Node(1), c.Node(2)}, c.Masters())
}

func TestSharedCluster(t *testing.T) {
	t.Parallel()
	cc := redistest.ClusterClient(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	for i := 0; i < 30; i++ {
		require.NoError(t, cc.Set(ctx, fmt.Sprintf("%s:%d", prefix, i), i, time.Minute).Err())
	}
	var mu sync.Mutex
	var masters, found int
	require.NoError(t, redistest.ForEachMaster(ctx, cc, func(ctx context.Context, node redis.Cmdable) error {
		keys, err := node.Keys(ctx, prefix+":*").Result()
		mu.Lock()
		defer mu.Unlock()
		masters++
		found += len(keys)
		return err
	}))
	require.Equal(t, 3, masters)
	require.Equal(t, 30, found)

	u, err := redisurl.Parse(redistest.ClusterURL(t))
	require.NoError(t, err)
	require.Equal(t, redisurl.KindCluster, u.Kind)
	require.Len(t, u.Addrs, 3)

	// UniversalClient follows SLUICE_TEST_CLUSTER
	_, isCluster := redistest.UniversalClient(t).(*redis.ClusterClient)
	require.Equal(t, redistest.ClusterMode(), isCluster)
	// on a single server ForEachMaster calls once, with the client itself
	single := redistest.Client(t)
	calls := 0
	require.NoError(t, redistest.ForEachMaster(ctx, single, func(_ context.Context, node redis.Cmdable) error {
		calls++
		require.Same(t, single, node)
		return nil
	}))
	require.Equal(t, 1, calls)
}

func TestClusterOptionsInvalid(t *testing.T) {
	t.Parallel()
	for _, o := range []redistest.ClusterOptions{{Masters: -1}, {Replicas: -2}, {NodeTimeout: time.Microsecond}} {
		ft := &fatalRecorder{TB: t}
		func() {
			defer func() { _ = recover() }()
			redistest.NewCluster(ft, &o)
		}()
		require.True(t, ft.failed, "%+v", o)
	}
}

// fatalRecorder notes Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Fatalf(string, ...any) { f.failed = true; panic("fatal") }
func (f *fatalRecorder) Helper()               {}
