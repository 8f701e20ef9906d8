package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/worker"
)

// The set-ups compared.
const (
	setupXRate     = "xrate"
	setupRedisRate = "redisrate"
	setupSluice    = "sluice"
	// setupPlain is asynq without any throttle, the end-to-end scenario's
	// baseline.
	setupPlain = "plain"
)

// The handlers a worker may run: sluice's built-in http handler, calling
// the downstream, or one that returns at once.
const (
	handlerHTTP = "http"
	handlerNoop = "noop"
)

var setups = []string{setupXRate, setupRedisRate, setupSluice}

// setupTitle names a set-up in the report.
func setupTitle(s string) string {
	switch s {
	case setupPlain:
		return "plain asynq"
	case setupXRate:
		return "1. asynq + x/time/rate per process"
	case setupRedisRate:
		return "2. asynq + redis_rate"
	default:
		return "3. sluice"
	}
}

// roleEnv makes the benchmark's own executable run as a worker process.
const roleEnv = "FLEETBENCH_ROLE"

// limits is one tenant's limits as the set-ups 1 and 2 read them from the
// file the benchmark writes (set-up 3 reads sluice's policy store).
type limits struct {
	Rate  int64 `json:"rate,omitempty"`
	Burst int64 `json:"burst,omitempty"`
	Conc  int64 `json:"conc,omitempty"`
}

// workerStats is what a worker process prints when it exits.
type workerStats struct {
	Deliveries int64 `json:"deliveries"` // tasks dequeued (handler invocations of any kind)
	Calls      int64 `json:"calls"`      // requests the http handler made
	// Denied counts the throttle's denials in set-ups 1 and 2, by the
	// limit that denied ("rate", "concurrency"): each sends the job back
	// to asynq for another delivery.
	Denied map[string]int64 `json:"denied,omitempty"`
	// Gate holds sluice's gate and waiting-room counters (set-up 3):
	// decisions by verdict and rule, deferrals by reason, handler
	// outcomes, jobs promoted from the lines.
	Gate map[string]float64 `json:"gate,omitempty"`
	// Slots is how the process's asynq slots spent the middle of the run.
	Slots slotStats `json:"slots"`
}

// decisionsFamily is the gate's counter of admission decisions.
const decisionsFamily = "sluice_worker_decisions_total"

// gateCounters are the gate's and the waiting room's metrics a sluice
// worker reports at exit.
var gateCounters = []string{decisionsFamily, "sluice_worker_deferrals_total", "sluice_worker_handler_outcomes_total",
	"sluice_room_promoted_total", "sluice_room_skipped_total"}

// denials counts a middleware's denials by the limit that denied.
type denials struct {
	rate, conc atomic.Int64
}

func (d *denials) deny(why string) error {
	if why == whyConc {
		d.conc.Add(1)
	} else {
		d.rate.Add(1)
	}
	return &rateLimitError{RetryIn: wikiRetryIn(), Why: why}
}

func (d *denials) counts() map[string]int64 {
	return map[string]int64{whyRate: d.rate.Load(), whyConc: d.conc.Load()}
}

// The limits a middleware denies by.
const (
	whyRate = "rate"
	whyConc = "concurrency"
)

// gatherCounters reads the named counters as "name{label=value,...}".
func gatherCounters(g prometheus.Gatherer, names []string) map[string]float64 {
	out := map[string]float64{}
	if g == nil {
		return out
	}
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] += m.GetCounter().GetValue()
		}
	}
	return out
}

// rateLimitError is asynq's documented rate-limit error (asynq wiki, "Rate
// Limiting"): IsFailure says it is not a failure and RetryDelayFunc brings
// the task back after RetryIn.
type rateLimitError struct {
	RetryIn time.Duration
	Why     string
}

func (e *rateLimitError) Error() string {
	return fmt.Sprintf("rate limited (%s; retry in %v)", e.Why, e.RetryIn)
}

func isRateLimitError(err error) bool {
	var e *rateLimitError
	return errors.As(err, &e)
}

func retryDelay(n int, err error, t *asynq.Task) time.Duration {
	var e *rateLimitError
	if errors.As(err, &e) {
		return e.RetryIn
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// wikiRetryIn is the asynq wiki's retry delay for a rate-limited task: a
// random whole number of seconds below 10.
func wikiRetryIn() time.Duration { return time.Duration(rand.IntN(10)) * time.Second }

// runWorker is a worker process of one set-up: it prints "ready" once it
// takes jobs and, on SIGTERM, shuts down and prints its workerStats as
// JSON. It returns the process's exit code.
func runWorker(args []string) int {
	fs := flag.NewFlagSet("fleetbench worker", flag.ContinueOnError)
	setup := fs.String("setup", "", "xrate, redisrate, sluice or plain")
	addr := fs.String("redis", "", "Redis address host:port (with -cluster: the Cluster's nodes, comma-separated)")
	cluster := fs.Bool("cluster", false, "-redis names the nodes of a Redis Cluster")
	conc := fs.Int("concurrency", 100, "asynq Concurrency")
	procs := fs.Int("procs", 1, "worker processes in the fleet (set-up 1 divides each limit by it)")
	limitsFile := fs.String("limits", "", "JSON file of tenant → limits (set-ups 1 and 2)")
	kind := fs.String("handler", handlerHTTP, "the jobs' handler: http (calls the downstream) or noop")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the worker, from ready to its stop, into this directory")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := workerMain(*setup, *addr, *cluster, *conc, *procs, *limitsFile, *kind, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench worker:", err)
		return 1
	}
	return 0
}

func workerMain(setup, addr string, cluster bool, conc, procs int, limitsFile, kind, cpuprofile string) error {
	if addr == "" || conc < 1 || procs < 1 {
		return errors.New("-redis, -concurrency ≥ 1 and -procs ≥ 1 are required")
	}
	if kind != handlerHTTP && kind != handlerNoop {
		return fmt.Errorf("-handler %q: want http or noop", kind)
	}
	rdb := newClient(addr, cluster, 100)
	defer rdb.Close()

	var deliveries, calls atomic.Int64
	var clock slotClock
	// BaseContext is called once for every task asynq dequeues, whatever
	// the handler then does with it: it counts deliveries the same way in
	// every set-up, and marks when the slot handed the task over. The
	// intervals are left to worker.Server's defaults in set-up 3 and given
	// the same values in the others.
	cfg := asynq.Config{
		Concurrency: conc,
		Queues:      map[string]int{"default": 1},
		LogLevel:    asynq.FatalLevel,
		BaseContext: func() context.Context {
			deliveries.Add(1)
			return clock.handed()
		},
	}
	// The same handler in every set-up: sluice's built-in http handler,
	// with a client that keeps a connection per running job.
	// The handler notes when it starts; the client's transport sends
	// that time with the request (X-Started), so that the downstream
	// measures each request's delivery.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = conc
	httpClient := &http.Client{Transport: stampStart{transport}}
	defer httpClient.CloseIdleConnections()
	builtin := &worker.HTTPHandler{Client: httpClient}
	handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		started := time.Now()
		calls.Add(1)
		defer clock.began(ctx)()
		if kind == handlerNoop {
			return nil
		}
		return builtin.ProcessTask(withStart(ctx, started), t)
	})

	var start func() error
	var stop func()
	var gatherer func() prometheus.Gatherer
	var denied denials
	switch setup {
	case setupPlain:
		cfg.TaskCheckInterval = worker.TaskCheckIntervalDefault
		cfg.DelayedTaskCheckInterval = worker.DelayedTaskCheckIntervalDefault
		mux := asynq.NewServeMux()
		mux.Handle(worker.TypeHTTP, handler)
		srv := asynq.NewServerFromRedisClient(rdb, cfg)
		start = func() error { return srv.Start(mux) }
		stop = srv.Shutdown
	case setupXRate, setupRedisRate:
		lim, err := readLimits(limitsFile)
		if err != nil {
			return err
		}
		cfg.TaskCheckInterval = worker.TaskCheckIntervalDefault
		cfg.DelayedTaskCheckInterval = worker.DelayedTaskCheckIntervalDefault
		cfg.IsFailure = func(err error) bool { return !isRateLimitError(err) }
		cfg.RetryDelayFunc = retryDelay
		var mw asynq.MiddlewareFunc
		if setup == setupXRate {
			mw = xrateMiddleware(lim, procs, &denied)
		} else {
			mw = redisRateMiddleware(rdb, lim, &denied)
		}
		mux := asynq.NewServeMux()
		mux.Use(mw)
		mux.Handle(worker.TypeHTTP, handler)
		srv := asynq.NewServerFromRedisClient(rdb, cfg)
		start = func() error { return srv.Start(mux) }
		stop = srv.Shutdown
	case setupSluice:
		srv, err := worker.New(rdb, &worker.Config{
			Asynq: cfg,
			Gate:  worker.GateConfig{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))},
		})
		if err != nil {
			return err
		}
		srv.Handle(worker.TypeHTTP, handler)
		start = srv.Start
		stop = srv.Shutdown
		gatherer = srv.Gate().Gatherer
	default:
		return fmt.Errorf("-setup %q: want xrate, redisrate, sluice or plain", setup)
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if err := start(); err != nil {
		return err
	}
	if cpuprofile != "" {
		stopProfile, err := profileCPU(cpuprofile, fmt.Sprintf("worker-%s-%s-%d.pprof", setup, kind, os.Getpid()))
		if err != nil {
			stop()
			return err
		}
		defer stopProfile()
	}
	fmt.Println("ready")
	<-sig
	stop()
	st := workerStats{Deliveries: deliveries.Load(), Calls: calls.Load(), Slots: clock.stats(conc)}
	if setup == setupXRate || setup == setupRedisRate {
		st.Denied = denied.counts()
	}
	if gatherer != nil {
		st.Gate = gatherCounters(gatherer(), gateCounters)
	}
	return json.NewEncoder(os.Stdout).Encode(st)
}

// startedHeader carries the time the job's handler started, and
// admittedHeader the time sluice's gate admitted the job (its decision's
// Redis time, set-up 3 only), in Unix nanoseconds: the worker processes,
// Redis and the downstream run on one host, so their wall clocks agree.
const (
	startedHeader  = "X-Started"
	admittedHeader = "X-Admitted"
)

type startKey struct{}

// withStart is ctx noting that the job's handler started at t.
func withStart(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, startKey{}, t)
}

// stampStart is a transport that sends, with a request whose context
// notes its handler's start (withStart), that time in startedHeader, and
// the time sluice's gate admitted its job, when it did, in
// admittedHeader.
type stampStart struct{ next http.RoundTripper }

func (s stampStart) RoundTrip(req *http.Request) (*http.Response, error) {
	t, ok := req.Context().Value(startKey{}).(time.Time)
	if !ok {
		return s.next.RoundTrip(req)
	}
	// A RoundTripper must not change its caller's request: a shallow
	// copy with its own headers.
	r := new(http.Request)
	*r = *req
	r.Header = req.Header.Clone()
	r.Header.Set(startedHeader, strconv.FormatInt(t.UnixNano(), 10))
	if a, ok := worker.AdmissionFrom(req.Context()); ok && !a.FailOpen && !a.Decision.Now.IsZero() {
		r.Header.Set(admittedHeader, strconv.FormatInt(a.Decision.Now.UnixNano(), 10))
	}
	return s.next.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (s stampStart) CloseIdleConnections() {
	if c, ok := s.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func readLimits(path string) (map[string]limits, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-limits: %w", err)
	}
	m := map[string]limits{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("-limits %s: %w", path, err)
	}
	return m, nil
}

// asRateLimit turns a downstream 429 (the built-in handler's
// RetryAfterError) into a rate-limit error, so that set-ups 1 and 2 honour
// Retry-After without counting a failure, as sluice does.
func asRateLimit(err error) error {
	var ra *worker.RetryAfterError
	if errors.As(err, &ra) {
		return &rateLimitError{RetryIn: ra.Delay, Why: "downstream 429"}
	}
	return err
}

// xrateMiddleware is set-up 1: asynq's documented pattern, one
// golang.org/x/time/rate limiter per tenant in each process, each allowing
// 1/procs of the tenant's rate (at least a burst of 1), and a per-process
// semaphore for a concurrency cap (cap/procs slots, at least 1). A denied
// task is retried after a random 0–9 s, as in the asynq wiki.
func xrateMiddleware(lim map[string]limits, procs int, denied *denials) asynq.MiddlewareFunc {
	type local struct {
		rl  *rate.Limiter
		sem chan struct{}
	}
	locals := map[string]*local{}
	for name, l := range lim {
		lc := &local{}
		if l.Rate > 0 {
			lc.rl = rate.NewLimiter(rate.Limit(float64(l.Rate)/float64(procs)), int(max(1, l.Burst/int64(procs))))
		}
		if l.Conc > 0 {
			lc.sem = make(chan struct{}, max(1, l.Conc/int64(procs)))
		}
		locals[name] = lc
	}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			lc := locals[t.Headers()[taskspec.TenantHeader]]
			if lc == nil {
				return asRateLimit(next.ProcessTask(ctx, t))
			}
			if lc.sem != nil {
				select {
				case lc.sem <- struct{}{}:
					defer func() { <-lc.sem }()
				default:
					return denied.deny(whyConc)
				}
			}
			if lc.rl != nil && !lc.rl.Allow() {
				return denied.deny(whyRate)
			}
			return asRateLimit(next.ProcessTask(ctx, t))
		})
	}
}

// redisRateMiddleware is set-up 2: one go-redis/redis_rate limiter shared
// by the fleet (GCRA in Redis, keyed by tenant); a denied task is retried
// after the RetryAfter redis_rate gives (no reservation: every denied task
// aims at the next free token). No concurrency cap.
func redisRateMiddleware(rdb redis.UniversalClient, lim map[string]limits, denied *denials) asynq.MiddlewareFunc {
	rl := redis_rate.NewLimiter(rdb)
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			tenant := t.Headers()[taskspec.TenantHeader]
			l, ok := lim[tenant]
			if ok && l.Rate > 0 {
				res, err := rl.Allow(ctx, "rl:"+tenant, redis_rate.Limit{Rate: int(l.Rate), Burst: int(max(1, l.Burst)), Period: time.Second})
				if err != nil {
					return fmt.Errorf("redis_rate: %w", err)
				}
				if res.Allowed == 0 {
					denied.rate.Add(1)
					return &rateLimitError{RetryIn: max(res.RetryAfter, 0), Why: whyRate}
				}
			}
			return asRateLimit(next.ProcessTask(ctx, t))
		})
	}
}

// newClient is a client of the Redis at addr, or of the Cluster whose nodes
// addr lists (comma-separated).
func newClient(addr string, cluster bool, pool int) redis.UniversalClient {
	if cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addr, ","), PoolSize: pool})
	}
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool})
}
