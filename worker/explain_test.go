package worker_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/throttle"
)

// The error the estimates are held to. Early: a job leaves its line up to
// the promotion lead (50 ms) before its slot and the gate holds it to the
// slot, less the started meter's tolerance (2 ms): never more than
// explainEarly before its estimate. Late: the scheduling of the pump,
// asynq (10 ms polls) and the handler; under a rate rule of burst 1 a
// delay is never made up, so the delays of the jobs ahead add up: on a
// quiet machine every start was within 1 ms of its estimate, on a loaded
// one (other tests' processes) up to 0.55 s late.
const (
	explainEarly = 60 * time.Millisecond
	explainLate  = time.Second
)

// TestExplainEstimates: 20 jobs of a rate=5/s tenant enqueued at once wait
// in a steady line; each one's expected start, explained right after the
// enqueue, is met within explainError.
func TestExplainEstimates(t *testing.T) {
	e := setup(t, nil)
	e.policy(t, "acme", "rate=5/s")
	rec := newRecorder(0)
	srv := e.server(t, nil)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	ctx := context.Background()
	ids := e.enqueue(t, "acme", 20, `{}`)
	xs, err := e.lim.ExplainLine(ctx, "acme", e.queue, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(xs), 18, "the jobs wait in their line")
	// one job, explained on its own, agrees with the line's reading
	last := xs[len(xs)-1]
	one, err := e.lim.Explain(ctx, "acme", e.queue, last.ID)
	require.NoError(t, err)
	require.Equal(t, last.Ahead, one.Ahead)
	require.Equal(t, "rate[0]", one.HeldBy)
	require.InDelta(t, last.Expected.Sub(last.Now), one.Expected.Sub(one.Now), float64(50*time.Millisecond))
	require.Equal(t, ids[len(ids)-1], last.ID, "the last enqueued is last in line")
	_, err = e.lim.Explain(ctx, "acme", e.queue, "no-such-job")
	require.True(t, errors.Is(err, throttle.ErrNotWaiting), "%v", err)

	poll(t, 30*time.Second, 20*time.Millisecond, func() bool { return rec.doneCount() == len(ids) }, "all jobs ran")
	started := map[string]time.Time{}
	rec.mu.Lock()
	for id, tids := range rec.taskIDs {
		for i, tid := range tids {
			started[tid] = rec.starts[id][i]
		}
	}
	rec.mu.Unlock()
	var errs []time.Duration
	for _, x := range xs {
		at, ok := started[x.ID]
		require.True(t, ok, "job %s started", x.ID)
		errs = append(errs, at.Sub(x.Expected))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i] < errs[j] })
	t.Logf("%d waiting jobs of a rate=5/s line: start minus expected start from %s to %s (median %s); the last expected %s after the reading",
		len(xs), errs[0].Round(time.Millisecond), errs[len(errs)-1].Round(time.Millisecond), errs[len(errs)/2].Round(time.Millisecond),
		last.Expected.Sub(last.Now).Round(time.Millisecond))
	require.GreaterOrEqual(t, errs[0], -explainEarly, "no job starts more than %s before its estimate", explainEarly)
	require.LessOrEqual(t, errs[len(errs)-1], explainLate, "every job starts within %s of its estimate", explainLate)
}
