package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"time"
)

// The saturation scenario: one tenant with no limits enqueues a burst at
// once while small tenants trickle, on a fleet too small to keep up with
// the burst. No tenant's limits hold anything back, so what the small
// tenants wait is the queue alone: behind the whole burst in asynq's
// pending list, or served in turn from the waiting room.

// satConfig is the size of the saturation scenario.
type satConfig struct {
	big       int           // jobs the tenant with no limits enqueues at once
	bigAt     time.Duration // when
	small     int           // small tenants
	smallRate int64         // their limit (rate=N/s burst=smallBurst): never binding at their trickle
	burst     int64
	trickle   float64       // each small tenant's jobs per second
	span      time.Duration // the small tenants' jobs arrive within [0, span]
	hold      time.Duration // the downstream's service time, every job
	workers   int           // worker processes
	conc      int           // asynq Concurrency of each: the fleet runs workers×conc jobs at once
	drain     time.Duration // how long after the small tenants' last job a set-up may take
	floodConc int           // the flooding tenant's concurrency rule; 0: it has no limits
}

// satPresets are the saturation scenario of each config.
var satPresets = map[string]satConfig{
	"full": {big: 50_000, bigAt: 5 * time.Second, small: 50, smallRate: 10, burst: 5, trickle: 1, span: 60 * time.Second,
		hold: 20 * time.Millisecond, workers: 2, conc: 10, drain: 3 * time.Minute},
	"small": {big: 10_000, bigAt: 2 * time.Second, small: 20, smallRate: 10, burst: 5, trickle: 1, span: 20 * time.Second,
		hold: 20 * time.Millisecond, workers: 2, conc: 5, drain: time.Minute},
	"tiny": {big: 1_000, bigAt: 500 * time.Millisecond, small: 5, smallRate: 10, burst: 5, trickle: 2, span: 3 * time.Second,
		hold: 20 * time.Millisecond, workers: 2, conc: 5, drain: 20 * time.Second},
}

// capacity is the most jobs per second the fleet's slots allow.
func (sc satConfig) capacity() float64 {
	return float64(sc.workers*sc.conc) / sc.hold.Seconds()
}

// floodRoom is the jobs per second the fleet's slots leave the flooding
// tenant: what they allow, less the small tenants' trickle.
func (sc satConfig) floodRoom() float64 {
	return sc.capacity() - float64(sc.small)*sc.trickle
}

// targetSatShare is the share of floodRoom the flooding tenant is to get.
const targetSatShare = 0.97

// The scenarios, each a kind of workload but the last.
const (
	kindFleet      = "fleet"
	kindSaturation = "saturation"
)

// scenarios are the scenarios a run may hold, in the order they run.
var scenarios = []string{kindFleet, kindSaturation, kindEndToEnd}

// targetSatWait is the target of small tenants' p99 wait in the
// saturation scenario.
const targetSatWait = time.Second

// newSaturationWorkload builds the saturation scenario of the config named
// name, deterministically from seed. Tenant 0 has no limits and sends its
// burst at sc.bigAt; the others are small rate-limited tenants, each
// sending sc.trickle jobs a second at random times within sc.span.
func newSaturationWorkload(name string, sc satConfig, seed uint64) (*workload, error) {
	if sc.big < 1 || sc.small < 1 || sc.trickle <= 0 || sc.span <= sc.bigAt || sc.workers < 1 || sc.conc < 1 || sc.hold <= 0 {
		return nil, fmt.Errorf("saturation scenario %q: needs a burst, small tenants trickling past it, workers and a service time", name)
	}
	r := rand.New(rand.NewPCG(seed, 0x5a7))
	w := &workload{kind: kindSaturation, sat: sc}
	w.tenants = append(w.tenants, tenant{id: 0, name: "t0000", class: classBig, hold: sc.hold, jobs: sc.big, conc: int64(sc.floodConc)})
	for i := 1; i <= sc.small; i++ {
		t := tenant{id: i, name: fmt.Sprintf("t%04d", i), class: classRate, rate: sc.smallRate, burst: sc.burst, hold: sc.hold}
		t.jobs = max(1, int(sc.trickle*sc.span.Seconds()))
		w.tenants = append(w.tenants, t)
		for k := 0; k < t.jobs; k++ {
			w.jobs = append(w.jobs, job{tenant: int32(i), at: time.Duration(r.Int64N(int64(sc.span)))})
		}
	}
	for k := 0; k < sc.big; k++ {
		w.jobs = append(w.jobs, job{tenant: 0, at: sc.bigAt})
	}
	sort.SliceStable(w.jobs, func(a, b int) bool { return w.jobs[a].at < w.jobs[b].at })
	for i, j := range w.jobs {
		if j.tenant == 0 {
			w.bigFrom = i
			break
		}
	}
	w.cfg = config{name: name + "-saturation", tenants: len(w.tenants), jobs: len(w.jobs), big: sc.big, bigAt: sc.bigAt,
		span: sc.span, workers: sc.workers, conc: sc.conc, drain: sc.drain, seed: seed}
	return w, nil
}

// waitWindow is when small tenants' waits are measured: during the big
// tenant's burst, while the fleet works it off. In the fleet scenario
// that is the burst window under its limit; in the saturation scenario,
// from the burst until its last job started in this run (or the small
// tenants' last arrival, if sooner).
func (w *workload) waitWindow(rd *runData) (from, to time.Duration) {
	if w.kind != kindSaturation {
		return w.burstWindow()
	}
	last := time.Duration(0)
	if len(rd.arrivals) > 0 {
		for _, a := range rd.arrivals[0] {
			if a.status == accepted {
				last = max(last, a.at)
			}
		}
	}
	return w.cfg.bigAt, min(w.cfg.span, max(last, w.cfg.bigAt))
}

// satSluice is sluice's result in the saturation scenario; nil when it
// did not run.
func (b *benchmark) satSluice() *result {
	if b.sat == nil {
		return nil
	}
	return b.sat.resultOf(setupSluice)
}

// satOthers is cell of each other set-up of the saturation scenario, as
// "; <set-up> <cell>".
func (b *benchmark) satOthers(cell func(r *result) string) string {
	var out string
	for _, r := range b.sat.results {
		if r.setup != setupSluice {
			out += fmt.Sprintf("; %s %s", setupTitle(r.setup), cell(r))
		}
	}
	return out
}

// satTarget is sluice's target in the saturation scenario, when it ran.
func (b *benchmark) satTarget() (target, bool) {
	s := b.satSluice()
	if s == nil {
		return target{}, false
	}
	actual := secs(s.waitP99) + b.satOthers(func(r *result) string { return secs(r.waitP99) })
	return target{id: "saturation", name: fmt.Sprintf("saturation: small tenants' p99 wait ≤ %s", secs(targetSatWait)),
		met: len(s.waits) > 0 && s.waitP99 <= targetSatWait, actual: actual}, true
}

// satShareTarget is sluice's target of the flooding tenant's jobs/s in
// the saturation scenario, when it ran.
func (b *benchmark) satShareTarget() (target, bool) {
	s := b.satSluice()
	if s == nil {
		return target{}, false
	}
	room := b.sat.w.sat.floodRoom()
	share := s.bigAchieved / room
	actual := fmt.Sprintf("%s (%.0f of %.0f jobs/s)", pct(share), s.bigAchieved, room) +
		b.satOthers(func(r *result) string { return pct(r.bigAchieved / room) })
	return target{id: "saturation-share", name: fmt.Sprintf("saturation: the flooding tenant gets ≥ %s of the jobs/s the slots leave it", pct(targetSatShare)),
		met: share >= targetSatShare, actual: actual}, true
}

// scenarioTargets are sluice's targets in the scenarios other than the
// fleet.
func (b *benchmark) scenarioTargets() []target {
	var ts []target
	if t, ok := b.satTarget(); ok {
		ts = append(ts, t)
	}
	if t, ok := b.satShareTarget(); ok {
		ts = append(ts, t)
	}
	return append(ts, b.e2eTargets()...)
}

func (sc *scenario) resultOf(setup string) *result {
	for _, r := range sc.results {
		if r.setup == setup {
			return r
		}
	}
	return nil
}

func (sc *scenario) runOf(setup string) *runData {
	for _, rd := range sc.runs {
		if rd.setup == setup {
			return rd
		}
	}
	return &runData{}
}

// saturationMarkdown writes the saturation scenario's part of the report.
func (b *benchmark) saturationMarkdown(out io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	w, sc := b.sat.w, b.sat.w.sat
	small := w.tenants[1]
	if sc.floodConc > 0 {
		p("## Saturation: a tenant whose limits never bind floods the fleet")
	} else {
		p("## Saturation: a tenant with no limits floods the fleet")
	}
	p("")
	if sc.floodConc > 0 {
		p("- 1 tenant whose only rule never binds, `%s`, `%s` (more than the fleet's slots): **%s jobs enqueued at once at t=%.0fs**.",
			w.tenants[0].name, w.tenants[0].policyText(), thousands(int64(sc.big)), sc.bigAt.Seconds())
	} else {
		p("- 1 tenant with **no limits**, `%s`: **%s jobs enqueued at once at t=%.0fs**.", w.tenants[0].name, thousands(int64(sc.big)), sc.bigAt.Seconds())
	}
	p("- %d small tenants, each `%s` and sending %.0f job(s) a second at random times within %.0f s:", sc.small, small.policyText(), sc.trickle, sc.span.Seconds())
	p("  their limits never hold a job back (they are measured on the jobs their limits would start")
	p("  at once), so what they wait is the queue alone.")
	p("- Every job holds the downstream %s. The fleet: %d worker processes × `Concurrency: %d` = %d", sc.hold, sc.workers, sc.conc, sc.workers*sc.conc)
	p("  jobs at once, at most %.0f jobs/s: the burst takes at least %.0f s to work off, while the", sc.capacity(), float64(sc.big)/sc.capacity())
	p("  small tenants keep sending.")
	p("- The same set-ups as the fleet scenario (middleware in the asynq set-ups, the waiting room and")
	p("  `worker.Server`'s defaults for sluice), each with a fresh Redis, workers and downstream.")
	p("")
	markdownTable(out, satRows, b.sat.results)
	p("")
	p("The wait is measured as in the fleet scenario, for the small tenants' jobs enqueued from the")
	p("burst until its last job started (or the small tenants' last job, if sooner): in asynq's")
	p("set-ups they queue behind the burst in the pending list; in sluice's, the waiting room keeps the")
	p("pending list about as long as the fleet's concurrency and promotes tenants in turn.")
	p("")
	p("![saturation wait](img/fleet-saturation-wait.png)")
	p("")
	t, ok := b.satTarget()
	if !ok {
		return
	}
	s := b.sat.resultOf(setupSluice)
	b.floodShareNote(out, s)
	if t.met {
		p("sluice met its target: small tenants' p99 wait %s (target %s).", secs(s.waitP99), secs(targetSatWait))
		p("")
		return
	}
	p("**sluice missed its target**: small tenants' p99 wait %s (target %s). From this run's", secs(s.waitP99), secs(targetSatWait))
	p("measurements:")
	p("")
	g := b.sat.runOf(setupSluice).gate
	p("- Jobs promoted from the lines by the pumps: %s; the gate's denied decisions by rule: %s;",
		thousands(int64(counterTotal(g, "sluice_room_promoted_total"))), counterSummaryExcept(g, decisionsFamily, "rule", "verdict=denied", ""))
	p("  deferrals by reason: %s.", counterSummary(g, "sluice_worker_deferrals_total", "reason", ""))
	if len(s.stalls) > 0 {
		b.stallNote(out, s, sc.workers*sc.conc)
	}
	p("- The fleet during the burst:")
	b.capacityNote(out, s)
	if s.unfinished > 0 {
		p("- %s jobs were unfinished when the run stopped at its deadline.", thousands(int64(s.unfinished)))
	}
	p("")
}

// floodShareNote says what the flooding tenant got of what the slots
// leave it and, when that is below the target, where the slots' time went,
// from the worker processes' own timing of their jobs.
func (b *benchmark) floodShareNote(out io.Writer, s *result) {
	p := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	t, _ := b.satShareTarget()
	sc := b.sat.w.sat
	room := sc.floodRoom()
	p("The flooding tenant got %.0f jobs/s: %s of the %.0f/s that the fleet's slots leave it at %s a job", s.bigAchieved, pct(s.bigAchieved/room), room, sc.hold)
	if t.met {
		p("(target %s).", pct(targetSatShare))
		p("")
		return
	}
	p("(target %s: **missed**). A slot's time, as the worker processes timed their jobs over the middle", pct(targetSatShare))
	p("of the run (from a job's hand-over by asynq to its handler's start, the handler, and from the")
	p("handler's end to the slot's next task: the middleware's work after the handler, asynq's done and")
	p("dequeue, and any wait for a task):")
	p("")
	for _, r := range b.sat.results {
		if !r.slotsOK {
			p("- %s: not measured.", setupTitle(r.setup))
			continue
		}
		c := r.slots
		cycle := c.before + c.handler + c.between
		p("- %s: %s ms before the handler, %s ms in it, %s ms after it; a cycle of %s ms, slots busy %s of the time.",
			setupTitle(r.setup), millis(c.before), millis(c.handler), millis(c.between), millis(cycle), pct(c.busy))
	}
	if !s.slotsOK {
		p("")
		return
	}
	c := s.slots
	cycle := c.before + c.handler + c.between
	allow := float64(sc.workers*sc.conc)/cycle.Seconds() - float64(sc.small)*sc.trickle
	p("")
	p("A job holds its slot for the handler's %s ms, not the downstream's %s (the HTTP round trip and the", millis(c.handler), sc.hold)
	p("process's scheduling on a shared machine), and the slot takes its next task %s ms after the handler", millis(c.between))
	p("ends. At sluice's cycle of %s ms the slots leave the flood %.0f jobs/s, of which it got %s:", millis(cycle), allow, pct(s.bigAchieved/allow))
	if s.bigAchieved/allow < targetSatShare {
		p("below the target even at that cycle, which these figures do not explain.")
		p("")
		return
	}
	// the asynq set-ups' least time after the handler: asynq's own done
	// and dequeue
	var least time.Duration
	for _, r := range b.sat.results {
		if r.setup != setupSluice && r.slotsOK && (least == 0 || r.slots.between < least) {
			least = r.slots.between
		}
	}
	if least > 0 && c.between-least > least/5 {
		p("what keeps it from the target is the time around the handler. After it, sluice's slots spent")
		p("%s ms more than the asynq set-ups' least (%s ms against %s ms)%s; the rest, asynq's own done", millis(c.between-least), millis(c.between), millis(least), releaseNote(sc))
		p("and dequeue and the handler's overrun, the asynq set-ups' slots spend too.")
	} else {
		p("what keeps it from the target is the time around the handler, which the asynq set-ups' slots")
		p("spend too.")
	}
	p("(Their flood's jobs/s is what the slots allow at their cycle, the small tenants' share included:")
	p("those jobs wait behind the flood, above.)")
	p("")
}

// releaseNote says what sluice does in a slot after the handler when the
// flooding tenant has a concurrency rule.
func releaseNote(sc satConfig) string {
	if sc.floodConc > 0 {
		return ": the release of the job's concurrency slot, and its hand-on to the next job of the line, made in asynq's slot before it takes its next task"
	}
	return ""
}
