package throttle

import (
	"context"
	"github.com/sluicehq/sluice/internal/waitroom"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUndoOfALargeWindowCharge: taking back a charge of 10,000 units under
// a window rule removes its 10,000 window entries (admit.lua's undo, in
// pieces: Lua's unpack refuses about 8,000 values, so one ZREM of them all
// failed with "too many results to unpack" and the charge stayed).
func TestUndoOfALargeWindowCharge(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "bulk", "window=20000/min")
	room := e.lim.room()
	a, err := room.Arrive(ctx, waitroom.Arrival{Tenant: "bulk", ID: "big", Cost: 10_000, MayGo: true})
	require.NoError(t, err)
	require.True(t, a.Straight)
	st, err := e.lim.Stats(ctx, "bulk")
	require.NoError(t, err)
	require.Equal(t, int64(10_000), st.Window.Planned)
	require.NoError(t, room.TakeBack(ctx, a))
	st, err = e.lim.Stats(ctx, "bulk")
	require.NoError(t, err)
	require.Zero(t, st.Window.Planned, "the charge was taken back")
	require.Zero(t, st.Window.Started)
}
