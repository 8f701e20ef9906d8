package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSlotCycle: two slots, each job handed over, 1 ms before its handler,
// 8 ms in it, and its slot's next job handed over 1 ms after the handler's
// end: a 10 ms cycle, busy 90% of the slots' time.
func TestSlotCycle(t *testing.T) {
	t.Parallel()
	ms := int64(time.Millisecond)
	var jobs []slotJob
	for slot := int64(0); slot < 2; slot++ {
		for k := int64(0); k < 100; k++ {
			h := k*10*ms + slot*3*ms
			jobs = append(jobs, slotJob{handed: h, began: h + ms, ended: h + 9*ms})
		}
	}
	st := slotCycle(jobs, 2)
	require.Equal(t, 2, st.Slots)
	require.InDelta(t, 0.6, st.Window, 0.011, "the middle 60%% of the hand-overs")
	var sum slotSum
	sum.add(st)
	sum.add(slotStats{Slots: 5}) // a process that measured nothing adds nothing
	c, ok := sum.cycle()
	require.True(t, ok)
	require.InDelta(t, 0.9, c.busy, 0.02)
	require.InDelta(t, float64(ms), float64(c.before), float64(ms)/100)
	require.InDelta(t, float64(8*ms), float64(c.handler), float64(ms)/100)
	require.InDelta(t, float64(ms), float64(c.between), float64(ms)/5)

	_, ok = slotSum{}.cycle()
	require.False(t, ok, "nothing measured")
	require.Zero(t, slotCycle(jobs[:5], 2).Jobs, "too few jobs to measure")
}

// TestSlotClock: the clock records a job handed over through BaseContext's
// context, and none whose context it did not make.
func TestSlotClock(t *testing.T) {
	t.Parallel()
	var c slotClock
	ctx := c.handed()
	c.began(ctx)()
	c.began(context.Background())()
	require.Len(t, c.jobs, 1)
	j := c.jobs[0]
	require.LessOrEqual(t, j.handed, j.began)
	require.LessOrEqual(t, j.began, j.ended)
}
