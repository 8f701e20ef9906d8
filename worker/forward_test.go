package worker_test

import (
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFleetBringsDeferredJobsBackInTime: two Servers, whose own asynq
// forwarders poll the schedule at asynq's default (5 s); the one holding
// the fleet's lock moves due deferred jobs back every 200 ms, so that jobs
// the gate deferred to their slots (a tenant at 1/s, its jobs enqueued at
// once with asynq's own client) start at their slots, not seconds late.
func TestFleetBringsDeferredJobsBackInTime(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "rate=1/s burst=1")
	rec := newRecorder(0)
	for range 2 {
		srv := e.server(t, nil)
		srv.Handle("job", rec)
		require.NoError(t, srv.Start())
	}
	ids := e.enqueueDirect(t, "acme", 6, "")
	eventually(t, 20*time.Second, func() bool { return rec.doneCount() == len(ids) }, "every job done")
	starts := rec.startTimes()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	// the first job starts at once, each next one a second later: the
	// last three were deferred (their slots were beyond the in-process
	// wait) and came back before their slots
	for i, s := range starts {
		late := s.Sub(starts[0].Add(time.Duration(i) * time.Second))
		t.Logf("job %d: %s after its slot", i, late.Round(time.Millisecond))
		require.Less(t, late, 900*time.Millisecond, "job %d started %s after its slot", i, late)
	}
}
