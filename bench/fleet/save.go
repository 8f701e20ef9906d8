package main

import (
	"encoding/gob"
	"fmt"
	"os"
	"time"
)

// savedBench is a run's recordings on disk (-save), so that the report and
// plots can be written again from the same run (-render) without running
// it again.
type savedBench struct {
	Config    string
	Setups    []string
	Scenarios []string
	Allowance time.Duration
	Workers   int
	// FloodConcurrency: -flood-concurrency (0 in runs saved before it)
	FloodConcurrency int
	// E2EPolicy: -e2e-policy ("" in runs saved before it: the default)
	E2EPolicy string
	Began     time.Time
	Took      time.Duration
	Command   string
	Machine   savedMachine
	Runs      []savedRun
	SatRuns   []savedRun
	E2E       []e2eRound
	Prev      previous
}

type savedMachine struct {
	Cores                          int
	CPU, Memory, Kernel, Go, Redis string
}

type savedRun struct {
	Setup                 string
	Enq                   []time.Duration
	EnqErrs               int
	FirstErr              string
	At                    [][]time.Duration
	Job, Conc             [][]int32
	Status                [][]uint8
	Served                []uint32
	LastOK, Elapsed       time.Duration
	Deliveries, Calls     int64
	Gate                  map[string]float64
	Denied                map[string]int64
	WorkerCPU             time.Duration
	Slots                 slotSum // zero in runs saved before it
	RedisCPU, RedisPeak   float64
	Leftover              map[string]int
	TimedOut              bool
	LoadBefore, LoadAfter string
	Problems              []string
	Samples               []sample
	CmdStats              map[string]cmdStat
	Profile               *redisProfile
	// Delay and SinceAdmit: each arrival's delivery delay and time since
	// its admission (arrival.delay, arrival.sinceAdmit); absent in runs
	// saved before they were recorded, read as unknown.
	Delay, SinceAdmit [][]time.Duration
}

func (b *benchmark) save(file string) error {
	m := b.machine
	s := savedBench{Config: b.o.cfg.name, Setups: b.o.setups, Scenarios: b.o.scenarios, Allowance: b.o.allowance, Workers: b.o.cfg.workers,
		FloodConcurrency: b.o.floodConc, E2EPolicy: b.o.e2ePolicy, Began: b.began, Took: b.took, Command: b.command, Prev: b.prev, E2E: b.e2e,
		Machine: savedMachine{Cores: m.cores, CPU: m.cpu, Memory: m.memory, Kernel: m.kernel, Go: m.goVer, Redis: m.redis}}
	for _, rd := range b.runs {
		s.Runs = append(s.Runs, toSaved(rd))
	}
	if b.sat != nil {
		for _, rd := range b.sat.runs {
			s.SatRuns = append(s.SatRuns, toSaved(rd))
		}
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(&s); err != nil {
		_ = f.Close()
		return fmt.Errorf("save %s: %w", file, err)
	}
	return f.Close()
}

func toSaved(rd *runData) savedRun {
	r := savedRun{Setup: rd.setup, Enq: rd.enq, EnqErrs: rd.enqErrs, FirstErr: rd.firstErr, Served: rd.served,
		LastOK: rd.lastOK, Elapsed: rd.elapsed, Deliveries: rd.deliveries, Calls: rd.calls, Gate: rd.gate, Denied: rd.denied,
		WorkerCPU: rd.workerCPU, Slots: rd.slots, RedisCPU: rd.redisCPU, RedisPeak: rd.redisPeak, Leftover: rd.leftover,
		TimedOut: rd.timedOut, LoadBefore: rd.loadBefore, LoadAfter: rd.loadAfter, Problems: rd.problems, Samples: rd.samples,
		CmdStats: rd.cmdStats, Profile: rd.profile}
	for _, arr := range rd.arrivals {
		at, job, conc, st := make([]time.Duration, len(arr)), make([]int32, len(arr)), make([]int32, len(arr)), make([]uint8, len(arr))
		delay, admit := make([]time.Duration, len(arr)), make([]time.Duration, len(arr))
		for i, a := range arr {
			at[i], job[i], conc[i], st[i], delay[i], admit[i] = a.at, a.job, a.conc, a.status, a.delay, a.sinceAdmit
		}
		r.At, r.Job, r.Conc, r.Status = append(r.At, at), append(r.Job, job), append(r.Conc, conc), append(r.Status, st)
		r.Delay, r.SinceAdmit = append(r.Delay, delay), append(r.SinceAdmit, admit)
	}
	return r
}

// fromSaved rebuilds a set-up's recordings of workload w.
func fromSaved(r savedRun, w *workload, cores int, allowance time.Duration) (*runData, error) {
	if len(r.Enq) != len(w.jobs) || len(r.Served) != len(w.jobs) || len(r.At) != len(w.tenants) {
		return nil, fmt.Errorf("set-up %s does not match the %s workload", r.Setup, w.cfg.name)
	}
	rd := &runData{setup: r.Setup, enq: r.Enq, enqErrs: r.EnqErrs, firstErr: r.FirstErr, served: r.Served,
		lastOK: r.LastOK, elapsed: r.Elapsed, deliveries: r.Deliveries, calls: r.Calls, gate: r.Gate, denied: r.Denied, cores: cores,
		workerCPU: r.WorkerCPU, slots: r.Slots, redisCPU: r.RedisCPU, redisPeak: r.RedisPeak, leftover: r.Leftover,
		timedOut: r.TimedOut, loadBefore: r.LoadBefore, loadAfter: r.LoadAfter, problems: r.Problems, samples: r.Samples,
		cmdStats: r.CmdStats, profile: r.Profile, allowance: allowance}
	if r.Delay != nil && len(r.Delay) != len(r.At) || r.SinceAdmit != nil && len(r.SinceAdmit) != len(r.At) {
		return nil, fmt.Errorf("set-up %s: delays of %d tenants, admissions of %d, arrivals of %d", r.Setup, len(r.Delay), len(r.SinceAdmit), len(r.At))
	}
	for ti := range r.At {
		if len(r.Job[ti]) != len(r.At[ti]) || len(r.Conc[ti]) != len(r.At[ti]) || len(r.Status[ti]) != len(r.At[ti]) ||
			r.Delay != nil && len(r.Delay[ti]) != len(r.At[ti]) || r.SinceAdmit != nil && len(r.SinceAdmit[ti]) != len(r.At[ti]) {
			return nil, fmt.Errorf("set-up %s: tenant %d's arrivals are inconsistent", r.Setup, ti)
		}
		arr := make([]arrival, len(r.At[ti]))
		for i := range arr {
			if j := r.Job[ti][i]; j < 0 || int(j) >= len(w.jobs) {
				return nil, fmt.Errorf("set-up %s: arrival of unknown job %d", r.Setup, j)
			}
			arr[i] = arrival{at: r.At[ti][i], delay: unknownDelay, sinceAdmit: unknownDelay, job: r.Job[ti][i], conc: r.Conc[ti][i], status: r.Status[ti][i]}
			if r.Delay != nil {
				arr[i].delay = r.Delay[ti][i]
			}
			if r.SinceAdmit != nil {
				arr[i].sinceAdmit = r.SinceAdmit[ti][i]
			}
		}
		rd.arrivals = append(rd.arrivals, arr)
	}
	return rd, nil
}

// load reads a saved run and rebuilds its benchmark: the workloads again
// from their config (they are deterministic), the recordings from the
// file.
func load(file string) (*benchmark, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var s savedBench
	if err := gob.NewDecoder(f).Decode(&s); err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	cfg, ok := presets[s.Config]
	if !ok {
		return nil, fmt.Errorf("%s: unknown config %q", file, s.Config)
	}
	cfg.workers = s.Workers
	w, err := newWorkload(cfg)
	if err != nil {
		return nil, err
	}
	m := s.Machine
	b := &benchmark{o: options{cfg: cfg, setups: s.Setups, scenarios: s.Scenarios, allowance: s.Allowance, floodConc: s.FloodConcurrency, e2ePolicy: s.E2EPolicy}, w: w,
		began: s.Began, took: s.Took, command: s.Command, prev: s.Prev, e2e: s.E2E,
		machine: machine{cores: m.Cores, cpu: m.CPU, memory: m.Memory, kernel: m.Kernel, goVer: m.Go, redis: m.Redis}}
	for _, r := range s.Runs {
		rd, err := fromSaved(r, w, m.Cores, s.Allowance)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		b.runs = append(b.runs, rd)
		b.results = append(b.results, compute(w, rd))
		b.plotEnd = max(b.plotEnd, rd.elapsed)
	}
	if len(s.SatRuns) > 0 {
		sc := satPresets[cfg.name]
		sc.floodConc = s.FloodConcurrency
		sw, err := newSaturationWorkload(cfg.name, sc, cfg.seed)
		if err != nil {
			return nil, err
		}
		b.sat = &scenario{w: sw}
		for _, r := range s.SatRuns {
			rd, err := fromSaved(r, sw, m.Cores, s.Allowance)
			if err != nil {
				return nil, fmt.Errorf("%s: saturation: %w", file, err)
			}
			b.sat.runs = append(b.sat.runs, rd)
			b.sat.results = append(b.sat.results, compute(sw, rd))
		}
	}
	b.plotted = plotTenants(w, 3)
	return b, nil
}
