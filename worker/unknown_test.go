package worker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// logged is a logger whose text output the test reads.
type logged struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logged) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&lockedWriter{w: &l.buf, mu: &l.mu}, nil))
}

func (l *logged) lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// archived lists the archived tasks of the env's queue by id.
func (e *env) archived(t *testing.T) map[string]*asynq.TaskInfo {
	t.Helper()
	out := map[string]*asynq.TaskInfo{}
	infos, err := e.inspector.ListArchivedTasks(e.queue, asynq.PageSize(1000))
	if errors.Is(err, asynq.ErrQueueNotFound) {
		return out
	}
	require.NoError(t, err)
	for _, i := range infos {
		out[i.ID] = i
	}
	return out
}

// A job whose type no handler takes (a typo) is archived at once with the
// reason, its type logged once and counted, and no throttle slot is taken
// for it; asynq would otherwise retry it "handler not found" for days.
func TestUnknownTypeIsArchivedAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "concurrency=1")
	var logs logged
	srv := e.server(t, func(c *worker.Config) { c.Gate.Logger = logs.logger() })
	srv.Handle("sleep", asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	srv.HandleFunc("email:", func(context.Context, *asynq.Task) error { return nil })
	require.NoError(t, srv.Start())

	var ids []string
	for _, typ := range []string{"slep", "slep", "slep", "nope"} {
		info, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask(typ, nil), asynq.Queue(e.queue))
		require.NoError(t, err)
		ids = append(ids, info.ID)
	}
	eventually(t, 15*time.Second, func() bool { return len(e.archived(t)) == 4 }, "the four jobs archived")
	archived := e.archived(t)
	for i, id := range ids {
		info := archived[id]
		require.NotNil(t, info, id)
		require.Zero(t, info.Retried, "archived at once, not retried")
		typ := []string{"slep", "slep", "slep", "nope"}[i]
		require.Equal(t, `no handler for task type "`+typ+`" on this worker (it handles email:*, sleep): archived at once, not retried; fix the type and enqueue the job again, or once a worker handles it: sluice jobs run `+id, info.LastErr)
	}
	g := srv.Gate().Gatherer()
	require.Equal(t, 3.0, metric(t, g, "sluice_worker_unknown_types_total", map[string]string{"type": "slep"}))
	require.Equal(t, 1.0, metric(t, g, "sluice_worker_unknown_types_total", map[string]string{"type": "nope"}))
	require.Len(t, logs.lines(`msg="no handler for task type"`), 2, "one line per type")
	require.Len(t, logs.lines(`type=slep handles="email:*, sleep"`), 1)

	// The gate was never asked, and what the waiting room took for the
	// jobs (acme's one concurrency slot, handed on from one to the next) is
	// given back: a job may start now.
	d, err := e.lim.Do(context.Background(), throttleDryRun("acme"))
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, 0.0, metric(t, g, "sluice_worker_decisions_total", nil))
}

// With RetryUnknownTypes (workers of one queue handling different types),
// asynq's retries apply as before; the type is still logged and counted.
func TestUnknownTypeRetriedWhenAsked(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	srv := e.server(t, func(c *worker.Config) { c.RetryUnknownTypes = true })
	srv.HandleFunc("sleep", func(context.Context, *asynq.Task) error { return nil })
	require.NoError(t, srv.Start())
	info, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask("slep", nil), asynq.Queue(e.queue), asynq.MaxRetry(2))
	require.NoError(t, err)
	eventually(t, 15*time.Second, func() bool { return e.archived(t)[info.ID] != nil }, "archived after its retries")
	require.Equal(t, 2, e.archived(t)[info.ID].Retried)
	require.Equal(t, 3.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_unknown_types_total", map[string]string{"type": "slep"}))
}

// A handler's error is logged with the task's id, type and tenant, how
// many retries are left, and whether it is final; a storm of them is
// logged at most once a second per type.
func TestHandlerErrorsAreLogged(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	var logs logged
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.Logger = logs.logger()
		// past the log's limit of a line a second per type (asynq's schedule is in whole seconds)
		c.Asynq.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return 2 * time.Second }
	})
	srv.HandleFunc("flaky", func(context.Context, *asynq.Task) error {
		return errors.New("downstream said 500: internal\nerror")
	})
	srv.HandleFunc("broken", func(context.Context, *asynq.Task) error {
		return errors.Join(errors.New("payload has no url"), asynq.SkipRetry)
	})
	require.NoError(t, srv.Start())
	flaky, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask("flaky", nil), asynq.Queue(e.queue), asynq.MaxRetry(1))
	require.NoError(t, err)
	broken, err := e.q.Enqueue(context.Background(), "globex", asynq.NewTask("broken", nil), asynq.Queue(e.queue))
	require.NoError(t, err)
	eventually(t, 15*time.Second, func() bool { return len(e.archived(t)) == 2 }, "both archived")
	eventually(t, 5*time.Second, func() bool { return len(logs.lines("type=flaky")) == 2 }, "both failures of flaky logged: %q", logs.lines(""))

	retry := logs.lines("task=" + flaky.ID)
	require.Len(t, retry, 2)
	require.Contains(t, retry[0], `level=WARN msg="job failed; will retry"`)
	require.Contains(t, retry[0], "task="+flaky.ID+" type=flaky tenant=acme queue="+e.queue+" retried=0 max_retry=1")
	require.Contains(t, retry[0], `err="downstream said 500: internal\nerror"`)
	require.Contains(t, retry[1], `level=ERROR msg="job failed for good"`)
	require.Contains(t, retry[1], "retried=1 max_retry=1")
	final := logs.lines("task=" + broken.ID)
	require.Len(t, final, 1)
	require.Contains(t, final[0], `level=ERROR msg="job failed for good" task=`+broken.ID+" type=broken tenant=globex")
	require.Contains(t, final[0], `err="payload has no url\nskip retry for the task"`)
}

func TestHandlerErrorLogIsRateLimited(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	var logs logged
	srv := e.server(t, func(c *worker.Config) { c.Gate.Logger = logs.logger() })
	srv.HandleFunc("storm", func(context.Context, *asynq.Task) error { return asynq.SkipRetry })
	require.NoError(t, srv.Start())
	start := time.Now()
	e.enqueueType(t, "storm", 50)
	eventually(t, 15*time.Second, func() bool { return len(e.archived(t)) == 50 }, "all archived")
	secs := int(time.Since(start)/time.Second) + 1
	n := len(logs.lines("type=storm"))
	require.GreaterOrEqual(t, n, 1)
	require.LessOrEqual(t, n, secs+1, "at most about one line a second")
	require.Equal(t, 50.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_handler_outcomes_total", map[string]string{"outcome": "skip_retry"}))
}

func throttleDryRun(tenant string) throttle.Request {
	return throttle.Request{Tenant: tenant, ID: "probe", DryRun: true}
}

// enqueueType enqueues n jobs of type typ for tenant acme.
func (e *env) enqueueType(tb testing.TB, typ string, n int) {
	tb.Helper()
	for i := 0; i < n; i++ {
		_, err := e.q.Enqueue(context.Background(), "acme", asynq.NewTask(typ, nil), asynq.Queue(e.queue))
		require.NoError(tb, err)
	}
}
