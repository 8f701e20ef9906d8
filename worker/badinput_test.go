package worker_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lua"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// Bad input at the wire: what reaches the workers from producers that
// bypassed queue.Client, or from Redis itself.

func TestBadTenantRunsUnderGlobalOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "@global", "concurrency=1 lease=5s")
	e.policy(t, "acme", "rate=100/s")
	var logs bytes.Buffer
	var logMu sync.Mutex
	rec := newRecorder(0)
	var mu sync.Mutex
	admittedAs := map[string][]string{}
	rec.before = func(ctx context.Context, id string, attempt int) error {
		a, _ := worker.AdmissionFrom(ctx)
		mu.Lock()
		admittedAs[id] = append(admittedAs[id], a.Tenant)
		mu.Unlock()
		return nil
	}
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
		// A tenant taken from the payload can be any bytes: asynq's own
		// encoding refuses a header that is not valid UTF-8 (below).
		c.Gate.TenantFunc = func(ctx context.Context, task *asynq.Task) string {
			if task.Type() == "raw" {
				return string(task.Payload())
			}
			return task.Headers()[taskspec.TenantHeader]
		}
	})
	srv.Handle("job", rec)
	srv.Handle("raw", rec)
	require.NoError(t, srv.Start())

	ac := asynq.NewClientFromRedisClient(e.asynq)
	jobs := []struct {
		id, typ, payload string
		headers          map[string]string
		want             string // the tenant the job is admitted for
		bad              bool   // logged and counted as a tenant that cannot be used
	}{
		{id: "missing", typ: "job"},
		{id: "empty", typ: "job", headers: map[string]string{taskspec.TenantHeader: ""}},
		{id: "oversized", typ: "job", headers: map[string]string{taskspec.TenantHeader: strings.Repeat("x", throttle.MaxTenantLen+1)}, bad: true},
		{id: "reserved-at", typ: "job", headers: map[string]string{taskspec.TenantHeader: "@x"}, bad: true},
		{id: "reserved-star", typ: "job", headers: map[string]string{taskspec.TenantHeader: "*"}, bad: true},
		{id: "invalid-utf8", typ: "raw", payload: "a\xffb", bad: true},
		{id: "newline", typ: "job", headers: map[string]string{taskspec.TenantHeader: "acme\n"}, bad: true},
		{id: "c1", typ: "job", headers: map[string]string{taskspec.TenantHeader: "a\u0085b"}, bad: true},
		{id: "good", typ: "job", headers: map[string]string{taskspec.TenantHeader: "acme"}, want: "acme"},
	}
	bad := 0
	for _, j := range jobs {
		_, err := ac.Enqueue(asynq.NewTaskWithHeaders(j.typ, []byte(j.payload), j.headers), asynq.Queue(e.queue), asynq.TaskID(j.id), asynq.MaxRetry(0))
		require.NoError(t, err, j.id)
		if j.bad {
			bad++
		}
	}
	eventually(t, 15*time.Second, func() bool { return rec.doneCount() == len(jobs) }, "every job runs")

	mu.Lock()
	for _, j := range jobs {
		require.Equal(t, []string{j.want}, admittedAs[j.id], "job %s ran once, admitted for %q", j.id, j.want)
	}
	mu.Unlock()
	require.Equal(t, 1, rec.maxRun, "@global's limit applies to every one of them")
	g := srv.Gate().Gatherer()
	// Counted per delivery: a job waiting for @global's slot may come twice.
	require.GreaterOrEqual(t, metric(t, g, "sluice_worker_errors_total", map[string]string{"kind": "tenant_header"}), float64(bad))
	info := e.queueInfo(t)
	require.Zero(t, info.Archived)
	logMu.Lock()
	require.Contains(t, logs.String(), "job with unusable tenant runs under @global")
	require.Contains(t, logs.String(), "invalid tenant")
	logMu.Unlock()

	// Invalid UTF-8 cannot travel in a header at all: asynq's encoder and
	// queue.Client refuse it at enqueue, so the producer learns at once.
	_, err := ac.Enqueue(asynq.NewTaskWithHeaders("job", nil, map[string]string{taskspec.TenantHeader: "a\xffb"}), asynq.Queue(e.queue))
	require.ErrorContains(t, err, "invalid UTF-8")
	_, err = e.q.Enqueue(context.Background(), "a\xffb", asynq.NewTask("job", nil), asynq.Queue(e.queue))
	require.ErrorIs(t, err, throttle.ErrInvalidTenant)
}

func TestMissingTenantHeaderIsLoggedAndCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	var logs bytes.Buffer
	var logMu sync.Mutex
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	ac := asynq.NewClientFromRedisClient(e.asynq)
	for i := 0; i < 3; i++ {
		_, err := ac.Enqueue(asynq.NewTask("job", nil), asynq.Queue(e.queue))
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 3 }, "every job runs")
	require.Equal(t, 3.0, metric(t, srv.Gate().Gatherer(), "sluice_worker_errors_total", map[string]string{"kind": "no_tenant"}))
	logMu.Lock()
	require.Contains(t, logs.String(), "job without tenant header runs under @global")
	logMu.Unlock()

	// A worker whose jobs follow @global only by design says so with a
	// TenantFunc, and hears nothing of it.
	e2 := setup(t, nil)
	rec2 := newRecorder(0)
	srv2 := e2.server(t, func(c *worker.Config) {
		c.Gate.TenantFunc = func(context.Context, *asynq.Task) string { return "" }
	})
	srv2.Handle("job", rec2)
	require.NoError(t, srv2.Start())
	_, err := asynq.NewClientFromRedisClient(e2.asynq).Enqueue(asynq.NewTask("job", nil), asynq.Queue(e2.queue))
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool { return rec2.doneCount() == 1 }, "the job runs")
	require.Zero(t, metric(t, srv2.Gate().Gatherer(), "sluice_worker_errors_total", nil))
}

func TestGarbagePolicyFailsClosedUntilFixed(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=50/s")
	var logs bytes.Buffer
	var logMu sync.Mutex
	rec := newRecorder(0)
	srv := e.server(t, func(c *worker.Config) {
		c.Gate.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
		c.Gate.BackoffMin = 100 * time.Millisecond
		c.Gate.BackoffMax = 400 * time.Millisecond
	})
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	e.enqueue(t, "acme", 2, "")
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 2 }, "the first jobs run")

	// A writer that bypassed the policy store's checks leaves garbage, and
	// bumps the version as every writer does (the store's key layout is in
	// throttle/keys.go).
	policies, version := e.prefix+":{p}:policies", e.prefix+":{p}:version"
	require.NoError(t, e.client.HSet(ctx, policies, "acme", `{"policy": "rate=50/s`).Err())
	require.NoError(t, e.client.Incr(ctx, version).Err())

	// Producers are refused with the reason and the fix...
	eventually(t, 5*time.Second, func() bool {
		_, err := resolve(ctx, e.lim, "acme")
		return err != nil
	}, "the policy cache drops the good policy")
	_, enqueueErr := e.q.Enqueue(ctx, "acme", asynq.NewTask("job", nil), asynq.Queue(e.queue))
	require.ErrorContains(t, enqueueErr, `policy "acme" in Redis is not valid JSON`)
	require.ErrorContains(t, enqueueErr, `sluice policy set "acme"`)

	// ...and jobs already queued (or from other producers) wait, deferred.
	var ids []string
	for i := 0; i < 4; i++ {
		info, err := asynq.NewClientFromRedisClient(e.asynq).Enqueue(asynq.NewTaskWithHeaders("job", nil, map[string]string{taskspec.TenantHeader: "acme"}), asynq.Queue(e.queue), asynq.MaxRetry(i%2))
		require.NoError(t, err)
		ids = append(ids, info.ID)
	}
	g := srv.Gate().Gatherer()
	eventually(t, 10*time.Second, func() bool {
		return metric(t, g, "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonPolicy}) >= 8
	}, "every job deferred twice or more while the policy is garbage")
	require.Equal(t, 2, rec.doneCount(), "nothing runs on a policy that cannot be read")
	require.Zero(t, metric(t, g, "sluice_worker_errors_total", map[string]string{"kind": "redis"}), "not taken for a Redis outage")
	logMu.Lock()
	require.Contains(t, logs.String(), "policy unreadable; job deferred")
	require.Contains(t, logs.String(), "is not valid JSON")
	logMu.Unlock()

	e.policy(t, "acme", "rate=50/s")
	eventually(t, 10*time.Second, func() bool { return rec.doneCount() == 6 }, "every job runs once the policy is fixed")
	require.Zero(t, e.queueInfo(t).Archived)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, id := range ids {
		require.Len(t, rec.starts[id], 1, "job %s ran once", id)
		require.Equal(t, []int{0}, rec.retried[id], "job %s used no retry", id)
	}
}

// scriptWatch sees sluice's script calls on their way to Redis: how many
// EVALSHAs it saw answered NOSCRIPT, and how many EVALs were sent (sluice
// sends EVAL only after NOSCRIPT), of them how many carried several calls
// merged into one run.
type scriptWatch struct {
	shas                        map[string]bool
	noScript, evals, mergedEval atomic.Int64
}

func newScriptWatch() *scriptWatch {
	w := &scriptWatch{shas: map[string]bool{}}
	for _, s := range []*redis.Script{lua.Admit, lua.Renew} {
		w.shas[s.Hash()] = true // the scripts whose ARGV[2] is the number of ops
	}
	return w
}

func (w *scriptWatch) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *scriptWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		w.observe(cmd)
		return err
	}
}

func (w *scriptWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			w.observe(cmd)
		}
		return err
	}
}

func (w *scriptWatch) observe(cmd redis.Cmder) {
	args := cmd.Args()
	switch cmd.Name() {
	case "evalsha":
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			w.noScript.Add(1)
		}
	case "eval":
		src, _ := args[1].(string)
		sum := sha1.Sum([]byte(src))
		if !w.shas[hex.EncodeToString(sum[:])] {
			return
		}
		w.evals.Add(1)
		numKeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
		if len(args) <= 3+numKeys+1 {
			return
		}
		if ops, _ := strconv.Atoi(fmt.Sprint(args[3+numKeys+1])); ops > 1 && cmd.Err() == nil {
			w.mergedEval.Add(1)
		}
	}
}

func TestScriptsFlushedMidRunAreReloaded(t *testing.T) {
	t.Parallel()
	// A Redis of its own: SCRIPT FLUSH would reach other tests' calls.
	var client redis.UniversalClient
	if redistest.ClusterMode() {
		client = redistest.NewCluster(t, nil).Client(t)
	} else {
		client = redistest.NewServer(t, nil).Client(t)
	}
	watch := newScriptWatch()
	client.AddHook(watch)
	e := setup(t, client)
	e.policy(t, "*", "rate=500/s burst=50 concurrency=4 lease=5s")
	rec := newRecorder(5 * time.Millisecond)
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 100 })
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())

	ctx := context.Background()
	stop := make(chan struct{})
	var flushes atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			err := redistest.ForEachMaster(ctx, client, func(ctx context.Context, node redis.Cmdable) error {
				return node.ScriptFlush(ctx).Err()
			})
			if err == nil {
				flushes.Add(1)
			}
		}
	}()
	stopFlushing := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopFlushing()

	// Waves of jobs over many tenants until, on a single server, a merged
	// call has been reloaded too (the limiter merges nothing on a Cluster).
	var ids []string
	deadline := time.Now().Add(30 * time.Second)
	for wave := 0; ; wave++ {
		for i := 0; i < 200; i++ {
			ids = append(ids, e.enqueue(t, fmt.Sprintf("t%d", i%40), 1, "")...)
		}
		eventually(t, 30*time.Second, func() bool { return rec.doneCount() == len(ids) }, "every job of wave %d done", wave)
		// sluice sends EVAL only when EVALSHA met NOSCRIPT.
		if (redistest.ClusterMode() || watch.mergedEval.Load() > 0) && watch.evals.Load() > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no merged call met a flushed script within 30 s (%d flushes, %d NOSCRIPT, %d EVAL)", flushes.Load(), watch.noScript.Load(), watch.evals.Load())
	}
	stopFlushing()

	g := srv.Gate().Gatherer()
	t.Logf("%d jobs over 40 tenants while the scripts were flushed %d times: %d EVALSHA seen answered NOSCRIPT, %d EVAL sent again, %d of them merged calls; every job ran once, no gate error",
		len(ids), flushes.Load(), watch.noScript.Load(), watch.evals.Load(), watch.mergedEval.Load())
	require.Zero(t, metric(t, g, "sluice_worker_errors_total", nil), "the reload is transparent to the gate")
	require.Zero(t, metric(t, g, "sluice_worker_deferrals_total", map[string]string{"reason": worker.ReasonUnavailable}))
	rec.mu.Lock()
	for _, id := range ids {
		require.Len(t, rec.starts[id], 1, "job %s ran once", id)
	}
	rec.mu.Unlock()
	require.Zero(t, e.queueInfo(t).Archived)
}
