package worker_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// keyRecorder is an in-process handler that records, per key below a
// tenant ("acme/u1", or the tenant alone for a job without a key), when
// each job started and was admitted (in Redis time: the slot it was
// given, or the decision's time when it had none), how many ran at once
// and how many times each job ran. call, when set, is the job's work.
type keyRecorder struct {
	mu       sync.Mutex
	starts   map[string][]time.Time
	admitted map[string][]time.Time
	ends     map[string][]time.Time
	running  map[string]int
	maxRun   map[string]int
	runs     map[string]int      // by task id
	order    map[string][]string // task ids by scope, in start order
	call     func(ctx context.Context, scope string) error
}

func newKeyRecorder(call func(ctx context.Context, scope string) error) *keyRecorder {
	return &keyRecorder{starts: map[string][]time.Time{}, admitted: map[string][]time.Time{}, ends: map[string][]time.Time{},
		running: map[string]int{}, maxRun: map[string]int{}, runs: map[string]int{}, order: map[string][]string{}, call: call}
}

// scopeOf is the job's key below its tenant, or its tenant when it has
// no key.
func scopeOf(t *asynq.Task) string {
	h := t.Headers()
	if k := h[taskspec.KeyHeader]; k != "" {
		return h[taskspec.TenantHeader] + "/" + k
	}
	return h[taskspec.TenantHeader]
}

func (r *keyRecorder) ProcessTask(ctx context.Context, t *asynq.Task) error {
	scope := scopeOf(t)
	id, _ := asynq.GetTaskID(ctx)
	a, _ := worker.AdmissionFrom(ctx)
	r.mu.Lock()
	r.starts[scope] = append(r.starts[scope], time.Now())
	// the time its start was charged at: its slot when it waited for one
	at := a.Decision.Slot
	if at.IsZero() {
		at = a.Decision.Now
	}
	r.admitted[scope] = append(r.admitted[scope], at)
	r.running[scope]++
	r.running[""]++ // every job, for a pool all of them name
	r.maxRun[scope] = max(r.maxRun[scope], r.running[scope])
	r.maxRun[""] = max(r.maxRun[""], r.running[""])
	r.runs[id]++
	r.order[scope] = append(r.order[scope], id)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running[scope]--
		r.running[""]--
		r.ends[scope] = append(r.ends[scope], time.Now())
		r.mu.Unlock()
	}()
	if r.call != nil {
		return r.call(ctx, scope)
	}
	return nil
}

func sorted(ts []time.Time) []time.Time {
	out := append([]time.Time(nil), ts...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// startsOf, admittedOf and endsOf return scope's times, sorted.
func (r *keyRecorder) startsOf(scope string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sorted(r.starts[scope])
}

func (r *keyRecorder) admittedOf(scope string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sorted(r.admitted[scope])
}

func (r *keyRecorder) endsOf(scope string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sorted(r.ends[scope])
}

// maxRunOf is the most jobs of scope that ran at once so far ("" for
// every job).
func (r *keyRecorder) maxRunOf(scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxRun[scope]
}

// done is how many distinct jobs ran to their end.
func (r *keyRecorder) done() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.ends {
		n += len(e)
	}
	return n
}

// orderOf returns the task ids of scope's jobs in the order they started.
func (r *keyRecorder) orderOf(scope string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.order[scope]...)
}

// logOnFailure logs, when t has failed, how many jobs of each scope
// started and ended: a deadline's message is built before the wait.
func (r *keyRecorder) logOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		scopes := make([]string, 0, len(r.starts))
		for sc := range r.starts {
			scopes = append(scopes, sc)
		}
		sort.Strings(scopes)
		for _, sc := range scopes {
			t.Logf("%s: %d started, %d ended", sc, len(r.starts[sc]), len(r.ends[sc]))
		}
	})
}

// runsByID returns how many times each job ran, by task id.
func (r *keyRecorder) runsByID() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.runs))
	for id, n := range r.runs {
		out[id] = n
	}
	return out
}

// TestKeysShareADownstream: two tenants' keys, each limited by its key's
// policy (acme/* for acme's, */* for globex's, globex/batch for one of
// them), and a pool (@api rate=18/s concurrency=4) share a strict
// downstream (20/s, burst 2) on two workers; the tenants' own policies
// would let them go far faster. Every job runs once, the downstream
// refuses none of their calls, no key starts beyond its rate or runs
// beyond its cap, and every slot (the pool's, the keys') is given back.
func TestKeysShareADownstream(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=100/s burst=10")
	e.policy(t, "globex", "rate=100/s burst=10")
	e.policy(t, "acme/*", "rate=6/s burst=1 concurrency=2")
	e.policy(t, "*/*", "rate=6/s burst=1 concurrency=2")
	e.policy(t, "globex/batch", "rate=4/s burst=1 concurrency=1")
	e.policy(t, "@api", "rate=18/s burst=1 concurrency=4")
	keys := []struct {
		tenant, key string
		rate        float64
		burst, cap  int
		policy      string
	}{
		{"acme", "u1", 6, 1, 2, "acme/*"},
		{"acme", "u2", 6, 1, 2, "acme/*"},
		{"globex", "u1", 6, 1, 2, "*/*"},
		{"globex", "batch", 4, 1, 1, "globex/batch"},
	}
	ds := &strictDownstream{rate: 20, burst: 2, blind: true}
	api := httptest.NewServer(ds)
	defer api.Close()
	rec := newKeyRecorder(func(ctx context.Context, _ string) error {
		if _, err := get(ctx, api.URL); err != nil {
			return err
		}
		// long enough that the keys' and the pool's caps are met
		select {
		case <-time.After(250 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	rec.logOnFailure(t)
	for range 2 {
		srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 4 })
		srv.Handle("call", rec)
		require.NoError(t, srv.Start())
	}
	const perKey = 10
	start := time.Now()
	for i := range perKey {
		for _, k := range keys {
			info, err := e.q.Enqueue(ctx, k.tenant, asynq.NewTask("call", nil), asynq.Queue(e.queue), queue.Key(k.key), queue.Pools("@api"),
				asynq.TaskID(fmt.Sprintf("%s-%s-%d", k.tenant, k.key, i)))
			require.NoError(t, err)
			require.Equal(t, k.key, info.Headers[taskspec.KeyHeader])
		}
	}
	total := perKey * len(keys)
	eventually(t, 60*time.Second, func() bool { return rec.done() == total }, "all %d jobs done", total)
	took := time.Since(start)
	refused := len(ds.answers()) - ds.accepted()
	t.Logf("%d calls of 4 keys through @api in %s (%.1f/s), %d refused by the downstream, at most %d at once", total, took.Round(time.Millisecond), float64(total)/took.Seconds(), refused, rec.maxRunOf(""))

	requireRanOnce(t, rec, total)
	require.Len(t, ds.answers(), total, "one call a job")
	require.Zero(t, refused, "calls the downstream refused")
	require.LessOrEqual(t, rec.maxRunOf(""), 4, "@api's cap")
	for _, k := range keys {
		scope := k.tenant + "/" + k.key
		starts := rec.startsOf(scope)
		require.Len(t, starts, perKey, scope)
		t.Logf("%s (%s): %d jobs from %s to %s, at most %d at once", scope, k.policy, len(starts),
			starts[0].Sub(start).Round(time.Millisecond), starts[len(starts)-1].Sub(start).Round(time.Millisecond), rec.maxRunOf(scope))
		require.Empty(t, nonConformingTol(rec.admittedOf(scope), k.rate, k.burst, throttle.ToleranceDefault), "admissions of %s beyond GCRA(%v/s, burst %d)", scope, k.rate, k.burst)
		require.Zero(t, nonConforming(starts, k.rate, k.burst+1), "handler starts of %s beyond GCRA(%v/s, burst %d) and a worker's scheduling", scope, k.rate, k.burst)
		require.LessOrEqual(t, rec.maxRunOf(scope), k.cap, "%s ran more than its cap at once", scope)
	}

	// every slot is given back once the jobs end
	inFlight := func(name string) int64 {
		st, err := e.lim.Stats(ctx, name)
		require.NoError(t, err)
		require.NotNil(t, st.Concurrency, name)
		return st.Concurrency.InFlight
	}
	for _, k := range keys {
		st, err := e.lim.Stats(ctx, k.tenant+"/"+k.key)
		require.NoError(t, err)
		require.Equal(t, k.policy, st.Policy, "the policy of %s/%s", k.tenant, k.key)
	}
	eventually(t, 5*time.Second, func() bool {
		for _, name := range []string{"@api", "acme/u1", "acme/u2", "globex/u1", "globex/batch"} {
			if inFlight(name) != 0 {
				return false
			}
		}
		return true
	}, "every slot of @api and of the keys given back")
}

// blockSlow is a handler whose acme/slow jobs run until release is
// closed (or their context ends); the others end at once.
func blockSlow(release <-chan struct{}) func(context.Context, string) error {
	return func(ctx context.Context, scope string) error {
		if scope != "acme/slow" {
			return nil
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// TestKeyDoesNotHoldBackItsTenant: jobs of one key of acme wait in acme's
// line (they name no pool) ahead of the jobs of acme's other keys. While
// the first key's jobs cannot start (its cap or its rate holds them), the
// other keys' jobs start and finish: they are not stuck behind it. The key
// never runs beyond its own limits, and every job runs once.
func TestKeyDoesNotHoldBackItsTenant(t *testing.T) {
	t.Run("concurrency", func(t *testing.T) {
		e := setup(t, nil)
		ctx := context.Background()
		e.policy(t, "acme", "concurrency=4")
		e.policy(t, "acme/*", "concurrency=1")
		release := make(chan struct{})
		rec := newKeyRecorder(blockSlow(release))
		rec.logOnFailure(t)
		const slow, perOther = 12, 4
		others := []string{"a", "b", "c"}
		slowIDs := enqueueKeyed(t, e, "acme", "slow", slow)
		otherIDs := map[string][]string{}
		for _, k := range others {
			otherIDs[k] = enqueueKeyed(t, e, "acme", k, perOther)
		}
		st, err := e.lim.Stats(ctx, "acme")
		require.NoError(t, err)
		require.Equal(t, int64(slow+perOther*len(others)), st.Waiting, "every job waits in acme's line")
		for range 2 {
			srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 4 })
			srv.Handle("job", rec)
			require.NoError(t, srv.Start())
		}
		start := time.Now()
		othersDone := func() int {
			n := 0
			for _, k := range others {
				n += len(rec.endsOf("acme/" + k))
			}
			return n
		}
		eventually(t, 10*time.Second, func() bool { return othersDone() == perOther*len(others) }, "the other keys' %d jobs done, behind acme/slow's blocked one", perOther*len(others))
		t.Logf("the other keys' %d jobs done in %s while acme/slow's first job ran", perOther*len(others), time.Since(start).Round(time.Millisecond))
		require.Len(t, rec.startsOf("acme/slow"), 1, "acme/slow runs one job at a time")
		require.Empty(t, rec.endsOf("acme/slow"))
		st, err = e.lim.Stats(ctx, "acme")
		require.NoError(t, err)
		require.Equal(t, int64(slow-1), st.Waiting, "acme/slow's backlog still waits")

		close(release)
		total := slow + perOther*len(others)
		eventually(t, 20*time.Second, func() bool { return rec.done() == total }, "all %d jobs done", total)
		t.Logf("all %d jobs done in %s", total, time.Since(start).Round(time.Millisecond))
		for _, k := range append([]string{"slow"}, others...) {
			require.Equal(t, 1, rec.maxRunOf("acme/"+k), "acme/%s ran more than one job at once", k)
		}
		// one at a time, each key's jobs start in the order they joined
		require.Equal(t, slowIDs, rec.orderOf("acme/slow"), "acme/slow's jobs in order")
		for _, k := range others {
			require.Equal(t, otherIDs[k], rec.orderOf("acme/"+k), "acme/%s's jobs in order", k)
		}
		requireRanOnce(t, rec, total)
		eventually(t, 5*time.Second, func() bool {
			for _, name := range []string{"acme", "acme/slow", "acme/a", "acme/b", "acme/c"} {
				st, err := e.lim.Stats(ctx, name)
				require.NoError(t, err)
				if st.Concurrency == nil || st.Concurrency.InFlight != 0 || st.Waiting != 0 {
					return false
				}
			}
			return true
		}, "every slot given back and the line empty")
	})

	// The other key's jobs join the line after a turn has sent the held
	// key's backlog to its end, while the key's one job runs: they too
	// start while the backlog waits. (Before, a job joining a line that
	// was not empty left its tenant's due time as the last turn set it,
	// for the held key's jobs, so they waited for that turn, about 5 s
	// here, the held slot's lease end, or the held key's backlog.)
	t.Run("joining later", func(t *testing.T) {
		e := setup(t, nil)
		e.policy(t, "acme", "concurrency=4")
		e.policy(t, "acme/*", "concurrency=1")
		release := make(chan struct{})
		rec := newKeyRecorder(blockSlow(release))
		const slow, later = 8, 6
		slowIDs := enqueueKeyed(t, e, "acme", "slow", slow)
		for range 2 {
			srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 4 })
			srv.Handle("job", rec)
			require.NoError(t, srv.Start())
		}
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		t.Cleanup(open) // before the servers shut down
		rec.logOnFailure(t)
		// the first turn promoted acme/slow's first job and sent the rest
		// to the end of the line
		eventually(t, 5*time.Second, func() bool { return len(rec.startsOf("acme/slow")) == 1 }, "acme/slow's first job started")
		start := time.Now()
		laterIDs := enqueueKeyed(t, e, "acme", "a", later)
		// jobs of a free key start at once (tens of milliseconds in the
		// cases above); the deadline is well before the tenant's next due
		// time (about 5 s) and the held slot's lease end (30 s), either of
		// which brings them in by another turn
		eventually(t, 2*time.Second, func() bool { return len(rec.endsOf("acme/a")) == later },
			"acme/a's %d jobs, which joined the line behind acme/slow's backlog, done", later)
		t.Logf("acme/a's %d jobs done in %s while acme/slow's first job ran", later, time.Since(start).Round(time.Millisecond))
		require.Len(t, rec.startsOf("acme/slow"), 1, "acme/slow runs one job at a time")

		open()
		total := slow + later
		eventually(t, 20*time.Second, func() bool { return rec.done() == total }, "all %d jobs done", total)
		require.Equal(t, 1, rec.maxRunOf("acme/slow"))
		require.Equal(t, 1, rec.maxRunOf("acme/a"))
		require.Equal(t, slowIDs, rec.orderOf("acme/slow"), "acme/slow's jobs in order")
		require.Equal(t, laterIDs, rec.orderOf("acme/a"), "acme/a's jobs in order")
		requireRanOnce(t, rec, total)
	})

	t.Run("rate", func(t *testing.T) {
		e := setup(t, nil)
		ctx := context.Background()
		e.policy(t, "acme", "concurrency=4")
		e.policy(t, "acme/slow", "rate=2/s burst=1")
		rec := newKeyRecorder(func(ctx context.Context, _ string) error {
			select {
			case <-time.After(20 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		rec.logOnFailure(t)
		const slow, perOther = 6, 5
		others := []string{"a", "b"}
		slowIDs := enqueueKeyed(t, e, "acme", "slow", slow)
		for _, k := range others {
			enqueueKeyed(t, e, "acme", k, perOther)
		}
		enqueueKeyed(t, e, "acme", "", perOther) // a job without a key goes on too
		st, err := e.lim.Stats(ctx, "acme")
		require.NoError(t, err)
		require.Equal(t, int64(slow+perOther*(len(others)+1)), st.Waiting, "every job waits in acme's line")
		for range 2 {
			srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 4 })
			srv.Handle("job", rec)
			require.NoError(t, srv.Start())
		}
		start := time.Now()
		scopes := []string{"acme/a", "acme/b", "acme"}
		othersDone := func() int {
			n := 0
			for _, s := range scopes {
				n += len(rec.endsOf(s))
			}
			return n
		}
		eventually(t, 10*time.Second, func() bool { return othersDone() == perOther*len(scopes) }, "the other %d jobs done, behind acme/slow's backlog", perOther*len(scopes))
		othersTook := time.Since(start)
		slowStarted := len(rec.startsOf("acme/slow"))
		t.Logf("the other %d jobs done in %s, when acme/slow (2/s) had started %d of %d", perOther*len(scopes), othersTook.Round(time.Millisecond), slowStarted, slow)
		require.Less(t, slowStarted, slow, "acme/slow's backlog still waits")
		total := slow + perOther*len(scopes)
		eventually(t, 20*time.Second, func() bool { return rec.done() == total }, "all %d jobs done", total)
		slowStarts := rec.startsOf("acme/slow")
		t.Logf("all %d jobs done in %s; acme/slow's from %s to %s", total, time.Since(start).Round(time.Millisecond),
			slowStarts[0].Sub(start).Round(time.Millisecond), slowStarts[len(slowStarts)-1].Sub(start).Round(time.Millisecond))
		require.Empty(t, nonConformingTol(rec.admittedOf("acme/slow"), 2, 1, throttle.ToleranceDefault), "admissions of acme/slow beyond GCRA(2/s, burst 1)")
		require.Zero(t, nonConforming(slowStarts, 2, 2), "handler starts of acme/slow beyond GCRA(2/s, burst 1) and a worker's scheduling")
		require.LessOrEqual(t, rec.maxRunOf(""), 4, "acme's cap")
		require.Equal(t, slowIDs, rec.orderOf("acme/slow"), "acme/slow's jobs in order")
		requireRanOnce(t, rec, total)
		eventually(t, 5*time.Second, func() bool {
			st, err := e.lim.Stats(ctx, "acme")
			require.NoError(t, err)
			return st.Concurrency.InFlight == 0 && st.Waiting == 0
		}, "every slot of acme given back and its line empty")
	})
}

// enqueueKeyed enqueues n jobs of tenant with key ("" for none) in one
// batch and returns their task ids; with no worker serving the queue yet
// they wait in the tenant's line.
func enqueueKeyed(t *testing.T, e *env, tenant, key string, n int) []string {
	t.Helper()
	opts := []asynq.Option{asynq.Queue(e.queue)}
	if key != "" {
		opts = append(opts, queue.Key(key))
	}
	jobs := make([]queue.Job, n)
	for i := range jobs {
		jobs[i] = queue.Job{Tenant: tenant, Task: asynq.NewTask("job", nil), Options: opts}
	}
	ids := make([]string, n)
	for i, res := range e.q.EnqueueBatch(context.Background(), jobs) {
		require.NoError(t, res.Err, "job %d of %s/%s", i, tenant, key)
		require.Equal(t, asynq.TaskStateScheduled, res.Info.State, "job %d of %s/%s waits in its tenant's line", i, tenant, key)
		ids[i] = res.Info.ID
	}
	return ids
}

// requireRanOnce checks that total distinct jobs ran, each once.
func requireRanOnce(t *testing.T, rec *keyRecorder, total int) {
	t.Helper()
	runs := rec.runsByID()
	require.Len(t, runs, total)
	for id, n := range runs {
		require.Equal(t, 1, n, "job %s ran %d times", id, n)
	}
}

// TestKeysWinNoExtraShare: at saturation the waiting room shares the fleet
// per tenant, whatever keys a tenant's jobs carry: a tenant that spreads
// its jobs over 30 keys (each with limits of its own) starts about as many
// as a tenant whose jobs carry none (fair share is not counted per key).
func TestKeysWinNoExtraShare(t *testing.T) {
	e := setup(t, nil)
	// the same tenant policy for both (a finishing job hands its slot on
	// in turn alike), and limits of its own for each key of one of them
	e.policy(t, "split", "concurrency=50")
	e.policy(t, "whole", "concurrency=50")
	e.policy(t, "split/*", "concurrency=4")
	rec := newTenantRecorder(30 * time.Millisecond)
	jobs := make([]queue.Job, 0, 600)
	for i := range 300 {
		jobs = append(jobs,
			queue.Job{Tenant: "split", Task: asynq.NewTask("job", nil), Options: []asynq.Option{asynq.Queue(e.queue), queue.Key(fmt.Sprintf("k%d", i%30))}},
			queue.Job{Tenant: "whole", Task: asynq.NewTask("job", nil), Options: []asynq.Option{asynq.Queue(e.queue)}})
	}
	for i, res := range e.q.EnqueueBatch(context.Background(), jobs) {
		require.NoError(t, res.Err, "job %d", i)
	}
	srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 3 })
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	total := func() int { return len(rec.startsOf("split")) + len(rec.startsOf("whole")) }
	eventually(t, 30*time.Second, func() bool { return total() >= 30 }, "the first 30 starts")
	s0, w0 := len(rec.startsOf("split")), len(rec.startsOf("whole"))
	eventually(t, 60*time.Second, func() bool { return total() >= 30+200 }, "200 more starts")
	s, w := len(rec.startsOf("split"))-s0, len(rec.startsOf("whole"))-w0
	ratio := float64(s) / float64(max(w, 1))
	t.Logf("a saturated fleet of 3: %d starts of the tenant with 30 keys, %d of the tenant without (%.2f:1)", s, w, ratio)
	require.GreaterOrEqual(t, ratio, 0.6, "a share per tenant")
	require.LessOrEqual(t, ratio, 1.6, "no extra share for many keys")
}
