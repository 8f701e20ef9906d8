package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
)

// The end-to-end scenario: how many jobs a second the fleet enqueues and
// runs, from the first enqueue to the last job done, with plain asynq and
// with sluice whose limits never bind, in the same run, round after round.

// kindEndToEnd names the end-to-end scenario.
const kindEndToEnd = "e2e"

// e2eConfig is the size of the end-to-end scenario; the fleet is the fleet
// scenario's (its workers and Concurrency).
type e2eConfig struct {
	jobs    int // jobs per round
	tenants int // the jobs go to the tenants in turn
	pairs   int // rounds of each set-up, per handler, interleaved
}

var e2ePresets = map[string]e2eConfig{
	"full":  {jobs: 30_000, tenants: 100, pairs: 3},
	"small": {jobs: 5_000, tenants: 50, pairs: 2},
	"tiny":  {jobs: 500, tenants: 10, pairs: 1},
}

// e2ePolicy is every tenant's policy in sluice's rounds: a rate and a
// concurrency rule that never bind, so that every job is decided, holds a
// slot and gives it back. -e2e-policy sets another; e2eNoPolicy stores
// none, so that the rounds measure the waiting room's own path (every job
// parked, given its tenant's turn and handed to asynq, charged nothing).
const (
	e2ePolicy   = "rate=1000000/s burst=100000 concurrency=100000"
	e2eNoPolicy = "none"
)

// e2ePolicyOf is the policy of options o's end-to-end rounds.
func e2ePolicyOf(o options) string {
	if o.e2ePolicy == "" {
		return e2ePolicy
	}
	return o.e2ePolicy
}

// targetE2E is the least share of plain asynq's end-to-end jobs/s sluice
// is to keep.
const targetE2E = 0.85

// e2eHandlers are the handlers the scenario measures: the fleet's job (an
// HTTP call the downstream answers at once) and one that does nothing.
var e2eHandlers = []string{handlerHTTP, handlerNoop}

// e2eRound is one round: one set-up, one handler.
type e2eRound struct {
	Setup, Handler string
	Jobs           int
	Enqueued       time.Duration // when the last enqueue returned
	Done           time.Duration // when the last job was done
	EnqErrs        int
	RedisCPU       float64       // seconds, during the round
	WorkerCPU      time.Duration // all worker processes, during the round
	Load           string        // load average before the round
	Problems       []string
	// Profile, in a round that is profiled (not counted in the figures):
	// every command Redis ran from the first enqueue to the last job done.
	Profile *redisProfile
	// Masters, on a Cluster: each master's share of the commands the
	// round made Redis process (scripts' own commands included)
	Masters []float64
}

func (r e2eRound) jobsPerSec() float64 {
	if r.Done <= 0 {
		return 0
	}
	return float64(r.Jobs) / r.Done.Seconds()
}

// e2eTenant names the i-th job's tenant.
func e2eTenant(i, tenants int) string { return fmt.Sprintf("e%03d", i%tenants) }

// runE2E runs the end-to-end scenario's rounds: per handler, pairs of
// rounds, plain asynq and sluice, the first of a pair alternating.
func runE2E(ctx context.Context, o options, ec e2eConfig) ([]e2eRound, error) {
	var out []e2eRound
	for _, h := range e2eHandlers {
		for k := 0; k < ec.pairs; k++ {
			order := []string{setupPlain, setupSluice}
			if k%2 == 1 {
				slices.Reverse(order)
			}
			for _, s := range order {
				r, err := runE2ERound(ctx, o, ec, s, h, false)
				if err != nil {
					return nil, fmt.Errorf("end to end, %s, %s jobs: %w", s, h, err)
				}
				fmt.Fprintf(o.log, "[e2e %s %s] %d jobs in %.2fs: %.0f jobs/s (enqueued by %.2fs), Redis CPU %.1fs\n",
					s, h, r.Jobs, r.Done.Seconds(), r.jobsPerSec(), r.Enqueued.Seconds(), r.RedisCPU)
				out = append(out, r)
			}
		}
	}
	if o.cluster {
		// the slow log is one node's: no profiled round on a Cluster
		return out, nil
	}
	// One more sluice round of the fleet's job, with every command Redis
	// runs logged: where sluice's cost goes (the logging costs Redis too,
	// so the round is not counted).
	r, err := runE2ERound(ctx, o, ec, setupSluice, handlerHTTP, true)
	if err != nil {
		return nil, fmt.Errorf("end to end, profiled round: %w", err)
	}
	fmt.Fprintf(o.log, "[e2e sluice http, profiled] %d jobs in %.2fs\n", r.Jobs, r.Done.Seconds())
	return append(out, r), nil
}

// e2eTimeout bounds one round.
const e2eTimeout = 5 * time.Minute

func runE2ERound(ctx context.Context, o options, ec e2eConfig, setup, handler string, profile bool) (e2eRound, error) {
	r := e2eRound{Setup: setup, Handler: handler, Jobs: ec.jobs, Load: loadAvg()}
	var rdb redis.UniversalClient
	var addr string
	var masters []*redis.Client
	if o.cluster {
		c, err := redistest.StartCluster(&redistest.ClusterOptions{Masters: 3})
		if err != nil {
			return r, err
		}
		defer c.Stop()
		addr = strings.Join(c.Addrs(), ",")
		for _, m := range c.Masters() {
			mc := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 2})
			defer mc.Close()
			masters = append(masters, mc)
		}
	} else {
		srv, err := startRedis(ctx)
		if err != nil {
			return r, err
		}
		defer srv.stop()
		addr = srv.addr
		sc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2})
		defer sc.Close()
		masters = []*redis.Client{sc}
	}
	rdb = newClient(addr, o.cluster, 64)
	defer rdb.Close()

	var enq enqueuer
	if setup == setupSluice {
		lim, err := throttle.NewLimiter(rdb, nil)
		if err != nil {
			return r, err
		}
		defer lim.Close()
		if text := e2ePolicyOf(o); text != e2eNoPolicy {
			pol, err := throttle.ParsePolicy(text)
			if err != nil {
				return r, err
			}
			pols := map[string]*throttle.Policy{}
			for i := 0; i < ec.tenants; i++ {
				pols[e2eTenant(i, ec.tenants)] = pol
			}
			if err := lim.Policies().Apply(ctx, pols, false); err != nil {
				return r, fmt.Errorf("store the policies: %w", err)
			}
		}
		qc, err := queue.New(rdb, nil)
		if err != nil {
			return r, err
		}
		defer qc.Close()
		enq = &sluiceEnqueuer{q: qc}
	} else {
		ac := asynq.NewClientFromRedisClient(rdb)
		defer ac.Close()
		enq = &plainEnqueuer{c: ac}
	}

	// The downstream: no limits, no service time.
	w := &workload{jobs: make([]job, ec.jobs)}
	for i := 0; i < ec.tenants; i++ {
		w.tenants = append(w.tenants, tenant{id: i})
	}
	ds, err := startDownstream(w, 0, time.Now())
	if err != nil {
		return r, err
	}
	defer ds.close()

	args := []string{"-setup", setup, "-redis", addr, "-concurrency", strconv.Itoa(o.cfg.conc),
		"-procs", strconv.Itoa(o.cfg.workers), "-handler", handler}
	if o.cluster {
		args = append(args, "-cluster")
	}
	var procs []*workerProc
	stopAll := func() {
		for _, p := range procs {
			if _, err := p.stop(30 * time.Second); err != nil {
				r.Problems = append(r.Problems, err.Error())
			}
		}
		procs = nil
	}
	defer stopAll()
	if procs, err = startWorkers(ctx, o.workerArgs(args), o.cfg.workers); err != nil {
		return r, err
	}
	// asynq's servers register themselves (and their concurrency, which
	// sluice's producer reads) at start: the round begins when all have,
	// in both set-ups.
	if err := waitServers(ctx, rdb, o.cfg.workers); err != nil {
		return r, err
	}

	payloads := make([][]byte, ec.jobs)
	p := &producer{w: w, url: ds.url}
	for i := range payloads {
		w.jobs[i] = job{tenant: int32(i % ec.tenants)}
		payloads[i] = p.payload(i)
	}
	workersCPU := func() float64 {
		total := 0.0
		for _, p := range procs {
			if c, err := procCPU(p.cmd.Process.Pid); err == nil {
				total += c
			}
		}
		return total
	}
	redisTotals := func() (cpu float64, cmds []float64) {
		for _, m := range masters {
			cpu += redisCPU(ctx, m)
			n, _ := redisInfo(ctx, m, "stats", "total_commands_processed")
			cmds = append(cmds, n)
		}
		return cpu, cmds
	}
	wcpu0 := workersCPU()
	cpu0, cmds0 := redisTotals()
	start := time.Now()
	stopProfile := make(chan struct{})
	profiled := make(chan *redisProfile, 1)
	if profile {
		go func() {
			pc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2})
			defer pc.Close()
			p, err := profileRedis(ctx, pc, start, 0, e2eTimeout, stopProfile)
			if err != nil {
				fmt.Fprintf(o.log, "[e2e] profile of Redis: %v\n", err)
			}
			profiled <- p
		}()
	} else {
		profiled <- nil
	}
	var next atomic.Int64
	var errs atomic.Int64
	var wg sync.WaitGroup
	for k := 0; k < enqueueParallel; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= ec.jobs {
					return
				}
				if err := enq.one(ctx, e2eTenant(i, ec.tenants), "e"+strconv.Itoa(i), payloads[i]); err != nil {
					errs.Add(1)
				}
			}
		}()
	}
	enqueued := make(chan time.Duration, 1)
	go func() { wg.Wait(); enqueued <- time.Since(start) }()
	want := int64(ec.jobs)
	deadline := time.After(e2eTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-deadline:
			return r, fmt.Errorf("not done within %s", e2eTimeout)
		case d := <-enqueued:
			r.Enqueued = d
			want -= errs.Load()
			enqueued = nil
		case <-tick.C:
			n, err := rdb.Get(ctx, "asynq:{default}:processed").Int64()
			if err != nil && err != redis.Nil {
				return r, err
			}
			if enqueued == nil && n >= want {
				r.Done = time.Since(start)
				done = true
			}
		}
	}
	r.EnqErrs = int(errs.Load())
	cpu1, cmds1 := redisTotals()
	r.RedisCPU = cpu1 - cpu0
	if o.cluster {
		total := 0.0
		for i := range cmds1 {
			total += cmds1[i] - cmds0[i]
		}
		for i := range cmds1 {
			r.Masters = append(r.Masters, (cmds1[i]-cmds0[i])/max(total, 1))
		}
	}
	r.WorkerCPU = time.Duration((workersCPU() - wcpu0) * float64(time.Second))
	close(stopProfile)
	r.Profile = <-profiled
	if handler == handlerHTTP && ds.done.Load() < want {
		r.Problems = append(r.Problems, fmt.Sprintf("the downstream answered %d jobs of %d", ds.done.Load(), want))
	}
	stopAll()
	return r, nil
}

// e2eSummary is one handler's figures: per set-up the rounds' median
// jobs/s, and the same for the other figures.
type e2eSummary struct {
	handler                 string
	plain, sluice           []e2eRound
	plainJPS, sluiceJPS     float64
	ratio                   float64 // sluice's median over plain's
	plainRedis, sluiceRedis float64 // Redis CPU seconds per job, median
	plainWorker, sluiceWork float64 // worker CPU seconds per job, median
	plainEnqPS, sluiceEnqPS float64 // enqueues per second, median
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func summarizeE2E(rounds []e2eRound) []e2eSummary {
	var out []e2eSummary
	for _, h := range e2eHandlers {
		s := e2eSummary{handler: h}
		for _, r := range rounds {
			if r.Handler != h || r.Profile != nil {
				continue
			}
			if r.Setup == setupSluice {
				s.sluice = append(s.sluice, r)
			} else {
				s.plain = append(s.plain, r)
			}
		}
		if len(s.plain) == 0 || len(s.sluice) == 0 {
			continue
		}
		stat := func(rs []e2eRound, f func(e2eRound) float64) float64 {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, f(r))
			}
			return median(xs)
		}
		jps := func(r e2eRound) float64 { return r.jobsPerSec() }
		red := func(r e2eRound) float64 { return r.RedisCPU / float64(r.Jobs) }
		wrk := func(r e2eRound) float64 { return r.WorkerCPU.Seconds() / float64(r.Jobs) }
		eps := func(r e2eRound) float64 {
			if r.Enqueued <= 0 {
				return 0
			}
			return float64(r.Jobs) / r.Enqueued.Seconds()
		}
		s.plainJPS, s.sluiceJPS = stat(s.plain, jps), stat(s.sluice, jps)
		if s.plainJPS > 0 {
			s.ratio = s.sluiceJPS / s.plainJPS
		}
		s.plainRedis, s.sluiceRedis = stat(s.plain, red), stat(s.sluice, red)
		s.plainWorker, s.sluiceWork = stat(s.plain, wrk), stat(s.sluice, wrk)
		s.plainEnqPS, s.sluiceEnqPS = stat(s.plain, eps), stat(s.sluice, eps)
		out = append(out, s)
	}
	return out
}

// e2eTargets are sluice's end-to-end targets, one per handler.
func (b *benchmark) e2eTargets() []target {
	var ts []target
	for _, s := range summarizeE2E(b.e2e) {
		ts = append(ts, target{id: "e2e-" + s.handler,
			name: fmt.Sprintf("end to end (%s jobs): jobs/s ≥ %.2f× plain asynq, limits not binding%s", s.handler, targetE2E, policyNote(b.o)),
			met:  s.ratio >= targetE2E, actual: fmt.Sprintf("%.2f× (%.0f vs %.0f jobs/s)", s.ratio, s.sluiceJPS, s.plainJPS)})
	}
	return ts
}

// e2eMarkdown writes the end-to-end scenario's part of the report.
func (b *benchmark) e2eMarkdown(out io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	ec := e2ePresets[b.o.cfg.name]
	p("## End to end: enqueue and run, limits not binding")
	p("")
	p("How many jobs a second go from the producer's enqueue to done, with **plain asynq** (`asynq.Client`,")
	p("an `asynq.Server` with no middleware) and with **sluice** (`queue.Client`, `worker.Server`), in")
	p("the same run: per round a fresh Redis and %d worker processes (`Concurrency: %d`, the fleet", b.o.cfg.workers, b.o.cfg.conc)
	p("scenario's), %s jobs over %d tenants enqueued by %d goroutines as fast as they go, timed from", thousands(int64(ec.jobs)), ec.tenants, enqueueParallel)
	pol, has := e2ePolicyOf(b.o), "the policy"
	if pol == e2eNoPolicy {
		has = "no policy"
	}
	p("the first enqueue until asynq counts the last job processed. sluice's tenants have %s", has)
	switch pol {
	case e2ePolicy:
		p("`%s`: it never binds, but every job comes through the waiting room, is", pol)
		p("decided, holds a concurrency slot and gives it back.")
	case e2eNoPolicy:
		p("(`-e2e-policy none`): every job still comes through the waiting room (parked, given its")
		p("tenant's turn, handed to asynq) and is charged nothing, so the rounds measure the room's own path.")
	default:
		p("`%s` (`-e2e-policy`).", pol)
	}
	p("Two kinds of job: `http`, the fleet's job (a")
	p("POST the downstream answers at once), and `noop` (the handler returns at once: only the queue's")
	p("and the throttle's own cost). %d round(s) of each set-up per kind, interleaved; the figures are", ec.pairs)
	p("medians.")
	p("")
	sums := summarizeE2E(b.e2e)
	p("| job | plain asynq jobs/s | sluice jobs/s | sluice / plain | enqueues/s (plain, sluice) | Redis CPU µs/job (plain, sluice) | worker CPU µs/job (plain, sluice) |")
	p("|---|---|---|---|---|---|---|")
	for _, s := range sums {
		p("| %s | %.0f | %.0f | **%.2f×** | %.0f, %.0f | %.0f, %.0f | %.0f, %.0f |", s.handler, s.plainJPS, s.sluiceJPS, s.ratio,
			s.plainEnqPS, s.sluiceEnqPS, s.plainRedis*1e6, s.sluiceRedis*1e6, s.plainWorker*1e6, s.sluiceWork*1e6)
	}
	p("")
	var each []string
	for _, r := range b.e2e {
		each = append(each, fmt.Sprintf("%s %s %.0f", r.Handler, setupTitle(r.Setup), r.jobsPerSec()))
	}
	p("Every round, in order (jobs/s): %s.", strings.Join(each, "; "))
	if len(b.e2e) > 0 && len(b.e2e[0].Masters) > 0 {
		p("")
		p("**On a Redis Cluster of %d masters** (`-cluster`: every round's Redis is a private Cluster;", len(b.e2e[0].Masters))
		p("Redis CPU is the masters' sum). Each master's share of the commands a round made Redis")
		p("process, scripts' own commands included:")
		p("")
		var shares []string
		for _, r := range b.e2e {
			var m []string
			for _, f := range r.Masters {
				m = append(m, fmt.Sprintf("%.0f%%", 100*f))
			}
			shares = append(shares, fmt.Sprintf("%s %s %s", r.Handler, setupTitle(r.Setup), strings.Join(m, "/")))
		}
		p("%s.", strings.Join(shares, "; "))
	}
	for _, r := range b.e2e {
		for _, pr := range r.Problems {
			p("")
			p("Problem in a round (%s, %s): %s", r.Handler, setupTitle(r.Setup), pr)
		}
		if r.EnqErrs > 0 {
			p("")
			p("%d enqueue errors in a round (%s, %s).", r.EnqErrs, r.Handler, setupTitle(r.Setup))
		}
	}
	p("")
	for _, s := range sums {
		if s.ratio >= targetE2E {
			p("**%s jobs: sluice met its target**, %.2f× plain asynq's jobs/s (target %.2f×).", s.handler, s.ratio, targetE2E)
			p("")
			continue
		}
		p("**%s jobs: sluice missed its target**: %.2f× plain asynq's jobs/s (target %.2f×). Per job,", s.handler, s.ratio, targetE2E)
		p("sluice's rounds cost Redis %.0f µs of CPU against %.0f µs for plain asynq (%.1f×), and the worker", s.sluiceRedis*1e6, s.plainRedis*1e6, safeRatio(s.sluiceRedis, s.plainRedis))
		p("processes %.0f µs against %.0f µs (%.1f×); the producer enqueued %.0f jobs/s against %.0f. Redis, the", s.sluiceWork*1e6, s.plainWorker*1e6, safeRatio(s.sluiceWork, s.plainWorker), s.sluiceEnqPS, s.plainEnqPS)
		p("workers and this program (producer and downstream) share the machine's %d cores, so what one", b.machine.cores)
		p("of them spends more is taken from the others. Where sluice's Redis time goes, from the")
		p("profiled round below.")
		p("")
	}
	for _, r := range b.e2e {
		if r.Profile == nil {
			continue
		}
		rows := profileRows(r.Profile, r.Jobs)
		if len(rows) == 0 {
			continue
		}
		total := 0.0
		for _, row := range rows {
			total += row.usec
		}
		p("The profiled round (sluice, %s jobs, not counted above: Redis logged every command, which", r.Handler)
		p("costs it too): %s jobs in %.2f s; commands and scripts took %.0f µs of Redis per job, against", thousands(int64(r.Jobs)), r.Done.Seconds(), total)
		p("%s of Redis CPU per job in all (the rest is reading requests, writing replies and its upkeep).", micros(r.RedisCPU/float64(r.Jobs)))
		p("")
		p("| command or script | calls per job | µs per call | µs per job | share |")
		p("|---|---|---|---|---|")
		for _, row := range rows[:min(len(rows), 12)] {
			p("| %s | %.2f | %.1f | %.1f | %s |", row.label, row.callsPerJob, row.usecPerCall, row.usec, pct(row.share))
		}
		p("")
	}
}

// safeRatio is a/b, 0 when b is 0.
func safeRatio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// policyNote names a policy of the end-to-end rounds other than theirs by
// default, for the targets' table.
func policyNote(o options) string {
	if pol := e2ePolicyOf(o); pol != e2ePolicy {
		return fmt.Sprintf(" (policy `%s`)", pol)
	}
	return ""
}
