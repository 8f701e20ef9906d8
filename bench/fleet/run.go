package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// options of a benchmark run.
type options struct {
	cfg       config
	setups    []string
	allowance time.Duration // the downstream's jitter allowance on rates
	// drain overrides the workload's drain for some set-ups, keyed
	// "kind/setup" (the test gives sluice room on a busy machine without
	// waiting longer for the others).
	drain map[string]time.Duration
	// scenarios to run: kindFleet, kindSaturation, kindEndToEnd
	scenarios []string
	log       io.Writer // progress lines
	// cluster runs the end-to-end rounds on a 3-master Redis Cluster
	cluster bool
	// floodConc, when positive, gives the saturation scenario's flooding
	// tenant a concurrency rule of that many (above the fleet's slots, so
	// that it never binds, but its jobs hold and release slots)
	floodConc int
	// e2ePolicy is the end-to-end rounds' tenants' policy (-e2e-policy;
	// "": e2ePolicy)
	e2ePolicy string
	// cpuprofile, when set, is the directory the worker processes write
	// their CPU profiles into (-cpuprofile)
	cpuprofile string
}

// workerArgs are the worker processes' arguments args with the options
// every worker takes.
func (o options) workerArgs(args []string) []string {
	if o.cpuprofile != "" {
		args = append(args, "-cpuprofile", o.cpuprofile)
	}
	return args
}

// runData is what one set-up's run recorded.
type runData struct {
	setup      string
	enq        []time.Duration // when each job's enqueue began, since start; -1: not enqueued
	enqErrs    int
	firstErr   string
	arrivals   [][]arrival   // per tenant
	allowance  time.Duration // the jitter the downstream forgave on a rate
	served     []uint32      // 2xx answers per job
	lastOK     time.Duration
	deliveries int64
	calls      int64
	gate       map[string]float64 // sluice's gate counters, summed over the workers
	denied     map[string]int64   // set-ups 1 and 2's throttle denials by limit, summed
	samples    []sample           // the queue, Redis and the CPU, every second
	cores      int                // the machine's cores
	workerCPU  time.Duration
	slots      slotSum            // the worker processes' slots, summed
	redisCPU   float64            // seconds, user+sys, during the run
	redisPeak  float64            // bytes, used_memory_peak
	cmdStats   map[string]cmdStat // INFO commandstats over the run, the benchmark's own commands left out
	profile    *redisProfile      // every command of one window, scripts by name
	leftover   map[string]int
	timedOut   bool
	elapsed    time.Duration
	loadBefore string
	loadAfter  string
	problems   []string
}

// idealEnd is when the workload could be done under its limits alone.
func (w *workload) idealEnd() time.Duration {
	per := make([][]time.Duration, len(w.tenants))
	for _, j := range w.jobs {
		per[j.tenant] = append(per[j.tenant], j.at)
	}
	end := time.Duration(0)
	for i, t := range w.tenants {
		starts := idealStarts(per[i], t.rate, t.burst, t.conc, t.hold)
		if n := len(starts); n > 0 {
			end = max(end, starts[n-1]+t.hold)
		}
	}
	return end
}

// runSetup runs the workload through one set-up, from a fresh Redis and
// downstream to the last worker's exit.
func runSetup(ctx context.Context, o options, w *workload, setup string) (*runData, error) {
	label := setup
	if w.kind != kindFleet {
		label = w.kind + " " + setup
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.log, "[%s] %s\n", label, fmt.Sprintf(format, args...))
	}
	rd := &runData{setup: setup, loadBefore: loadAvg(), leftover: map[string]int{}, gate: map[string]float64{},
		denied: map[string]int64{}, cores: runtime.NumCPU(), allowance: o.allowance}
	srv, err := startRedis(ctx)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 64})
	defer rdb.Close()

	dir, err := os.MkdirTemp("", "fleetbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfg := w.cfg
	args := []string{"-setup", setup, "-redis", srv.addr, "-concurrency", strconv.Itoa(cfg.conc), "-procs", strconv.Itoa(cfg.workers)}
	var enq enqueuer
	switch setup {
	case setupSluice:
		lim, err := throttle.NewLimiter(rdb, nil)
		if err != nil {
			return nil, err
		}
		defer lim.Close()
		store := lim.Policies()
		pols := map[string]*throttle.Policy{}
		for _, t := range w.tenants {
			p, err := t.policy()
			if err != nil {
				return nil, fmt.Errorf("policy of %s: %w", t.name, err)
			}
			pols[t.name] = p
		}
		if err := store.Apply(ctx, pols, false); err != nil {
			return nil, fmt.Errorf("store the policies: %w", err)
		}
		qc, err := queue.New(rdb, nil)
		if err != nil {
			return nil, err
		}
		defer qc.Close()
		enq = &sluiceEnqueuer{q: qc}
	default:
		lim := map[string]limits{}
		for _, t := range w.tenants {
			lim[t.name] = limits{Rate: t.rate, Burst: t.burst, Conc: t.conc}
		}
		b, err := json.Marshal(lim)
		if err != nil {
			return nil, err
		}
		file := filepath.Join(dir, "limits.json")
		if err := os.WriteFile(file, b, 0o600); err != nil {
			return nil, err
		}
		args = append(args, "-limits", file)
		ac := asynq.NewClientFromRedisClient(rdb)
		defer ac.Close()
		enq = &plainEnqueuer{c: ac}
	}

	var procs []*workerProc
	stopAll := func() {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, p := range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := p.stop(30 * time.Second)
				mu.Lock()
				defer mu.Unlock()
				rd.deliveries += st.Deliveries
				rd.calls += st.Calls
				rd.workerCPU += p.cpu()
				rd.slots.add(st.Slots)
				for k, v := range st.Gate {
					rd.gate[k] += v
				}
				for k, v := range st.Denied {
					rd.denied[k] += v
				}
				if err != nil {
					rd.problems = append(rd.problems, err.Error())
				}
			}()
		}
		wg.Wait()
		procs = nil
	}
	defer stopAll()
	if procs, err = startWorkers(ctx, o.workerArgs(args), cfg.workers); err != nil {
		return nil, err
	}
	stats0, err := commandStats(ctx, rdb)
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	cpu0 := redisCPU(ctx, rdb)
	// The clock of the run starts now, the downstream's too.
	start := time.Now()
	ds, err := startDownstream(w, o.allowance, start)
	if err != nil {
		return nil, err
	}
	defer ds.close()
	logf("redis %s, %d workers, downstream %s", srv.addr, len(procs), ds.url)
	rd.enq = make([]time.Duration, len(w.jobs))
	for i := range rd.enq {
		rd.enq[i] = -1
	}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan []sample, 1)
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.cmd.Process.Pid
	}
	go func() { sampled <- sampleQueue(sctx, rdb, start, pids) }()
	profiled := make(chan *redisProfile, 1)
	go func() {
		// its own connection: the slow log is read in a transaction
		pc := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 2})
		defer pc.Close()
		if cfg.profileFor <= 0 {
			profiled <- nil
			return
		}
		p, err := profileRedis(sctx, pc, start, cfg.profileAt, cfg.profileFor, nil)
		if err != nil && sctx.Err() == nil {
			logf("profile of Redis: %v", err)
		}
		profiled <- p
	}()
	prod := &producer{w: w, e: enq, url: ds.url, start: start, enq: rd.enq}
	produced := make(chan struct{})
	go func() { prod.run(ctx); close(produced) }()

	drain := cfg.drain
	if d, ok := o.drain[w.kind+"/"+setup]; ok {
		drain = d
	}
	deadline := start.Add(w.idealEnd() + drain)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	report := time.Now()
	producing := true
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-produced:
			producing = false
			produced = nil
		case now := <-tick.C:
			ok := prod.ok.Load()
			doneJobs := ds.done.Load()
			if now.Sub(report) >= 10*time.Second {
				report = now
				logf("t=%3.0fs enqueued %d, done %d", now.Sub(start).Seconds(), ok, doneJobs)
			}
			if !producing && doneJobs >= ok {
				done = true
			}
			if now.After(deadline) {
				rd.timedOut = true
				done = true
			}
		}
	}
	if producing {
		<-produced
	}
	rd.elapsed = time.Since(start)
	rd.lastOK = time.Duration(ds.lastOK.Load())
	rd.enqErrs = int(prod.errs.Load())
	if e := prod.firstErr.Load(); e != nil {
		rd.firstErr = *e
	}
	rd.redisCPU = redisCPU(ctx, rdb) - cpu0
	if stats1, err := commandStats(ctx, rdb); err == nil {
		rd.cmdStats = statsSince(stats1, stats0)
		for _, own := range ownCommands {
			delete(rd.cmdStats, own)
		}
	}
	stopSampling()
	rd.samples = <-sampled
	rd.profile = <-profiled
	stopAll()
	rd.arrivals = ds.snapshot()
	rd.served = make([]uint32, len(ds.served))
	for i := range ds.served {
		rd.served[i] = ds.served[i].Load()
	}
	if v, err := redisInfo(ctx, rdb, "memory", "used_memory_peak"); err == nil {
		rd.redisPeak = v
	}
	rd.leftover = leftovers(rdb)
	rd.loadAfter = loadAvg()
	logf("done in %.1fs: %d deliveries, Redis CPU %.1fs", rd.elapsed.Seconds(), rd.deliveries, rd.redisCPU)
	return rd, nil
}

func redisCPU(ctx context.Context, c *redis.Client) float64 {
	text, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	sys, _ := infoField(text, "used_cpu_sys")
	user, _ := infoField(text, "used_cpu_user")
	return sys + user
}

// leftovers counts the jobs still in asynq's queue, by state.
func leftovers(c *redis.Client) map[string]int {
	out := map[string]int{}
	info, err := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("default")
	if err != nil {
		return out
	}
	out["pending"], out["active"], out["scheduled"], out["retry"], out["archived"] =
		info.Pending, info.Active, info.Scheduled, info.Retry, info.Archived
	return out
}

// loadAvg is the machine's load average (1, 5, 15 min), if known.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// enqueuer sends jobs: plain asynq for set-ups 1 and 2, sluice's
// queue.Client for set-up 3.
type enqueuer interface {
	one(ctx context.Context, tenant string, id string, payload []byte) error
	many(ctx context.Context, tenant string, ids []string, payloads [][]byte) []error
}

// enqueueParallel is how many enqueues run at once.
const enqueueParallel = 16

type plainEnqueuer struct{ c *asynq.Client }

func (p *plainEnqueuer) one(ctx context.Context, tenant, id string, payload []byte) error {
	task := asynq.NewTaskWithHeaders(worker.TypeHTTP, payload, map[string]string{taskspec.TenantHeader: tenant})
	_, err := p.c.EnqueueContext(ctx, task, asynq.TaskID(id))
	return err
}

func (p *plainEnqueuer) many(ctx context.Context, tenant string, ids []string, payloads [][]byte) []error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	next := make(chan int)
	for k := 0; k < enqueueParallel; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				errs[i] = p.one(ctx, tenant, ids[i], payloads[i])
			}
		}()
	}
	for i := range ids {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}

type sluiceEnqueuer struct{ q *queue.Client }

func (s *sluiceEnqueuer) one(ctx context.Context, tenant, id string, payload []byte) error {
	_, err := s.q.Enqueue(ctx, tenant, asynq.NewTask(worker.TypeHTTP, payload), asynq.TaskID(id))
	return err
}

func (s *sluiceEnqueuer) many(ctx context.Context, tenant string, ids []string, payloads [][]byte) []error {
	jobs := make([]queue.Job, len(ids))
	for i := range ids {
		jobs[i] = queue.Job{Tenant: tenant, Task: asynq.NewTask(worker.TypeHTTP, payloads[i]), Options: []asynq.Option{asynq.TaskID(ids[i])}}
	}
	errs := make([]error, len(ids))
	for i, r := range s.q.EnqueueBatch(ctx, jobs) {
		errs[i] = r.Err
	}
	return errs
}

// producer enqueues the workload on schedule: the big burst from its own
// goroutine, in chunks, and every other job at its time from a pool, so
// that the burst's enqueueing does not delay the other tenants' jobs.
type producer struct {
	w     *workload
	e     enqueuer
	url   string
	start time.Time
	enq   []time.Duration

	ok       atomic.Int64
	errs     atomic.Int64
	firstErr atomic.Pointer[string]
}

// burstChunk is how many jobs of the big burst go in one batch.
const burstChunk = 1000

func (p *producer) payload(i int) []byte {
	j := p.w.jobs[i]
	b, _ := json.Marshal(worker.HTTPRequest{
		Method: http.MethodPost, URL: p.url, TimeoutMS: 30_000,
		Headers: map[string]string{"X-Tenant": strconv.Itoa(int(j.tenant)), "X-Job": strconv.Itoa(i)},
	})
	return b
}

func jobID(i int) string { return "j" + strconv.Itoa(i) }

func (p *producer) result(i int, err error) {
	if err == nil {
		p.ok.Add(1)
		return
	}
	p.enq[i] = -1
	p.errs.Add(1)
	msg := fmt.Sprintf("job %d of %s: %v", i, p.w.tenants[p.w.jobs[i].tenant].name, err)
	p.firstErr.CompareAndSwap(nil, &msg)
}

func (p *producer) waitUntil(ctx context.Context, at time.Duration) bool {
	d := time.Until(p.start.Add(at))
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *producer) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if p.w.bigFrom < 0 || !p.waitUntil(ctx, p.w.cfg.bigAt) {
			return
		}
		big := p.w.tenants[0].name
		for from := p.w.bigFrom; from < p.w.bigFrom+p.w.cfg.big; from += burstChunk {
			to := min(from+burstChunk, p.w.bigFrom+p.w.cfg.big)
			ids := make([]string, 0, to-from)
			payloads := make([][]byte, 0, to-from)
			now := time.Since(p.start)
			for i := from; i < to; i++ {
				p.enq[i] = now
				ids, payloads = append(ids, jobID(i)), append(payloads, p.payload(i))
			}
			for k, err := range p.e.many(ctx, big, ids, payloads) {
				p.result(from+k, err)
			}
		}
	}()
	next := make(chan int, 1024)
	for k := 0; k < 2*enqueueParallel; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				p.enq[i] = time.Since(p.start)
				p.result(i, p.e.one(ctx, p.w.tenants[p.w.jobs[i].tenant].name, jobID(i), p.payload(i)))
			}
		}()
	}
	for i, j := range p.w.jobs {
		if j.tenant == 0 {
			continue
		}
		if !p.waitUntil(ctx, j.at) {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
}
