package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestUnreserve: a reservation given back frees its slot for the next job,
// refunding the rate, window and quota rules it charged; giving back twice,
// or a job that has none, changes nothing.
func TestUnreserve(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s window=5/s quota=100/hour")
	d, err := e.lim.Reserve(ctx, "acme", "a", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = e.lim.Reserve(ctx, "acme", "b", 1)
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, d.Slot.Sub(d.Now))
	before, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(2), before.Reservations)
	require.Equal(t, int64(2), before.Quota.Used)

	ok, err := e.lim.Unreserve(ctx, "acme", "b", 1)
	require.NoError(t, err)
	require.True(t, ok)
	after, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(1), after.Reservations)
	require.Equal(t, int64(1), after.Quota.Used)
	require.Equal(t, int64(1), after.Window.Planned)

	// c takes the slot b gave back
	d, err = e.lim.Reserve(ctx, "acme", "c", 1)
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, d.Slot.Sub(d.Now))

	ok, err = e.lim.Unreserve(ctx, "acme", "b", 1)
	require.NoError(t, err)
	require.False(t, ok)
	_, err = e.lim.Unreserve(ctx, "acme", "b", 0)
	require.Error(t, err)
}
