package throttle

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/waitroom"
)

// TestRoomPriority: a line's jobs of high priority leave it first, then
// normal, then low, each level in the order it came; the line counts all
// of them (its cap, Waiting, Stats, Explain); a waiting job moves to
// another level at its end; another tenant's line is not touched.
func TestRoomPriority(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=1 backlog=7")
	e.policy(t, "other", "concurrency=1")
	room := e.lim.room()
	// acme's first job runs and holds its slot: the rest wait
	require.Equal(t, []string{"run"}, line(t, e, "acme", "run"))
	d, err := e.lim.Admit(ctx, "acme", "run")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, []string{"o1"}, line(t, e, "other", "o1", "o2"))

	join := func(id string, p int) {
		t.Helper()
		a, err := room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: id, MayGo: true, Priority: p})
		require.NoError(t, err)
		require.False(t, a.Straight, id)
		joined, _, err := room.JoinArrived(ctx, "acme", a.Backlog, waitroom.Waiter{ID: id, Priority: p})
		require.NoError(t, err)
		require.Equal(t, 1, joined, id)
	}
	join("n1", priorityNormal)
	join("l1", priorityLow)
	join("n2", priorityNormal)
	join("h1", priorityHigh)
	join("l2", priorityLow)
	join("h2", priorityHigh)
	join("n3", priorityNormal)

	// the cap counts every level: the eighth waiting job is refused
	_, err = room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: "over", MayGo: true, Priority: priorityHigh})
	require.ErrorIs(t, err, ErrBacklogFull)
	n, _, err := room.Waiting(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(7), n)
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(7), st.Waiting)

	ws, err := room.WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	var order []string
	for _, w := range ws {
		order = append(order, w.ID)
	}
	require.Equal(t, []string{"h1", "h2", "n1", "n2", "n3", "l1", "l2"}, order)
	x, err := e.lim.Explain(ctx, "acme", "", "n2")
	require.NoError(t, err)
	require.Equal(t, int64(3), x.Ahead, "h1, h2 and n1 are ahead of n2")
	require.Equal(t, priorityNormal, x.Priority)

	// l2 moves up to high, behind h2; n1 down to low, behind l1
	moved, err := room.Prioritize(ctx, "acme", "", "l2", priorityHigh)
	require.NoError(t, err)
	require.True(t, moved)
	moved, err = room.Prioritize(ctx, "acme", "", "n1", priorityLow)
	require.NoError(t, err)
	require.True(t, moved)
	moved, err = room.Prioritize(ctx, "acme", "", "nope", priorityHigh)
	require.NoError(t, err)
	require.False(t, moved, "a job not in the line")
	_, err = room.Prioritize(ctx, "acme", "", "h1", 5)
	require.ErrorContains(t, err, "priority 5: must be 1 (high), 0 (normal) or -1 (low)")

	// each release hands the slot to the head: the order the jobs start in
	var started []string
	id, claim := "run", d.Claim
	for range 7 {
		g := &engine{}
		require.NoError(t, room.Release(ctx, "acme", waitroom.DefaultQueue, id, claim, waitroom.Scopes{}, g.handover, nil))
		require.Len(t, g.handed, 1)
		id, claim = g.handed[0].ID, g.handed[0].Claim
		started = append(started, id)
	}
	require.Equal(t, []string{"h1", "h2", "l2", "n2", "n3", "l1", "n1"}, started)
	n, _, err = room.Waiting(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, n)

	// the other tenant's line is as it was
	ws, err = room.WaitingIDs(ctx, "other", 0)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{{ID: "o2", Queue: waitroom.DefaultQueue, Cost: 1}}, ws)
}

// TestRoomPriorityOrphans: the sweep joins a job whose producer died
// between parking it and joining its line at the job's own level.
func TestRoomPriorityOrphans(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=1")
	room := e.lim.room()
	require.Equal(t, []string{"run"}, line(t, e, "acme", "run"))
	for _, j := range []struct {
		id string
		p  int
	}{{"n", priorityNormal}, {"h", priorityHigh}, {"l", priorityLow}} {
		a, err := room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: j.id, MayGo: true, Priority: j.p})
		require.NoError(t, err)
		require.False(t, a.Straight)
	}
	e.clock.Advance(intentAge + 1)
	require.NoError(t, room.sweepOrphans(ctx, func(_ context.Context, _ string, jobs []waitroom.Waiter) ([]waitroom.TaskState, error) {
		return make([]waitroom.TaskState, len(jobs)), nil // all parked
	}))
	ws, err := room.WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{
		{ID: "h", Queue: waitroom.DefaultQueue, Cost: 1, Priority: priorityHigh},
		{ID: "n", Queue: waitroom.DefaultQueue, Cost: 1},
		{ID: "l", Queue: waitroom.DefaultQueue, Cost: 1, Priority: priorityLow},
	}, ws)
}
