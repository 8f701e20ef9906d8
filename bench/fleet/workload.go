package main

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// config is the size of one benchmark run. presets holds the named ones.
type config struct {
	name    string
	tenants int           // tenants in all, the big one included
	jobs    int           // jobs in all
	big     int           // jobs of the big tenant's one burst
	bigRate int64         // the big tenant's rate, per second
	bigAt   time.Duration // when the big burst is enqueued
	medium  int           // medium tenants (20–50/s), not counted as small
	span    time.Duration // the other tenants' jobs arrive within [0, span]
	workers int           // worker processes
	conc    int           // asynq Concurrency of each worker
	drain   time.Duration // how long after the ideal end a set-up may take
	seed    uint64
	// profileAt and profileFor: the window, since the run's start, in
	// which every command Redis runs is logged (redisstats.go)
	profileAt, profileFor time.Duration
}

var presets = map[string]config{
	// full is the run of docs/benchmarks.md (issue 5's fleet benchmark).
	"full": {name: "full", tenants: 1000, jobs: 200_000, big: 50_000, bigRate: 400, bigAt: 30 * time.Second,
		medium: 20, span: 240 * time.Second, workers: 4, conc: 500, drain: 4 * time.Minute, seed: 5,
		profileAt: 60 * time.Second, profileFor: 10 * time.Second},
	// small is the smoke run (make bench-fleet-small): about a minute a set-up.
	"small": {name: "small", tenants: 100, jobs: 15_000, big: 5_000, bigRate: 200, bigAt: 5 * time.Second,
		medium: 3, span: 40 * time.Second, workers: 3, conc: 200, drain: 90 * time.Second, seed: 5,
		profileAt: 10 * time.Second, profileFor: 5 * time.Second},
	// tiny is the end-to-end test's run: a few seconds a set-up.
	"tiny": {name: "tiny", tenants: 12, jobs: 500, big: 200, bigRate: 100, bigAt: time.Second,
		medium: 1, span: 3 * time.Second, workers: 2, conc: 100, drain: 5 * time.Second, seed: 5,
		profileAt: time.Second, profileFor: time.Second},
}

// Tenant classes.
const (
	classBig    = "big"
	classMedium = "medium"
	classRate   = "rate"        // small, rate only
	classConc   = "concurrency" // small, concurrency only
	classBoth   = "rate+concurrency"
)

// tenant is one tenant of the workload: its limits (which every set-up is
// configured with and the downstream enforces), how long the downstream
// takes for one of its requests, and how many jobs it sends.
type tenant struct {
	id    int
	name  string
	class string
	rate  int64 // per second; 0: no rate rule
	burst int64
	conc  int64 // 0: no concurrency cap
	hold  time.Duration
	jobs  int
}

// small reports whether the tenant counts as small in the wait figures.
func (t tenant) small() bool { return t.class != classBig && t.class != classMedium }

// policyText is the tenant's limits as a sluice policy.
func (t tenant) policyText() string {
	s := ""
	if t.rate > 0 {
		s = fmt.Sprintf("rate=%d/s burst=%d", t.rate, t.burst)
	}
	if t.conc > 0 {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("concurrency=%d", t.conc)
	}
	return s
}

func (t tenant) policy() (*throttle.Policy, error) {
	return throttle.ParsePolicy(t.policyText())
}

// capacity is the most jobs per second the tenant's limits let through.
func (t tenant) capacity() float64 {
	c := -1.0
	if t.rate > 0 {
		c = float64(t.rate)
	}
	if t.conc > 0 {
		k := float64(t.conc) / t.hold.Seconds()
		if c < 0 || k < c {
			c = k
		}
	}
	return c
}

// job is one job of the workload: its tenant and when it is enqueued.
type job struct {
	tenant int32
	at     time.Duration
}

// workload is the tenants and their jobs; jobs are sorted by time, and
// a job's index is its identity everywhere (task id, X-Job header).
type workload struct {
	kind    string // kindFleet or kindSaturation
	cfg     config
	sat     satConfig // the saturation scenario's own settings
	tenants []tenant
	jobs    []job
	bigFrom int // jobs[bigFrom:bigFrom+cfg.big] are the big burst
}

// burstWindow is when the big burst is being worked off under its own
// limit: from its enqueue until its last job's ideal start.
func (w *workload) burstWindow() (from, to time.Duration) {
	d := time.Duration(float64(w.cfg.big) / float64(w.cfg.bigRate) * float64(time.Second))
	return w.cfg.bigAt, w.cfg.bigAt + d
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// newWorkload builds the workload of cfg deterministically from its seed.
// Tenant 0 is the big tenant (its one burst of cfg.big jobs at cfg.bigAt);
// the next cfg.medium tenants are medium ones (20–50/s, a quarter of the
// other jobs); the rest are small: six in ten limited by rate (1–10/s),
// two in ten by concurrency (1–5), two in ten by both. Every tenant but
// the big one sends part of its jobs as a trickle (at most 30% of what its
// limits allow) and the rest in one to three bursts.
func newWorkload(cfg config) (*workload, error) {
	if cfg.tenants < cfg.medium+2 || cfg.big < 1 || cfg.jobs <= cfg.big+cfg.tenants || cfg.bigRate < 1 || cfg.span <= 0 {
		return nil, fmt.Errorf("workload %q: needs at least %d tenants, a big burst, a rate, a span, and more jobs than big burst plus tenants", cfg.name, cfg.medium+2)
	}
	r := rand.New(rand.NewPCG(cfg.seed, 0x5eed))
	w := &workload{kind: kindFleet, cfg: cfg}
	for i := 0; i < cfg.tenants; i++ {
		t := tenant{id: i, name: fmt.Sprintf("t%04d", i)}
		switch {
		case i == 0:
			t.class, t.rate, t.burst, t.hold = classBig, cfg.bigRate, 20, 5*time.Millisecond
		case i <= cfg.medium:
			t.class, t.rate, t.burst = classMedium, pick(r, int64(20), 30, 50), 5
			t.hold = time.Duration(10+r.IntN(20)) * time.Millisecond
			if i%2 == 0 {
				t.conc = 10
			}
		default:
			switch i % 10 {
			case 0, 1, 2, 3, 4, 5:
				t.class, t.rate, t.burst = classRate, pick(r, int64(1), 2, 3, 5, 10), pick(r, int64(1), 1, 2, 5)
				t.hold = time.Duration(10+r.IntN(30)) * time.Millisecond
			case 6, 7:
				t.class, t.conc = classConc, pick(r, int64(1), 2, 3, 5)
				t.hold = time.Duration(50+r.IntN(200)) * time.Millisecond
			default:
				t.class, t.rate, t.burst, t.conc = classBoth, pick(r, int64(2), 5, 10), pick(r, int64(1), 2), pick(r, int64(1), 2, 3)
				t.hold = time.Duration(20+r.IntN(130)) * time.Millisecond
			}
		}
		w.tenants = append(w.tenants, t)
	}

	// Share the other jobs: a quarter to the medium tenants, the rest to
	// the small ones in proportion to their capacity, jittered.
	rest := cfg.jobs - cfg.big
	w.tenants[0].jobs = cfg.big
	mediumJobs := 0
	if cfg.medium > 0 {
		mediumJobs = rest / 4
	}
	weights := make([]float64, cfg.tenants)
	sum := 0.0
	for i := cfg.medium + 1; i < cfg.tenants; i++ {
		weights[i] = w.tenants[i].capacity() * (0.5 + r.Float64())
		sum += weights[i]
	}
	assigned := 0
	for i := 1; i < cfg.tenants; i++ {
		n := 0
		if i <= cfg.medium {
			n = mediumJobs / cfg.medium
		} else {
			n = max(1, int(float64(rest-mediumJobs)*weights[i]/sum))
		}
		w.tenants[i].jobs = n
		assigned += n
	}
	// Rounding: the last small tenants take up the difference.
	for i := cfg.tenants - 1; assigned != rest && i > cfg.medium; i-- {
		d := rest - assigned
		if d < 0 {
			d = max(d, 1-w.tenants[i].jobs)
		}
		w.tenants[i].jobs += d
		assigned += d
	}

	for i := 1; i < cfg.tenants; i++ {
		t := w.tenants[i]
		trickleRate := 0.3 * t.capacity()
		trickle := min(t.jobs/2, int(trickleRate*cfg.span.Seconds()))
		for k := 0; k < trickle; k++ {
			w.jobs = append(w.jobs, job{tenant: int32(i), at: time.Duration(r.Int64N(int64(cfg.span)))})
		}
		left := t.jobs - trickle
		bursts := min(1+r.IntN(3), left)
		for b := 0; b < bursts; b++ {
			n := left / (bursts - b)
			left -= n
			at := time.Duration(r.Int64N(int64(cfg.span) * 9 / 10))
			for k := 0; k < n; k++ {
				w.jobs = append(w.jobs, job{tenant: int32(i), at: at})
			}
		}
	}
	for k := 0; k < cfg.big; k++ {
		w.jobs = append(w.jobs, job{tenant: 0, at: cfg.bigAt})
	}
	sort.SliceStable(w.jobs, func(a, b int) bool { return w.jobs[a].at < w.jobs[b].at })
	w.bigFrom = -1
	for i, j := range w.jobs {
		if j.tenant == 0 {
			w.bigFrom = i
			break
		}
	}
	if len(w.jobs) != cfg.jobs {
		return nil, fmt.Errorf("workload %q: built %d jobs, want %d", cfg.name, len(w.jobs), cfg.jobs)
	}
	return w, nil
}

// counts says how many tenants of each class the workload has.
func (w *workload) counts() map[string]int {
	m := map[string]int{}
	for _, t := range w.tenants {
		m[t.class]++
	}
	return m
}
