// Command fleet is sluice's fleet benchmark: the same
// bursty multi-tenant workload through three set-ups, side by side:
//
//  1. asynq with golang.org/x/time/rate per process (asynq's documented
//     rate-limiting pattern);
//  2. asynq with a go-redis/redis_rate middleware and RetryDelayFunc
//     (distributed, no reservations, no concurrency cap);
//  3. sluice: the producer's queue.Client brings every job to the waiting
//     room (a job its tenant cannot start now waits in its tenant's line
//     in Redis); the workers are worker.Server with its defaults (the gate,
//     and the waiting room's pump, which Start starts); the tenants'
//     policies in sluice's policy store.
//
// For each set-up it starts a private redis-server (its own port, no
// persistence), N worker processes (this program again, as a worker of
// that set-up) and a downstream HTTP server on 127.0.0.1 that enforces
// every tenant's limits strictly, answers 429 with Retry-After when one is
// exceeded and records every arrival. Then it enqueues the workload on
// schedule, waits until every job is done (or a deadline), stops the
// workers with SIGTERM and reads Redis's CPU and memory from INFO.
//
// It prints the comparison and, with -out DIR, writes DIR/benchmarks.md and
// its plots under DIR/img/.
//
// It lives in its own module (bench/go.mod), so that the library's users do
// not inherit what only the benchmark uses (plots, redis_rate, x/time/rate).
// From the bench directory:
//
//	go run ./fleet -config full -out ../docs  # make bench-fleet
//	go run ./fleet -config small              # make bench-fleet-small
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

func main() {
	if os.Getenv(roleEnv) == "worker" {
		os.Exit(runWorker(os.Args[1:]))
	}
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// runMain is the benchmark's command line; it returns the exit code.
func runMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("config", "small", "workload size: full, small or tiny")
	out := fs.String("out", "", "write benchmarks.md and img/ into this directory (nothing written when empty)")
	only := fs.String("setups", strings.Join(setups, ","), "set-ups to run, comma-separated: xrate, redisrate, sluice")
	scen := fs.String("scenarios", strings.Join(scenarios, ","), "scenarios to run, comma-separated: "+strings.Join(scenarios, ", "))
	workers := fs.Int("workers", 0, "worker processes per set-up in the fleet scenario (0: the config's)")
	allowance := fs.Duration("allowance", 20*time.Millisecond, "jitter the downstream forgives on a rate (GCRA tolerance)")
	save := fs.String("save", "", "also save the run's recordings to this file (for -render)")
	render := fs.String("render", "", "run nothing: write the report of the run saved in this file (with -out)")
	cluster := fs.Bool("cluster", false, "run the end-to-end rounds on a private Redis Cluster of 3 masters (redis-server with cluster support)")
	floodConc := fs.Int("flood-concurrency", 0, "give the saturation scenario's flooding tenant a concurrency rule of this many (more than the fleet's slots; 0: no limits)")
	e2ePol := fs.String("e2e-policy", e2ePolicy, "every tenant's policy in sluice's end-to-end rounds, or \"none\" for no policy (the waiting room's own path: jobs parked, turned and handed over, charged nothing)")
	cpuprofile := fs.String("cpuprofile", "", "write CPU profiles into this directory: this program's (bench.pprof: the producers and the downstream) and each worker process's (worker-SETUP-HANDLER-PID.pprof), for go tool pprof")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fleetbench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *render != "" {
		b, err := load(*render)
		if err != nil {
			fmt.Fprintln(stderr, "fleetbench:", err)
			return 1
		}
		return b.finish(*out, stdout, stderr)
	}
	cfg, ok := presets[*name]
	if !ok {
		fmt.Fprintf(stderr, "fleetbench: -config %q: want full, small or tiny\n", *name)
		return 2
	}
	if *workers < 0 || *workers > 64 {
		fmt.Fprintf(stderr, "fleetbench: -workers %d: want 1–64 (0 for the config's %d)\n", *workers, cfg.workers)
		return 2
	}
	if *workers > 0 {
		cfg.workers = *workers
	}
	if *allowance < 0 || *allowance > time.Second {
		fmt.Fprintf(stderr, "fleetbench: -allowance %s: want 0–1s\n", *allowance)
		return 2
	}
	var chosen []string
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(setups, s) {
			fmt.Fprintf(stderr, "fleetbench: -setups: %q is not one of xrate, redisrate, sluice\n", s)
			return 2
		}
		if !slices.Contains(chosen, s) {
			chosen = append(chosen, s)
		}
	}
	// Keep the set-ups in their numbered order.
	slices.SortFunc(chosen, func(a, b string) int { return slices.Index(setups, a) - slices.Index(setups, b) })

	var kinds []string
	for _, s := range strings.Split(*scen, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(scenarios, s) {
			fmt.Fprintf(stderr, "fleetbench: -scenarios: %q is not one of %s\n", s, strings.Join(scenarios, ", "))
			return 2
		}
		kinds = append(kinds, s)
	}

	if *out != "" {
		// made before the run, so that a directory that cannot be made
		// does not lose a run's results at its end
		if err := os.MkdirAll(*out, 0o755); err != nil {
			fmt.Fprintf(stderr, "fleetbench: -out %q: %v\n", *out, err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if sc := satPresets[cfg.name]; *floodConc != 0 && *floodConc <= sc.workers*sc.conc {
		fmt.Fprintf(stderr, "fleetbench: -flood-concurrency %d: want 0 (no limits) or more than the saturation fleet's %d slots, so that it never binds\n", *floodConc, sc.workers*sc.conc)
		return 2
	}
	if *e2ePol != e2eNoPolicy {
		if _, err := throttle.ParsePolicy(*e2ePol); err != nil {
			fmt.Fprintf(stderr, "fleetbench: -e2e-policy %q: %v (want a policy in sluice's text form, or \"none\")\n", *e2ePol, err)
			return 2
		}
	}
	o := options{cfg: cfg, setups: chosen, scenarios: kinds, allowance: *allowance, log: stderr, cluster: *cluster, floodConc: *floodConc, e2ePolicy: *e2ePol}
	if *cpuprofile != "" {
		stopProfile, err := profileCPU(*cpuprofile, "bench.pprof")
		if err != nil {
			fmt.Fprintf(stderr, "fleetbench: -cpuprofile %q: %v (want a directory this program can write into)\n", *cpuprofile, err)
			return 2
		}
		defer stopProfile()
		o.cpuprofile = *cpuprofile
	}
	var prev previous
	if *out != "" {
		prev = readPrevious(filepath.Join(*out, "benchmarks.md"))
	}
	b, err := bench(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "fleetbench:", err)
		return 1
	}
	b.prev = prev
	b.command = "cd bench && go run ./fleet " + strings.Join(commandArgs(args), " ")
	if *save != "" {
		if err := b.save(*save); err != nil {
			fmt.Fprintln(stderr, "fleetbench:", err)
			return 1
		}
	}
	return b.finish(*out, stdout, stderr)
}

// commandArgs is the command line as the report shows it: without the
// -save file, a path of this machine.
func commandArgs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-save" || a == "--save":
			i++
		case strings.HasPrefix(a, "-save=") || strings.HasPrefix(a, "--save="):
		default:
			out = append(out, a)
		}
	}
	return out
}

// finish prints the table and writes the report into out, if given.
func (b *benchmark) finish(out string, stdout, stderr io.Writer) int {
	if len(b.results) > 0 {
		printTable(stdout, rows, b.results)
	}
	if b.sat != nil {
		fmt.Fprintln(stdout, "\nSaturation:")
		printTable(stdout, satRows, b.sat.results)
	}
	for _, s := range summarizeE2E(b.e2e) {
		fmt.Fprintf(stdout, "\nEnd to end, %s jobs: plain asynq %.0f jobs/s, sluice %.0f jobs/s (%.2f×)\n", s.handler, s.plainJPS, s.sluiceJPS, s.ratio)
	}
	if out == "" {
		return 0
	}
	if err := b.write(out); err != nil {
		fmt.Fprintln(stderr, "fleetbench:", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nwrote %s\n", filepath.Join(out, "benchmarks.md"))
	return 0
}

// benchmark is a whole run: the workload and each set-up's recordings.
type benchmark struct {
	o       options
	w       *workload
	runs    []*runData
	results []*result
	machine machine
	began   time.Time
	took    time.Duration
	command string
	plotted []int
	plotEnd time.Duration
	prev    previous   // the report this run replaces
	sat     *scenario  // the saturation scenario, when run
	e2e     []e2eRound // the end-to-end scenario's rounds, when run
}

// scenario is one of the other scenarios' runs: its workload and each
// set-up's recordings.
type scenario struct {
	w       *workload
	runs    []*runData
	results []*result
}

// runs reports whether o asks for the scenario kind.
func (o options) runs(kind string) bool { return slices.Contains(o.scenarios, kind) }

func bench(ctx context.Context, o options) (*benchmark, error) {
	w, err := newWorkload(o.cfg)
	if err != nil {
		return nil, err
	}
	b := &benchmark{o: o, w: w, machine: readMachine(), began: time.Now()}
	if o.runs(kindFleet) {
		from, to := w.burstWindow()
		fmt.Fprintf(o.log, "workload %s: %d tenants, %d jobs (big burst %d at %s, drained by %s under its limit); ideal end %s\n",
			o.cfg.name, len(w.tenants), len(w.jobs), o.cfg.big, from, to, w.idealEnd().Round(time.Second))
		for _, s := range o.setups {
			rd, err := runSetup(ctx, o, w, s)
			if err != nil {
				return nil, fmt.Errorf("set-up %s: %w", s, err)
			}
			b.runs = append(b.runs, rd)
			b.results = append(b.results, compute(w, rd))
			b.plotEnd = max(b.plotEnd, rd.elapsed)
		}
	}
	if o.runs(kindSaturation) {
		sc := satPresets[o.cfg.name]
		sc.floodConc = o.floodConc
		sw, err := newSaturationWorkload(o.cfg.name, sc, o.cfg.seed)
		if err != nil {
			return nil, err
		}
		limits := "no limits"
		if sc.floodConc > 0 {
			limits = sw.tenants[0].policyText()
		}
		fmt.Fprintf(o.log, "saturation %s: a tenant with %s sends %d jobs at %s, %d small tenants trickle; the fleet runs %d at once (%.0f jobs/s at most)\n",
			o.cfg.name, limits, sc.big, sc.bigAt, sc.small, sc.workers*sc.conc, sc.capacity())
		b.sat = &scenario{w: sw}
		for _, s := range o.setups {
			rd, err := runSetup(ctx, o, sw, s)
			if err != nil {
				return nil, fmt.Errorf("saturation, set-up %s: %w", s, err)
			}
			b.sat.runs = append(b.sat.runs, rd)
			b.sat.results = append(b.sat.results, compute(sw, rd))
		}
	}
	if o.runs(kindEndToEnd) {
		ec := e2ePresets[o.cfg.name]
		fmt.Fprintf(o.log, "end to end %s: %d jobs over %d tenants per round, %d round(s) of plain asynq and sluice per handler\n",
			o.cfg.name, ec.jobs, ec.tenants, ec.pairs)
		if b.e2e, err = runE2E(ctx, o, ec); err != nil {
			return nil, err
		}
	}
	b.took = time.Since(b.began)
	b.plotted = plotTenants(w, 3)
	return b, nil
}

// write writes benchmarks.md and the plots into dir.
func (b *benchmark) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	img := filepath.Join(dir, "img")
	if len(b.runs) > 0 {
		for _, rd := range b.runs {
			if err := plotArrivals(b.w, rd, b.plotted, b.plotEnd, filepath.Join(img, "fleet-arrivals-"+rd.setup+".png")); err != nil {
				return fmt.Errorf("plot: %w", err)
			}
		}
		if err := plotWaits(b.results, "Small tenants' queue wait during the big burst (jobs their own limits would start at once)",
			targetWait, filepath.Join(img, "fleet-wait.png")); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		if err := plotQueues(b.runs, b.plotEnd, filepath.Join(img, "fleet-queues.png")); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	if b.sat != nil {
		if err := plotWaits(b.sat.results, "Saturation: small tenants' queue wait while a tenant with no limits floods the fleet",
			targetSatWait, filepath.Join(img, "fleet-saturation-wait.png")); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "benchmarks.md"))
	if err != nil {
		return err
	}
	b.markdown(f)
	return f.Close()
}
