package worker_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/asynqtest"
	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// full runs the fleet tests at the sizes the design asks for (2,000 jobs
// for smoothness, 50,000 for the noisy neighbour, asynq's real crash
// recovery); without it they run at sizes that keep `go test -race ./...`
// quick.
var full = flag.Bool("sluice.full", false, "run the fleet tests at full size (minutes)")

func TestMain(m *testing.M) {
	redistest.Main(m, goleak.IgnoreCurrent())
}

// resolve returns the policies lim decides tenant's jobs by, from its
// cache, as the gate resolves them.
func resolve(ctx context.Context, lim *throttle.Limiter, tenant string) (*jobpath.Policies[throttle.Policy, throttle.LearnedLimit, throttle.AdaptiveLimit], error) {
	type policies = jobpath.Policies[throttle.Policy, throttle.LearnedLimit, throttle.AdaptiveLimit]
	return jobpath.Of(lim).(jobpath.Engine[throttle.Request, throttle.Decision, *policies]).Resolve(ctx, tenant)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type env struct {
	client    redis.UniversalClient // sluice's keys: a Cluster client in the Cluster pass
	asynq     redis.UniversalClient // asynq's queues: the same Redis, see asynqtest.Client
	prefix    string
	queue     string // a queue no other test uses (asynq's keys have no prefix)
	store     *throttle.PolicyStore
	lim       *throttle.Limiter
	q         *queue.Client
	inspector *asynq.Inspector
}

// setup builds a limiter and a producer over client, with a private key
// prefix and queue name. When client is nil it uses the shared test server,
// or the shared Cluster in the Cluster pass (SLUICE_TEST_CLUSTER=1), with
// asynq's client made apart (see asynqtest.Client).
func setup(tb testing.TB, client redis.UniversalClient) *env {
	tb.Helper()
	asynqRedis := client
	if client == nil {
		client, asynqRedis = redistest.UniversalClient(tb), asynqtest.Client(tb)
	}
	prefix := redistest.Prefix(tb)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	require.NoError(tb, err)
	q, err := queue.New(client, &queue.Config{Limiter: lim, AsynqRedis: asynqRedis})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		require.NoError(tb, q.Close())
		require.NoError(tb, lim.Close())
	})
	return &env{client: client, asynq: asynqRedis, prefix: prefix, queue: "q-" + prefix, store: lim.Policies(), lim: lim, q: q,
		inspector: asynq.NewInspectorFromRedisClient(asynqRedis)}
}

func (e *env) policy(tb testing.TB, name, text string) {
	tb.Helper()
	p, err := throttle.ParsePolicy(text)
	require.NoError(tb, err)
	require.NoError(tb, e.store.Set(context.Background(), name, p))
}

// server returns a worker over the env's limiter and queue, quiet, shut
// down when the test ends; mod adjusts its config.
func (e *env) server(tb testing.TB, mod func(*worker.Config)) *worker.Server {
	tb.Helper()
	cfg := worker.Config{
		Limiter:    e.lim,
		AsynqRedis: e.asynq,
		Asynq: asynq.Config{
			Queues:   map[string]int{e.queue: 1},
			LogLevel: asynq.FatalLevel,
			// Real failures come back quickly in tests.
			RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 100 * time.Millisecond },
		},
		Gate: worker.GateConfig{Logger: quiet},
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := worker.New(e.client, &cfg)
	require.NoError(tb, err)
	tb.Cleanup(srv.Shutdown)
	return srv
}

// servers starts n workers of the env (each adjusted by mod) running h
// for "job" tasks.
func (e *env) servers(tb testing.TB, n int, mod func(*worker.Config), h asynq.Handler) []*worker.Server {
	tb.Helper()
	out := make([]*worker.Server, n)
	for i := range out {
		out[i] = e.server(tb, mod)
		out[i].Handle("job", h)
		require.NoError(tb, out[i].Start())
	}
	return out
}

// enqueueBatch enqueues n "job" tasks of tenant in one queue.Client batch.
func (e *env) enqueueBatch(tb testing.TB, tenant string, n int) {
	tb.Helper()
	jobs := make([]queue.Job, n)
	for i := range jobs {
		jobs[i] = queue.Job{Tenant: tenant, Task: asynq.NewTask("job", nil), Options: []asynq.Option{asynq.Queue(e.queue)}}
	}
	for i, res := range e.q.EnqueueBatch(context.Background(), jobs) {
		require.NoError(tb, res.Err, "job %d of %s", i, tenant)
	}
}

func (e *env) enqueue(tb testing.TB, tenant string, n int, payload string, opts ...asynq.Option) []string {
	tb.Helper()
	ids := make([]string, n)
	for i := range ids {
		info, err := e.q.Enqueue(context.Background(), tenant, asynq.NewTask("job", []byte(payload)), append([]asynq.Option{asynq.Queue(e.queue)}, opts...)...)
		require.NoError(tb, err)
		ids[i] = info.ID
	}
	return ids
}

// enqueueDirect enqueues n jobs of tenant with asynq's own client, tagged
// with the tenant header, as an application that does not use queue.Client
// does: they skip the waiting room, and the gate alone decides on them.
func (e *env) enqueueDirect(tb testing.TB, tenant string, n int, payload string, opts ...asynq.Option) []string {
	tb.Helper()
	ac := asynq.NewClientFromRedisClient(e.asynq)
	ids := make([]string, n)
	for i := range ids {
		task := asynq.NewTaskWithHeaders("job", []byte(payload), map[string]string{taskspec.TenantHeader: tenant})
		info, err := ac.Enqueue(task, append([]asynq.Option{asynq.Queue(e.queue)}, opts...)...)
		require.NoError(tb, err)
		ids[i] = info.ID
	}
	return ids
}

// queueInfo returns the state counts of the env's queue.
func (e *env) queueInfo(tb testing.TB) *asynq.QueueInfo {
	tb.Helper()
	info, err := e.inspector.GetQueueInfo(e.queue)
	require.NoError(tb, err)
	return info
}

// eventually waits for cond, failing the test after timeout.
func eventually(tb testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	poll(tb, timeout, 10*time.Millisecond, cond, format, args...)
}

// poll checks cond every interval until it holds, failing the test after
// timeout.
func poll(tb testing.TB, timeout, interval time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for: %s", timeout, fmt.Sprintf(format, args...))
		}
		time.Sleep(interval)
	}
}

// recorder is an in-process handler that records what the handlers saw.
type recorder struct {
	mu      sync.Mutex
	starts  map[string][]time.Time // by job identity
	retried map[string][]int
	taskIDs map[string][]string
	done    map[string]int
	running int
	maxRun  int
	// before, when set, runs at the start of each call; a non-nil error is
	// returned instead of running the job.
	before func(ctx context.Context, id string, attempt int) error
	sleep  time.Duration
}

func newRecorder(sleep time.Duration) *recorder {
	return &recorder{starts: map[string][]time.Time{}, retried: map[string][]int{}, taskIDs: map[string][]string{}, done: map[string]int{}, sleep: sleep}
}

func identity(ctx context.Context, t *asynq.Task) string {
	if id := t.Headers()[taskspec.IDHeader]; id != "" {
		return id
	}
	id, _ := asynq.GetTaskID(ctx)
	return id
}

func (r *recorder) ProcessTask(ctx context.Context, t *asynq.Task) error {
	id := identity(ctx, t)
	taskID, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	r.mu.Lock()
	r.starts[id] = append(r.starts[id], time.Now())
	r.retried[id] = append(r.retried[id], retried)
	r.taskIDs[id] = append(r.taskIDs[id], taskID)
	attempt := len(r.starts[id])
	r.running++
	r.maxRun = max(r.maxRun, r.running)
	before := r.before
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}()
	if before != nil {
		if err := before(ctx, id, attempt); err != nil {
			return err
		}
	}
	if r.sleep > 0 {
		select {
		case <-time.After(r.sleep):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	r.done[id]++
	r.mu.Unlock()
	return nil
}

func (r *recorder) doneCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.done)
}

// startTimes returns every recorded start, sorted.
func (r *recorder) startTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Time
	for _, s := range r.starts {
		out = append(out, s...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// nonConforming replays start times through a reference GCRA with the
// given rate (per second) and burst, and counts the starts it would have
// refused.
func nonConforming(starts []time.Time, rate float64, burst int) int {
	return len(nonConformingAt(starts, rate, burst))
}

// nonConformingAt returns the indexes of the starts nonConforming counts.
func nonConformingAt(starts []time.Time, rate float64, burst int) []int {
	return nonConformingTol(starts, rate, burst, 0)
}

// nonConformingTol is nonConformingAt allowing each start tol early: the
// started-jobs meter's tolerance (throttle.Config.Tolerance), for
// admission times, which the limiter's meter decides on.
func nonConformingTol(starts []time.Time, rate float64, burst int, tol time.Duration) []int {
	return nonConformingWithin(starts, rate, burst, min(tol, time.Duration(float64(time.Second)/rate/4)))
}

// nonConformingWithin is nonConformingAt allowing each start slack early
// (in full, where nonConformingTol allows at most a quarter interval).
func nonConformingWithin(starts []time.Time, rate float64, burst int, slack time.Duration) []int {
	if len(starts) == 0 {
		return nil
	}
	interval := float64(time.Second) / rate
	tau := interval*float64(burst-1) + float64(slack)
	tat := float64(starts[0].UnixNano())
	var bad []int
	for i, s := range starts {
		t := float64(s.UnixNano())
		if t < tat-tau-1000 { // 1µs for float rounding
			bad = append(bad, i)
			continue
		}
		tat = max(tat, t) + interval
	}
	return bad
}

// metric sums the samples of a counter or gauge whose labels include want.
func metric(tb testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	tb.Helper()
	families, err := g.Gather()
	require.NoError(tb, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				total += m.GetCounter().GetValue()
			case m.Gauge != nil:
				total += m.GetGauge().GetValue()
			case m.Histogram != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

// exampleTB lets Example functions, which get no *testing.T, use redistest:
// it implements the few testing.TB methods redistest calls and panics on a
// failure. The embedded nil TB is never called.
type exampleTB struct {
	testing.TB
	name     string
	cleanups []func()
}

func (e *exampleTB) Helper()                        {}
func (e *exampleTB) Name() string                   { return e.name }
func (e *exampleTB) Cleanup(f func())               { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

func (e *exampleTB) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// exampleEnv gives an Example a Redis client (of the shared Cluster in the
// Cluster pass), a key prefix and a queue name of its own; call the
// returned function when done.
func exampleEnv(name string) (client redis.UniversalClient, prefix, queueName string, done func()) {
	tb := &exampleTB{name: name}
	client, prefix = redistest.UniversalClient(tb), redistest.Prefix(tb)
	return client, prefix, "q-" + strings.ReplaceAll(prefix, ".", "-"), tb.close
}
