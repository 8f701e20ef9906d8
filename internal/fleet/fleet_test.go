package fleet

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFleetRegistry walks fleet.lua's ops: beats register a process and
// take the recoverer's lock when free, a process whose lease runs out is
// lapsed, only the lock holder sees and drops it, a dropped process that
// beats again is told it rejoined, and leaving frees the lock for the next
// beat.
func TestFleetRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := New(redistest.UniversalClient(t), redistest.Prefix(t))
	const lease, lock = 10 * time.Second, 5 * time.Second

	rejoined, leader, err := f.Beat(ctx, "a", "10.0.0.1:9464", lease, lock, []string{"q1"})
	require.NoError(t, err)
	require.True(t, rejoined, "a first beat registers")
	require.True(t, leader, "and takes the free lock")
	rejoined, leader, err = f.Beat(ctx, "b", "10.0.0.2:9464", lease, lock, []string{"q2"})
	require.NoError(t, err)
	require.True(t, rejoined)
	require.False(t, leader, "the lock is a's")
	rejoined, leader, err = f.Beat(ctx, "a", "10.0.0.1:9464", lease, lock, []string{"q1"})
	require.NoError(t, err)
	require.False(t, rejoined)
	require.True(t, leader)
	queues, err := f.Queues(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"q1", "q2"}, queues)

	require.NoError(t, f.Record(ctx, "a", map[string]string{"t1": "q1", "t2": "q1"}, nil))
	require.NoError(t, f.Record(ctx, "a", map[string]string{"t3": "q1"}, []string{"t1"}))
	jobs, err := f.Jobs(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"t2": "q1", "t3": "q1"}, jobs)
	held, err := f.Held(ctx, []string{"a", "b"}, []string{"t1", "t2", "tx"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"t2": true}, held)

	ok, lapsed, err := f.Check(ctx, "b", lock, 16)
	require.NoError(t, err)
	require.False(t, ok, "b does not hold the lock")
	require.Empty(t, lapsed)

	// c's lease is short: it lapses
	_, _, err = f.Beat(ctx, "c", "10.0.0.3:9464", 100*time.Millisecond, lock, nil)
	require.NoError(t, err)
	require.NoError(t, f.Record(ctx, "c", map[string]string{"t9": "q2"}, nil))
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, lapsed, err = f.Check(ctx, "a", lock, 16)
		require.NoError(t, err)
		require.True(t, ok)
		if slices.Contains(lapsed, "c") {
			break
		}
		require.False(t, time.Now().After(deadline), "c never lapsed: %v", lapsed)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, []string{"c"}, lapsed, "a and b are alive")
	list, err := f.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	for i, want := range []struct {
		id, admin string
		up        bool
	}{{"a", "10.0.0.1:9464", true}, {"b", "10.0.0.2:9464", true}, {"c", "10.0.0.3:9464", false}} {
		require.Equal(t, want.id, list[i].ID)
		require.Equal(t, want.admin, list[i].Admin)
		require.Equal(t, want.up, list[i].Up(), "%s: lease left %s", want.id, list[i].LeaseLeft)
	}
	require.InDelta(t, lease.Seconds(), list[0].LeaseLeft.Seconds(), 2)

	dropped, err := f.Drop(ctx, "b", "c")
	require.NoError(t, err)
	require.False(t, dropped, "only the lock holder drops")
	dropped, err = f.Drop(ctx, "a", "b")
	require.NoError(t, err)
	require.False(t, dropped, "a live process is not dropped")
	dropped, err = f.Drop(ctx, "a", "c")
	require.NoError(t, err)
	require.True(t, dropped)
	members, err := f.Members(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "b"}, members)
	jobs, err = f.Jobs(ctx, "c")
	require.NoError(t, err)
	require.Empty(t, jobs, "a dropped process's records go with it")
	rejoined, _, err = f.Beat(ctx, "c", "", lease, lock, nil)
	require.NoError(t, err)
	require.True(t, rejoined, "a process taken for dead is told so at its next beat")
	admins := func() map[string]string {
		list, err := f.List(ctx)
		require.NoError(t, err)
		out := map[string]string{}
		for _, m := range list {
			out[m.ID] = m.Admin
		}
		return out
	}
	require.Equal(t, map[string]string{"a": "10.0.0.1:9464", "b": "10.0.0.2:9464", "c": ""}, admins(),
		"a dropped process's address goes with it, and one beating without endpoints records none")

	require.NoError(t, f.Leave(ctx, "a"))
	members, err = f.Members(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"b", "c"}, members)
	require.Equal(t, map[string]string{"b": "10.0.0.2:9464", "c": ""}, admins(), "a leaving process's address goes with it")
	jobs, err = f.Jobs(ctx, "a")
	require.NoError(t, err)
	require.Empty(t, jobs)
	_, leader, err = f.Beat(ctx, "b", "10.0.0.2:9464", lease, lock, nil)
	require.NoError(t, err)
	require.True(t, leader, "the lock a gave back is the next beat's")
}

func TestMain(m *testing.M) { redistest.Main(m) }
