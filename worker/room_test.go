package worker_test

import (
	"context"
	"fmt"
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

// tenantRecorder is an in-process handler that records, per tenant, when
// each job started (and was admitted, in Redis time), how many ran at once
// and how many times each job ran.
type tenantRecorder struct {
	mu       sync.Mutex
	starts   map[string][]time.Time
	admitted map[string][]time.Time
	running  map[string]int
	maxRun   map[string]int
	runs     map[string]int // by task id
	sleep    time.Duration
}

func newTenantRecorder(sleep time.Duration) *tenantRecorder {
	return &tenantRecorder{starts: map[string][]time.Time{}, admitted: map[string][]time.Time{},
		running: map[string]int{}, maxRun: map[string]int{}, runs: map[string]int{}, sleep: sleep}
}

func (r *tenantRecorder) ProcessTask(ctx context.Context, t *asynq.Task) error {
	tenant := t.Headers()[taskspec.TenantHeader]
	id, _ := asynq.GetTaskID(ctx)
	a, _ := worker.AdmissionFrom(ctx)
	r.mu.Lock()
	r.starts[tenant] = append(r.starts[tenant], time.Now())
	r.admitted[tenant] = append(r.admitted[tenant], a.Decision.Now)
	r.running[tenant]++
	r.maxRun[tenant] = max(r.maxRun[tenant], r.running[tenant])
	r.runs[id]++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running[tenant]--
		r.mu.Unlock()
	}()
	if r.sleep > 0 {
		select {
		case <-time.After(r.sleep):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// admittedOf returns the Redis times of tenant's admissions, sorted.
func (r *tenantRecorder) admittedOf(tenant string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]time.Time(nil), r.admitted[tenant]...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// done is how many distinct jobs ran.
func (r *tenantRecorder) done() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs)
}

// startsOf returns tenant's starts, sorted.
func (r *tenantRecorder) startsOf(tenant string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]time.Time(nil), r.starts[tenant]...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// TestRoomTenantAfterTenant is the scenario that made the waiting room:
// three tenants' bursts enqueued one after another (as enqueue --file
// does), each under its own rate and concurrency cap. Before the waiting
// room the second tenant's first job waited for the whole first burst; now
// every tenant starts within a second, and no start goes beyond any
// tenant's rate or cap.
func TestRoomTenantAfterTenant(t *testing.T) {
	e := setup(t, nil)
	tenants := []struct {
		name  string
		rate  float64
		burst int
		cap   int
		jobs  int
	}{
		{"acme", 50, 5, 5, 150},
		{"globex", 20, 2, 3, 60},
		{"initech", 10, 1, 2, 30},
	}
	for _, tn := range tenants {
		e.policy(t, tn.name, fmt.Sprintf("rate=%v/s burst=%d concurrency=%d", tn.rate, tn.burst, tn.cap))
	}
	rec := newTenantRecorder(100 * time.Millisecond)
	for range 3 {
		srv := e.server(t, func(c *worker.Config) { c.Asynq.Concurrency = 10 })
		srv.Handle("job", rec)
		require.NoError(t, srv.Start())
	}
	start := time.Now()
	total := 0
	for _, tn := range tenants {
		jobs := make([]queue.Job, tn.jobs)
		for i := range jobs {
			jobs[i] = queue.Job{Tenant: tn.name, Task: asynq.NewTask("job", nil), Options: []asynq.Option{asynq.Queue(e.queue)}}
		}
		for i, res := range e.q.EnqueueBatch(context.Background(), jobs) {
			require.NoError(t, res.Err, "job %d of %s", i, tn.name)
		}
		total += tn.jobs
	}
	eventually(t, 60*time.Second, func() bool { return rec.done() == total }, "all %d jobs done (done %d)", total, rec.done())
	for _, tn := range tenants {
		starts := rec.startsOf(tn.name)
		require.Len(t, starts, tn.jobs, tn.name)
		first := starts[0].Sub(start)
		t.Logf("%s: first start after %s, last after %s, at most %d running", tn.name, first.Round(time.Millisecond), starts[len(starts)-1].Sub(start).Round(time.Millisecond), rec.maxRun[tn.name])
		require.Less(t, first, time.Second, "tenant %s's first job started %s after the start", tn.name, first)
		admitted := rec.admittedOf(tn.name)
		require.Empty(t, nonConformingTol(admitted, tn.rate, tn.burst, throttle.ToleranceDefault), "admissions of %s beyond GCRA(%v/s, burst %d)", tn.name, tn.rate, tn.burst)
		require.Zero(t, nonConforming(starts, tn.rate, tn.burst+1), "handler starts of %s beyond GCRA(%v/s, burst %d) and a worker's scheduling", tn.name, tn.rate, tn.burst)
		require.LessOrEqual(t, rec.maxRun[tn.name], tn.cap, "tenant %s ran more than its cap at once", tn.name)
	}
	for id, n := range rec.runs {
		require.Equal(t, 1, n, "job %s ran %d times", id, n)
	}
}
