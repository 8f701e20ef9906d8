package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/asynqroom"
	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/worker"
)

// TestRoomOffOnAnUnknownAsynqLayout: when the asynq the program is built
// with is a version sluice does not know (simulated here for this test's
// own Redis client), the worker and the producer refuse to run the
// waiting room, each saying so once in the log, and the worker counts it;
// every job then goes straight to asynq and the gate alone throttles it:
// nothing waits in a line, every job runs once, within its limits.
func TestRoomOffOnAnUnknownAsynqLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.NewServer(t, nil).Client(t)
	asynqroom.SimulateVersion(client, "v0.99.0")
	t.Cleanup(func() { asynqroom.SimulateVersion(client, "") })
	e := setup(t, client)
	const rate, conc = 20, 2
	e.policy(t, "acme", "rate=20/s concurrency=2 lease=5s")
	logs := &clitest.SyncBuffer{}
	srv := e.server(t, func(c *worker.Config) { c.Gate.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	rec := newRecorder(20 * time.Millisecond)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	ids := e.enqueue(t, "acme", 40, `{}`)

	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Waiting, "no job waits in a line: the room is off")
	eventually(t, 30*time.Second, func() bool { return rec.doneCount() == len(ids) }, "every job done through the gate")
	for _, id := range ids {
		require.Len(t, rec.starts[id], 1, "job %s ran once", id)
	}
	require.Zero(t, nonConforming(rec.startTimes(), rate, 2), "the gate kept the rate")
	require.LessOrEqual(t, rec.maxRun, conc)
	require.Equal(t, 1.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_errors_total", map[string]string{"kind": "asynq_layout"}))
	require.Equal(t, 1, strings.Count(logs.String(), `msg="waiting room is off"`), logs.String())
	require.Contains(t, logs.String(), "asynq v0.99.0: not a version sluice knows")
	require.Zero(t, e.queueInfo(t).Archived)
}
