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
	Allowance time.Duration
	Workers   int
	Began     time.Time
	Took      time.Duration
	Command   string
	Machine   savedMachine
	Runs      []savedRun
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
	RedisCPU, RedisPeak   float64
	Leftover              map[string]int
	TimedOut              bool
	LoadBefore, LoadAfter string
	Problems              []string
	Samples               []sample
	CmdStats              map[string]cmdStat
	Profile               *redisProfile
}

func (b *benchmark) save(file string) error {
	m := b.machine
	s := savedBench{Config: b.o.cfg.name, Setups: b.o.setups, Allowance: b.o.allowance, Workers: b.o.cfg.workers,
		Began: b.began, Took: b.took, Command: b.command, Prev: b.prev,
		Machine: savedMachine{Cores: m.cores, CPU: m.cpu, Memory: m.memory, Kernel: m.kernel, Go: m.goVer, Redis: m.redis}}
	for _, rd := range b.runs {
		r := savedRun{Setup: rd.setup, Enq: rd.enq, EnqErrs: rd.enqErrs, FirstErr: rd.firstErr, Served: rd.served,
			LastOK: rd.lastOK, Elapsed: rd.elapsed, Deliveries: rd.deliveries, Calls: rd.calls, Gate: rd.gate, Denied: rd.denied,
			WorkerCPU: rd.workerCPU, RedisCPU: rd.redisCPU, RedisPeak: rd.redisPeak, Leftover: rd.leftover,
			TimedOut: rd.timedOut, LoadBefore: rd.loadBefore, LoadAfter: rd.loadAfter, Problems: rd.problems, Samples: rd.samples,
			CmdStats: rd.cmdStats, Profile: rd.profile}
		for _, arr := range rd.arrivals {
			at, job, conc, st := make([]time.Duration, len(arr)), make([]int32, len(arr)), make([]int32, len(arr)), make([]uint8, len(arr))
			for i, a := range arr {
				at[i], job[i], conc[i], st[i] = a.at, a.job, a.conc, a.status
			}
			r.At, r.Job, r.Conc, r.Status = append(r.At, at), append(r.Job, job), append(r.Conc, conc), append(r.Status, st)
		}
		s.Runs = append(s.Runs, r)
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

// load reads a saved run and rebuilds its benchmark: the workload again
// from its config (it is deterministic), the recordings from the file.
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
	b := &benchmark{o: options{cfg: cfg, setups: s.Setups, allowance: s.Allowance}, w: w, began: s.Began, took: s.Took, command: s.Command, prev: s.Prev,
		machine: machine{cores: m.Cores, cpu: m.CPU, memory: m.Memory, kernel: m.Kernel, goVer: m.Go, redis: m.Redis}}
	for _, r := range s.Runs {
		if len(r.Enq) != len(w.jobs) || len(r.Served) != len(w.jobs) || len(r.At) != len(w.tenants) {
			return nil, fmt.Errorf("%s: set-up %s does not match the %s workload", file, r.Setup, cfg.name)
		}
		rd := &runData{setup: r.Setup, enq: r.Enq, enqErrs: r.EnqErrs, firstErr: r.FirstErr, served: r.Served,
			lastOK: r.LastOK, elapsed: r.Elapsed, deliveries: r.Deliveries, calls: r.Calls, gate: r.Gate, denied: r.Denied, cores: m.Cores,
			workerCPU: r.WorkerCPU, redisCPU: r.RedisCPU, redisPeak: r.RedisPeak, leftover: r.Leftover,
			timedOut: r.TimedOut, loadBefore: r.LoadBefore, loadAfter: r.LoadAfter, problems: r.Problems, samples: r.Samples,
			cmdStats: r.CmdStats, profile: r.Profile}
		for ti := range r.At {
			if len(r.Job[ti]) != len(r.At[ti]) || len(r.Conc[ti]) != len(r.At[ti]) || len(r.Status[ti]) != len(r.At[ti]) {
				return nil, fmt.Errorf("%s: set-up %s: tenant %d's arrivals are inconsistent", file, r.Setup, ti)
			}
			arr := make([]arrival, len(r.At[ti]))
			for i := range arr {
				if j := r.Job[ti][i]; j < 0 || int(j) >= len(w.jobs) {
					return nil, fmt.Errorf("%s: set-up %s: arrival of unknown job %d", file, r.Setup, j)
				}
				arr[i] = arrival{at: r.At[ti][i], job: r.Job[ti][i], conc: r.Conc[ti][i], status: r.Status[ti][i]}
			}
			rd.arrivals = append(rd.arrivals, arr)
		}
		b.runs = append(b.runs, rd)
		b.results = append(b.results, compute(w, rd))
		b.plotEnd = max(b.plotEnd, rd.elapsed)
	}
	b.plotted = plotTenants(w, 3)
	return b, nil
}
