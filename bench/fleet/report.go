package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// result is one set-up's line of the report.
type result struct {
	setup      string
	jobs       int
	enqueued   int
	enqErrs    int
	firstErr   string
	completed  int
	unfinished int // still queued when the run ended (deadline)
	archived   int
	lost       int // enqueued, never completed, not queued at the end
	duplicates int
	requests   int
	rejRate    int
	rejConc    int

	// delivery is each request's delay from its job's handler's start to
	// its arrival at the downstream; admitToStart, in sluice's set-up,
	// from the gate's admission of the job (Redis time) to its handler's
	// start.
	delivery, admitToStart spread
	// The requests refused over a rate, replayed (refusals): how early
	// they came; how many the previous accepted request's longer
	// delivery explains, and the median of how much longer it was over
	// those; how many had no delay to compare.
	earlyP50, earlyMax time.Duration
	explained          int
	prevLongerP50      time.Duration
	unexplainedUnknown int
	// Of those not explained so (both delays known), how many were
	// early already at their handler's start (refusal.startEarly), and
	// by how much (median), and how many conformed there. Of those early
	// at their start, how many were early already at their admission
	// (refusal.admitEarly; by how much, median), and how many were
	// admitted in time.
	startedEarly   int
	startEarlyP50  time.Duration
	startConformed int
	admittedEarly  int
	admitEarlyP50  time.Duration
	admittedInTime int

	rateErr         float64 // largest rateExcess (10 s windows) of any rate-limited tenant
	rateErrTenant   string
	tenantsOverRate int     // tenants whose rateExcess is above 1%
	rateErr1s       float64 // the same over 1 s windows
	rateErr1sTenant string
	tenantsOver1s   int
	bigAchieved     float64
	bigLimit        int64

	concPeak       int
	concCap        int64
	concTenant     string
	tenantsOverCap int

	deliveries int64
	perJob     float64
	// Throttle denials: set-ups 1 and 2's middleware by limit; sluice's
	// gate, its reserved decisions (a job early for its own slot) apart.
	deniedRate, deniedConc   int64
	gateDenied, gateReserved float64

	waits            []time.Duration // sorted: small tenants' conforming jobs enqueued during the burst
	waitsByClass     map[string][]time.Duration
	waitP50, waitP99 time.Duration
	waitOver2s       int
	waitFrom, waitTo time.Duration // the window the waits are measured in

	// Stalls: stretches of stallMin or more in which a tenant's jobs
	// waited while none of its requests reached the downstream and the
	// pending list was shorter than the fleet's concurrency (it had room).
	stalls         []time.Duration // their lengths, sorted
	stalledTenants map[string]int  // by class
	stalledJobs    int             // jobs that waited through a stall
	stalledBoth    int             // stalled tenants with both a rate and a concurrency rule

	peakPending int64   // longest pending list
	redisBusy   float64 // most of one core Redis used over any 10 s
	jobsPerSec  float64
	makespan    time.Duration
	redisCPU    float64
	redisPerJob float64 // Redis CPU seconds per completed job
	redisPeak   float64
	workerCPU   time.Duration
	slots       slotCycleOf // the worker processes' slots over the middle of the run
	slotsOK     bool
	burstCPU    cpuUse // the cores' use during the burst window
	timedOut    bool
	loadBefore  string
	loadAfter   string
	problems    []string
}

// conformSlack is how close to its enqueue a job's ideal start must be for
// the job to count as one its own limits would have started at once.
const conformSlack = time.Millisecond

// compute turns a set-up's recordings into its report line.
func compute(w *workload, rd *runData) *result {
	r := &result{setup: rd.setup, jobs: len(w.jobs), enqErrs: rd.enqErrs, firstErr: rd.firstErr,
		deliveries: rd.deliveries, redisCPU: rd.redisCPU, redisPeak: rd.redisPeak, workerCPU: rd.workerCPU,
		timedOut: rd.timedOut, loadBefore: rd.loadBefore, loadAfter: rd.loadAfter, problems: slices.Clone(rd.problems),
		waitsByClass: map[string][]time.Duration{}, stalledTenants: map[string]int{}}
	r.slots, r.slotsOK = rd.slots.cycle()
	enqueued := make([]bool, len(w.jobs))
	for i, t := range rd.enq {
		if t >= 0 {
			enqueued[i] = true
			r.enqueued++
		}
	}
	missing, dups := lostAndDuplicated(enqueued, rd.served)
	r.duplicates = dups
	r.completed = r.enqueued - missing
	for _, k := range []string{"pending", "active", "scheduled", "retry"} {
		r.unfinished += rd.leftover[k]
	}
	r.archived = rd.leftover["archived"]
	r.lost = max(0, missing-r.unfinished)
	r.perJob = perJob(rd.deliveries, r.enqueued)
	r.redisPerJob = perJobF(rd.redisCPU, r.completed)
	r.peakPending, r.redisBusy = peakPending(rd.samples), redisBusy(rd.samples, 10*time.Second)
	r.deniedRate, r.deniedConc = rd.denied[whyRate], rd.denied[whyConc]
	denied := counterTotal(rd.gate, decisionsFamily, "verdict=denied")
	r.gateReserved = counterTotal(rd.gate, decisionsFamily, "verdict=denied", "rule=reserved")
	r.gateDenied = denied - r.gateReserved
	if rd.lastOK > 0 {
		r.makespan = rd.lastOK
		r.jobsPerSec = float64(r.completed) / rd.lastOK.Seconds()
	}

	// How long the requests took to arrive, and why those refused over a
	// rate came early.
	r.delivery = spreadOf(lagStats(rd.arrivals, deliveryDelay))
	r.admitToStart = spreadOf(lagStats(rd.arrivals, admitToStart))
	var early, prevLonger, startEarly, admitEarly []time.Duration
	replayed := 0
	for ti, arr := range rd.arrivals {
		t := w.tenants[ti]
		for _, f := range refusals(arr, t.rate, t.burst, rd.allowance) {
			if f.early <= 0 {
				replayed++
			}
			early = append(early, f.early)
			switch {
			case f.delay == unknownDelay || f.prevDelay == unknownDelay:
				r.unexplainedUnknown++
			case f.explained():
				r.explained++
				prevLonger = append(prevLonger, f.prevDelay-f.delay)
			case f.startKnown && f.startEarly > 0:
				r.startedEarly++
				startEarly = append(startEarly, f.startEarly)
				switch {
				case f.admitKnown && f.admitEarly > 0:
					r.admittedEarly++
					admitEarly = append(admitEarly, f.admitEarly)
				case f.admitKnown:
					r.admittedInTime++
				}
			case f.startKnown:
				r.startConformed++
			}
		}
	}
	sortDurations(early)
	r.earlyP50 = percentile(early, 50)
	if len(early) > 0 {
		r.earlyMax = early[len(early)-1]
	}
	r.prevLongerP50 = percentile(sortDurations(prevLonger), 50)
	r.startEarlyP50 = percentile(sortDurations(startEarly), 50)
	r.admitEarlyP50 = percentile(sortDurations(admitEarly), 50)
	if replayed > 0 {
		r.problems = append(r.problems, fmt.Sprintf("%d requests the downstream refused over a rate conform when its GCRA is replayed", replayed))
	}

	// When each job first reached the downstream and was accepted.
	firstOK := make([]time.Duration, len(w.jobs))
	for i := range firstOK {
		firstOK[i] = -1
	}
	for ti, arr := range rd.arrivals {
		t := w.tenants[ti]
		times := make([]time.Duration, 0, len(arr))
		var acc []time.Duration
		for _, a := range arr {
			r.requests++
			times = append(times, a.at)
			switch a.status {
			case rejectedRate:
				r.rejRate++
			case rejectedConc:
				r.rejConc++
			default:
				acc = append(acc, a.at)
				if f := firstOK[a.job]; f < 0 || a.at < f {
					firstOK[a.job] = a.at
				}
			}
		}
		if t.rate > 0 {
			sortDurations(times)
			ex := rateExcess(times, t.rate, t.burst, rateWindow)
			if ex > 0.01 {
				r.tenantsOverRate++
			}
			if ex > r.rateErr {
				r.rateErr, r.rateErrTenant = ex, t.name
			}
			ex1 := rateExcess(times, t.rate, t.burst, time.Second)
			if ex1 > 0.01 {
				r.tenantsOver1s++
			}
			if ex1 > r.rateErr1s {
				r.rateErr1s, r.rateErr1sTenant = ex1, t.name
			}
		}
		if t.class == classBig {
			r.bigLimit = t.rate
			r.bigAchieved = achievedRate(sortDurations(acc), t.burst)
		}
		if t.conc > 0 {
			peak := peakConcurrency(arr)
			if peak > int(t.conc) {
				r.tenantsOverCap++
			}
			if r.concTenant == "" || float64(peak)/float64(t.conc) > float64(r.concPeak)/float64(r.concCap) {
				r.concPeak, r.concCap, r.concTenant = peak, t.conc, t.name
			}
		}
	}

	// Stalls, tenant by tenant, while the fleet had room.
	slots := int64(w.cfg.workers * w.cfg.conc)
	byTenant := make([][]int, len(w.tenants))
	for i, j := range w.jobs {
		byTenant[j.tenant] = append(byTenant[j.tenant], i)
	}
	for ti, idx := range byTenant {
		enq, started := make([]time.Duration, len(idx)), make([]time.Duration, len(idx))
		for k, i := range idx {
			enq[k], started[k] = rd.enq[i], firstOK[i]
		}
		var times []time.Duration
		for _, a := range rd.arrivals[ti] {
			times = append(times, a.at)
		}
		sortDurations(times)
		stalled := false
		held := make([]bool, len(idx))
		for _, st := range stallsOf(enq, started, times, rd.elapsed, stallMin) {
			if maxPending(rd.samples, st[0], st[1]) >= slots {
				continue
			}
			stalled = true
			r.stalls = append(r.stalls, st[1]-st[0])
			for k := range idx {
				if enq[k] >= 0 && enq[k] <= st[0] && (started[k] < 0 || started[k] >= st[1]) && !held[k] {
					held[k] = true
					r.stalledJobs++
				}
			}
		}
		if stalled {
			r.stalledTenants[w.tenants[ti].class]++
			if t := w.tenants[ti]; t.rate > 0 && t.conc > 0 {
				r.stalledBoth++
			}
		}
	}
	sortDurations(r.stalls)

	// Queue wait of small tenants during the big burst: jobs enqueued in
	// the burst window that their own limits would have started at once.
	from, to := w.waitWindow(rd)
	r.waitFrom, r.waitTo = from, to
	r.burstCPU = useBetween(rd.samples, from, to, rd.cores)
	per := make([][]int, len(w.tenants))
	for i, j := range w.jobs {
		if enqueued[i] {
			per[j.tenant] = append(per[j.tenant], i)
		}
	}
	for ti, idx := range per {
		t := w.tenants[ti]
		if !t.small() || len(idx) == 0 {
			continue
		}
		sort.Slice(idx, func(a, b int) bool { return rd.enq[idx[a]] < rd.enq[idx[b]] })
		enq := make([]time.Duration, len(idx))
		for k, i := range idx {
			enq[k] = rd.enq[i]
		}
		ideal := idealStarts(enq, t.rate, t.burst, t.conc, t.hold)
		for k, i := range idx {
			if enq[k] < from || enq[k] > to || ideal[k]-enq[k] > conformSlack {
				continue
			}
			started := firstOK[i]
			if started < 0 {
				// Never started: it waited the whole run.
				started = rd.elapsed
			}
			r.waits = append(r.waits, max(0, started-enq[k]))
			r.waitsByClass[t.class] = append(r.waitsByClass[t.class], max(0, started-enq[k]))
		}
	}
	sortDurations(r.waits)
	for _, ws := range r.waitsByClass {
		sortDurations(ws)
	}
	r.waitP50, r.waitP99 = percentile(r.waits, 50), percentile(r.waits, 99)
	for _, d := range r.waits {
		if d > targetWait {
			r.waitOver2s++
		}
	}
	return r
}

// row is one line of the comparison table.
type row struct {
	name string
	cell func(r *result) string
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }

// micros writes seconds as whole microseconds.
func micros(s float64) string { return fmt.Sprintf("%.0f µs", s*1e6) }

// spread is a distribution of durations: how many were known, how many
// not, and its percentiles.
type spread struct {
	n, unknown          int
	p50, p99, p999, max time.Duration
}

// spreadOf is the spread of sorted durations, unknown more not known.
func spreadOf(sorted []time.Duration, unknown int) spread {
	s := spread{n: len(sorted), unknown: unknown, p50: percentile(sorted, 50), p99: percentile(sorted, 99), p999: percentile(sorted, 99.9)}
	if len(sorted) > 0 {
		s.max = sorted[len(sorted)-1]
	}
	return s
}

// cell writes the spread's percentiles as a table's cell; missing names
// the ones not known, when there are any.
func (s spread) cell(missing string) string {
	if s.n == 0 {
		return "not recorded"
	}
	c := fmt.Sprintf("%s / %s / %s / %s ms", millis(s.p50), millis(s.p99), millis(s.p999), millis(s.max))
	if s.unknown > 0 {
		c += fmt.Sprintf(" (%s %s)", thousands(int64(s.unknown)), missing)
	}
	return c
}

// millis writes a duration as milliseconds without the unit, to three
// significant figures below 100 ms (0.412, 1.93, 23.5), whole above.
func millis(d time.Duration) string {
	m := float64(d) / float64(time.Millisecond)
	switch a := math.Abs(m); {
	case a < 1:
		return fmt.Sprintf("%.3f", m)
	case a < 10:
		return fmt.Sprintf("%.2f", m)
	case a < 100:
		return fmt.Sprintf("%.1f", m)
	default:
		return fmt.Sprintf("%.0f", m)
	}
}

func secs(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func overLimit(worst float64, tenant string, over int) string {
	if worst == 0 {
		return "0% (no tenant over its limit)"
	}
	return fmt.Sprintf("%s (%s); %d tenants over 1%%", pct(worst), tenant, over)
}

var rows = []row{
	{"jobs enqueued (of workload)", func(r *result) string {
		s := fmt.Sprintf("%s of %s", thousands(int64(r.enqueued)), thousands(int64(r.jobs)))
		if r.enqErrs > 0 {
			s += fmt.Sprintf(" (%d enqueue errors)", r.enqErrs)
		}
		return s
	}},
	{"jobs completed (2xx)", func(r *result) string { return thousands(int64(r.completed)) }},
	{"downstream rejections (429)", func(r *result) string {
		return fmt.Sprintf("%s (rate %s, concurrency %s)", thousands(int64(r.rejRate+r.rejConc)), thousands(int64(r.rejRate)), thousands(int64(r.rejConc)))
	}},
	{"delivery delay (handler start to downstream), p50 / p99 / p99.9 / max", func(r *result) string {
		return r.delivery.cell("requests without a start")
	}},
	{"sluice: gate admission (Redis time) to handler start, p50 / p99 / p99.9 / max", func(r *result) string {
		if r.setup != setupSluice {
			return "-"
		}
		return r.admitToStart.cell("requests without an admission")
	}},
	{"max rate error: sent over limit in any 10 s", func(r *result) string {
		return overLimit(r.rateErr, r.rateErrTenant, r.tenantsOverRate)
	}},
	{"… in any 1 s", func(r *result) string {
		return overLimit(r.rateErr1s, r.rateErr1sTenant, r.tenantsOver1s)
	}},
	{"big tenant achieved rate vs limit", func(r *result) string {
		if r.bigLimit == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f/s vs %d/s (%+.1f%%)", r.bigAchieved, r.bigLimit, (r.bigAchieved/float64(r.bigLimit)-1)*100)
	}},
	{"max concurrency vs cap", func(r *result) string {
		return fmt.Sprintf("%d vs cap %d (%s); %d tenants over cap", r.concPeak, r.concCap, r.concTenant, r.tenantsOverCap)
	}},
	{"jobs lost / duplicated", func(r *result) string {
		s := fmt.Sprintf("%d / %d", r.lost, r.duplicates)
		if r.archived > 0 {
			s += fmt.Sprintf(" (%d archived)", r.archived)
		}
		if r.unfinished > 0 {
			s += fmt.Sprintf(" (%d unfinished at the deadline)", r.unfinished)
		}
		return s
	}},
	{"deliveries per job", func(r *result) string {
		return fmt.Sprintf("%.2f (%s dequeues)", r.perJob, thousands(r.deliveries))
	}},
	{"throttle denials per job", func(r *result) string {
		if r.setup == setupSluice {
			return fmt.Sprintf("%.3f (gate: %s denied; %s more early for their reserved slot)", perJobF(r.gateDenied, r.enqueued),
				thousands(int64(r.gateDenied)), thousands(int64(r.gateReserved)))
		}
		return fmt.Sprintf("%.2f (rate %s, concurrency %s)", perJobF(float64(r.deniedRate+r.deniedConc), r.enqueued),
			thousands(r.deniedRate), thousands(r.deniedConc))
	}},
	{"small-tenant queue wait during burst, p50 / p99", func(r *result) string {
		return fmt.Sprintf("%s / %s (n=%s, %d over 2 s)", secs(r.waitP50), secs(r.waitP99), thousands(int64(len(r.waits))), r.waitOver2s)
	}},
	{"fleet jobs/s (completed / time to last)", func(r *result) string {
		return fmt.Sprintf("%.0f (%.0f s)", r.jobsPerSec, r.makespan.Seconds())
	}},
	{"Redis CPU / peak memory", func(r *result) string {
		return fmt.Sprintf("%.1f s / %.1f MB", r.redisCPU, r.redisPeak/1e6)
	}},
	{"Redis CPU per completed job", func(r *result) string { return micros(r.redisPerJob) }},
	{"Redis busiest 10 s (share of one core)", func(r *result) string { return pct(r.redisBusy) }},
	{"longest pending list", func(r *result) string { return thousands(r.peakPending) }},
	{"worker CPU (all processes)", func(r *result) string { return fmt.Sprintf("%.1f s", r.workerCPU.Seconds()) }},
	{"cores busy during the burst window", func(r *result) string { return r.burstCPU.String() }},
	{"CPU per completed job (Redis + workers)", func(r *result) string { return fmt.Sprintf("%.2f ms", r.cpuPerJob()*1000) }},
}

// satRows are the rows of the saturation scenario's table.
var satRows = []row{
	{"small tenants' queue wait while the burst is worked off, p50 / p99", func(r *result) string {
		return fmt.Sprintf("%s / %s (n=%s, t=%.0f–%.0fs)", secs(r.waitP50), secs(r.waitP99), thousands(int64(len(r.waits))), r.waitFrom.Seconds(), r.waitTo.Seconds())
	}},
	{"… of them over 1 s", func(r *result) string {
		n := 0
		for _, d := range r.waits {
			if d > targetSatWait {
				n++
			}
		}
		return thousands(int64(n))
	}},
	{"jobs completed (2xx) of enqueued", func(r *result) string {
		s := fmt.Sprintf("%s of %s", thousands(int64(r.completed)), thousands(int64(r.enqueued)))
		if r.unfinished > 0 {
			s += fmt.Sprintf(" (%s unfinished at the deadline)", thousands(int64(r.unfinished)))
		}
		return s
	}},
	{"flooding tenant's jobs/s (its first to last start)", func(r *result) string { return fmt.Sprintf("%.0f", r.bigAchieved) }},
	{"a slot's cycle: before the handler / the handler / from its end to the slot's next task", func(r *result) string {
		if !r.slotsOK {
			return "not measured"
		}
		return fmt.Sprintf("%s / %s / %s ms", millis(r.slots.before), millis(r.slots.handler), millis(r.slots.between))
	}},
	{"slots busy (a job's hand-over to its handler's end)", func(r *result) string {
		if !r.slotsOK {
			return "not measured"
		}
		return pct(r.slots.busy)
	}},
	{"last job done at", func(r *result) string { return fmt.Sprintf("t=%.0fs", r.makespan.Seconds()) }},
	{"downstream rejections (429)", func(r *result) string { return thousands(int64(r.rejRate + r.rejConc)) }},
	{"deliveries per job", func(r *result) string { return fmt.Sprintf("%.3f", r.perJob) }},
	{"longest pending list", func(r *result) string { return thousands(r.peakPending) }},
	{"Redis CPU per completed job", func(r *result) string { return micros(r.redisPerJob) }},
	{"cores busy while the burst is worked off", func(r *result) string { return r.burstCPU.String() }},
}

// cpuPerJob is Redis's and the workers' CPU seconds per completed job.
func (r *result) cpuPerJob() float64 {
	if r.completed == 0 {
		return 0
	}
	return (r.redisCPU + r.workerCPU.Seconds()) / float64(r.completed)
}

// printTable writes the comparison as aligned text.
func printTable(out io.Writer, rows []row, results []*result) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t", setupTitle(r.setup))
	}
	fmt.Fprintln(tw)
	for _, rw := range rows {
		fmt.Fprintf(tw, "%s\t", rw.name)
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t", rw.cell(r))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	for _, r := range results {
		for _, p := range r.problems {
			fmt.Fprintf(out, "%s: %s\n", setupTitle(r.setup), p)
		}
		if r.firstErr != "" {
			fmt.Fprintf(out, "%s: first enqueue error: %s\n", setupTitle(r.setup), r.firstErr)
		}
	}
}

// markdownTable writes the comparison as a Markdown table.
func markdownTable(out io.Writer, rows []row, results []*result) {
	fmt.Fprint(out, "| |")
	for _, r := range results {
		fmt.Fprintf(out, " %s |", setupTitle(r.setup))
	}
	fmt.Fprint(out, "\n|---|")
	for range results {
		fmt.Fprint(out, "---|")
	}
	fmt.Fprintln(out)
	for _, rw := range rows {
		fmt.Fprintf(out, "| %s |", rw.name)
		for _, r := range results {
			fmt.Fprintf(out, " %s |", rw.cell(r))
		}
		fmt.Fprintln(out)
	}
}

// target is one of the targets sluice is measured against.
type target struct {
	id     string // what the commentary refers to it by
	name   string
	met    bool
	actual string
}

// Ids of the targets.
const (
	tgtRejections = "rejections"
	tgtWait       = "wait"
	tgtDeliveries = "deliveries"
	tgtDenied     = "denied"
	tgtRedis      = "redis"
	tgtJobsPerSec = "jobs/s"
	tgtBig        = "big"
	tgtRate       = "rate"
	tgtCap        = "cap"
	tgtLost       = "lost"
)

// Issue 11's targets for sluice's fleet run, and the standing ones of
// issue 5.
const (
	targetWait        = 2 * time.Second
	targetDeliveries  = 1.05
	targetDenied      = 0.1
	targetRedisPerJob = 250e-6 // seconds
	targetBigWithin   = 0.02
)

// targets checks sluice's fleet run (s) against the targets; prev is the
// previous run's report.
func targets(s *result, prev previous) []target {
	t := []target{
		{tgtRejections, "0 downstream rejections", s.rejRate+s.rejConc == 0, thousands(int64(s.rejRate + s.rejConc))},
		{tgtWait, fmt.Sprintf("small-tenant p99 wait ≤ %s during the big tenant's burst", secs(targetWait)), s.waitP99 <= targetWait, secs(s.waitP99)},
		{tgtDeliveries, fmt.Sprintf("deliveries per job ≤ %.2f", targetDeliveries), s.perJob <= targetDeliveries, fmt.Sprintf("%.3f", s.perJob)},
		{tgtDenied, fmt.Sprintf("denied gate decisions ≤ %.1f per job (reserved ones apart)", targetDenied), perJobF(s.gateDenied, s.enqueued) <= targetDenied,
			fmt.Sprintf("%.3f per job (%s denied); reserved: %.3f per job (%s)", perJobF(s.gateDenied, s.enqueued), thousands(int64(s.gateDenied)),
				perJobF(s.gateReserved, s.enqueued), thousands(int64(s.gateReserved)))},
	}
	redis := target{tgtRedis, fmt.Sprintf("Redis CPU per completed job ≤ %s", micros(targetRedisPerJob)), s.completed > 0 && s.redisPerJob <= targetRedisPerJob, micros(s.redisPerJob)}
	if prev.comparable(s.enqueued) && prev.RedisPerJob > 0 {
		redis.actual += fmt.Sprintf(" (%s: %s)", prev.since(), micros(prev.RedisPerJob))
	}
	t = append(t, redis)
	if prev.comparable(s.enqueued) {
		// the previous run's figure is read from its report, in whole
		// jobs/s: this run's is compared at that precision
		t = append(t, target{tgtJobsPerSec, "fleet jobs/s not lower than " + prev.since(), math.Round(s.jobsPerSec) >= prev.JobsPerSec,
			fmt.Sprintf("%.0f vs %.0f", s.jobsPerSec, prev.JobsPerSec)})
	} else {
		t = append(t, target{tgtJobsPerSec, "fleet jobs/s not lower than the previous run", false,
			fmt.Sprintf("%.0f; no previous report of this workload to compare with", s.jobsPerSec)})
	}
	off := 0.0
	if s.bigLimit > 0 {
		off = s.bigAchieved/float64(s.bigLimit) - 1
	}
	within := s.bigLimit > 0 && math.Abs(off) <= targetBigWithin
	big := target{tgtBig, fmt.Sprintf("big tenant within %.0f%% of its limit, or the workers' CPU the limit", targetBigWithin*100),
		within || s.burstCPU.saturated(), fmt.Sprintf("%.1f/s of %d/s (%+.1f%%)", s.bigAchieved, s.bigLimit, off*100)}
	if !within {
		big.actual += "; during the burst " + s.burstCPU.String()
	}
	t = append(t, big,
		target{tgtRate, "rate error ≤ 1% per tenant (sent over limit in any 10 s)", s.rateErr <= 0.01, overLimit(s.rateErr, s.rateErrTenant, s.tenantsOverRate)},
		target{tgtCap, "concurrency never above cap", s.tenantsOverCap == 0, fmt.Sprintf("peak %d vs cap %d (%s)", s.concPeak, s.concCap, s.concTenant)},
		target{tgtLost, "0 jobs lost or left unfinished", s.lost == 0 && s.unfinished == 0, fmt.Sprintf("%d lost, %d unfinished", s.lost, s.unfinished)},
	)
	return t
}
