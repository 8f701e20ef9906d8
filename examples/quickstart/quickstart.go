package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/examples/internal/demo"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// workers is how many worker servers share the tenants' limits.
const workers = 3

// burst is a batch of jobs the producer enqueues at once, at a time after
// the start.
type burst struct {
	at time.Duration
	n  int
}

// tenantSpec is one tenant of the demo: its policy (which the fake API
// enforces too), how long the API takes for one of its requests, and the
// producer's bursts.
type tenantSpec struct {
	name       string
	policyText string
	policy     *throttle.Policy
	hold       time.Duration
	bursts     []burst
}

func (t tenantSpec) jobs() int {
	n := 0
	for _, b := range t.bursts {
		n += b.n
	}
	return n
}

// workload is the demo's tenants: one limited by rate, one by concurrency,
// one by a sliding window, each arriving in bursts. short is the smaller
// workload the tests run.
func workload(short bool) ([]tenantSpec, error) {
	specs := []tenantSpec{
		{name: "acme", policyText: "rate=20/s burst=5", hold: 20 * time.Millisecond,
			bursts: []burst{{0, 150}, {5 * time.Second, 150}, {10 * time.Second, 150}}},
		{name: "globex", policyText: "concurrency=4", hold: 300 * time.Millisecond,
			bursts: []burst{{0, 100}, {8 * time.Second, 100}}},
		{name: "initech", policyText: "window=40/5s", hold: 50 * time.Millisecond,
			bursts: []burst{{0, 60}, {6 * time.Second, 60}}},
	}
	if short {
		specs[0].bursts = []burst{{0, 40}, {1500 * time.Millisecond, 40}, {3 * time.Second, 40}}
		specs[1].bursts = []burst{{0, 30}, {2 * time.Second, 30}}
		specs[2].bursts = []burst{{0, 30}, {2 * time.Second, 30}}
	}
	for i := range specs {
		p, err := throttle.ParsePolicy(specs[i].policyText)
		if err != nil {
			return nil, err
		}
		specs[i].policy = p
	}
	return specs, nil
}

// options configure a run.
type options struct {
	// redisURL is a Redis to use instead of the embedded one.
	redisURL string
	short    bool
	// out receives the live view and the report; live redraws the view in
	// place (a terminal), otherwise a plain line is printed every
	// plainEvery.
	out        io.Writer
	live       bool
	plainEvery time.Duration
	// deadline bounds the whole run; jobs not done by then are reported.
	deadline time.Duration
	// rateLow is the least fraction of its limit a rate-limited tenant
	// must achieve; rateLowDefault when zero.
	rateLow float64
}

// run runs the demo and returns its report.
func run(ctx context.Context, o options) (*report, error) {
	specs, err := workload(o.short)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()

	env, err := demo.Start(ctx, o.redisURL, "quickstart")
	if err != nil {
		return nil, err
	}
	defer env.Close()
	where, qname, prefix, newClient := env.Where, env.Queue, env.Prefix, env.Client

	admin := newClient()
	lim, err := throttle.NewLimiter(admin, &throttle.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	defer lim.Close()
	for _, t := range specs {
		if err := lim.Policies().Set(ctx, t.name, t.policy); err != nil {
			return nil, fmt.Errorf("set policy of %s: %w", t.name, err)
		}
	}

	api, err := startAPI(specs)
	if err != nil {
		return nil, err
	}
	defer api.close()
	httpClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200, IdleConnTimeout: 30 * time.Second}}
	defer httpClient.CloseIdleConnections()

	// The fleet: three workers, each with its own connection pool, as three
	// processes would have.
	logger := slog.New(slog.NewTextHandler(o.out, &slog.HandlerOptions{Level: slog.LevelError}))
	var servers []*worker.Server
	defer func() {
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Add(1)
			go func() { defer wg.Done(); s.Shutdown() }()
		}
		wg.Wait()
	}()
	for i := 0; i < workers; i++ {
		c := newClient()
		// Jobs denied by concurrency look for a free slot every 100 ms
		// (throttle's default is 1 s), so that the short requests of a
		// concurrency-limited tenant keep its slots busy.
		wl, err := throttle.NewLimiter(c, &throttle.Config{Prefix: prefix, ConcurrencyRetry: 100 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		defer wl.Close()
		srv, err := worker.New(c, &worker.Config{
			Limiter: wl,
			Asynq:   asynq.Config{Queues: map[string]int{qname: 1}, LogLevel: asynq.FatalLevel},
			Gate:    worker.GateConfig{Logger: logger},
		})
		if err != nil {
			return nil, err
		}
		// The built-in handlers, sharing one client for the fake API.
		worker.RegisterBuiltins(srv, httpClient, 0)
		if err := srv.Start(); err != nil {
			return nil, err
		}
		servers = append(servers, srv)
	}

	// The producer: every tenant's bursts, on time.
	pc := newClient()
	producer, err := queue.New(pc, &queue.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	defer producer.Close()
	var (
		mu       sync.Mutex
		enqueued = map[string]int{}
		failures []string
		wg       sync.WaitGroup
	)
	for _, t := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := 0
			for _, b := range t.bursts {
				select {
				case <-time.After(time.Until(start.Add(b.at))):
				case <-ctx.Done():
					return
				}
				jobs := make([]queue.Job, b.n)
				for i := range jobs {
					seq++
					id := fmt.Sprintf("%s-%d", t.name, seq)
					payload, _ := json.Marshal(worker.HTTPRequest{
						Method: http.MethodPost, URL: api.url, TimeoutMS: 10_000,
						Headers: map[string]string{"X-Tenant": t.name, "X-Job": id},
					})
					jobs[i] = queue.Job{Tenant: t.name, Task: asynq.NewTask(worker.TypeHTTP, payload),
						Options: []asynq.Option{asynq.Queue(qname), asynq.TaskID(id)}}
				}
				ok := 0
				for _, r := range producer.EnqueueBatch(ctx, jobs) {
					if r.Err != nil {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("enqueue for %s: %v", t.name, r.Err))
						mu.Unlock()
						continue
					}
					ok++
				}
				mu.Lock()
				enqueued[t.name] += ok
				mu.Unlock()
			}
		}()
	}

	// The live view, until every job is done or the deadline.
	v := &view{out: o.out, live: o.live, specs: specs, api: api, lim: lim, start: start}
	v.header(where, api.url)
	every := o.plainEvery
	if o.live {
		every = 250 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	total := 0
	for _, t := range specs {
		total += t.jobs()
	}
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	counts := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		c := map[string]int{}
		for k, n := range enqueued {
			c[k] = n
		}
		return c
	}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			v.draw(ctx, counts())
		case <-poll.C:
			n := 0
			for _, t := range specs {
				n += api.view(t.name).done
			}
			done = n >= total
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	v.draw(context.WithoutCancel(ctx), counts())

	rateLow := o.rateLow
	if rateLow == 0 {
		rateLow = rateLowDefault
	}
	rep := &report{where: where, elapsed: elapsed, failures: failures, short: o.short, rateLow: rateLow}
	waiting, err := waitingJobs(newClient, qname)
	if err != nil {
		rep.failures = append(rep.failures, "count the jobs still queued: "+err.Error())
	}
	for _, t := range specs {
		rep.tenants = append(rep.tenants, tenantReport(t, api.view(t.name), enqueued[t.name], waiting[t.name], rateLow))
	}
	v.final()
	return rep, nil
}

// waitingJobs counts, per tenant, the jobs still in the queue (waiting,
// deferred or running) and those archived.
func waitingJobs(newClient func() redis.UniversalClient, qname string) (map[string][2]int, error) {
	in := asynq.NewInspectorFromRedisClient(newClient())
	out := map[string][2]int{}
	lists := []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		in.ListPendingTasks, in.ListActiveTasks, in.ListScheduledTasks, in.ListRetryTasks, in.ListArchivedTasks,
	}
	for i, list := range lists {
		for page := 1; ; page++ {
			infos, err := list(qname, asynq.Page(page), asynq.PageSize(500))
			if errors.Is(err, asynq.ErrQueueNotFound) {
				return out, nil
			}
			if err != nil {
				return out, err
			}
			for _, info := range infos {
				n := out[info.Headers[taskspec.TenantHeader]]
				if i == len(lists)-1 {
					n[1]++
				} else {
					n[0]++
				}
				out[info.Headers[taskspec.TenantHeader]] = n
			}
			if len(infos) < 500 {
				break
			}
		}
	}
	return out, nil
}
