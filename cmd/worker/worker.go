package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/cmdline"
	"github.com/sluicehq/sluice/internal/redisurl"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// Exit codes: the contract scripts rely on.
const (
	exitOK      = cmdline.ExitOK
	exitFailure = cmdline.ExitFailure
	exitUsage   = cmdline.ExitUsage
)

// Defaults of the flags.
const (
	queuesDefault          = "default=1"
	adminDefault           = "127.0.0.1:9464"
	shutdownTimeoutDefault = 8 * time.Second
	// adminOff is the --admin value that turns the admin endpoints off.
	adminOff = "off"
	// adminEnv is the environment variable for --admin's default.
	adminEnv = "SLUICE_WORKER_ADMIN"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version string

const usageLine = "worker [--redis URL] [--queues Q=1,...] [--concurrency N] [FLAGS]"

// usageError is a malformed command line: exit code 2 and the usage line.
type usageError = cmdline.UsageError

var usagef = cmdline.Usagef

// options are the parsed flags.
type options struct {
	redis           string
	redisSource     string // "--redis" or SLUICE_REDIS_URL, for messages
	url             *redisurl.URL
	queues          map[string]int
	concurrency     int
	admin           string
	advertise       string
	probe           string
	prefix          string
	shutdownTimeout time.Duration
	recoverLease    time.Duration
	tenantLabels    bool
	logFormat       string
	logLevel        slog.Level
	asynqLevel      asynq.LogLevel
}

// run is the whole program: it parses args, runs the worker until ctx ends
// (main cancels it on SIGTERM or SIGINT), drains it and returns the exit
// code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) int {
	o, err := parseFlags(args, env)
	if code, done := cmdline.Parsed(err, "worker", version, usageLine, helpText, stdout, stderr); done {
		return code
	}
	if o.probe != "" {
		return probe(ctx, o, stdout, stderr)
	}
	if err := serve(ctx, o, stdout, stderr); err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			fmt.Fprintln(stderr, "worker: interrupted before it started")
			return exitFailure
		}
		fmt.Fprintf(stderr, "worker: %s\n", err)
		return exitFailure
	}
	return exitOK
}

var errVersion = cmdline.ErrVersion

func versionString() string { return cmdline.Version(version) }

// parseFlags reads and checks the command line. Every error but the
// requests for help and version is a *usageError.
func parseFlags(args []string, env func(string) string) (*options, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var (
		o                          options
		queues, logLevel           string
		showHelp, showVersion, hlp bool
	)
	fs.StringVar(&o.redis, "redis", "", "")
	fs.StringVar(&queues, "queues", queuesDefault, "")
	fs.IntVar(&o.concurrency, "concurrency", worker.ConcurrencyDefault, "")
	fs.StringVar(&o.admin, "admin", cmp.Or(env(adminEnv), adminDefault), "")
	fs.StringVar(&o.advertise, "advertise", "", "")
	fs.StringVar(&o.probe, "probe", "", "")
	fs.StringVar(&o.prefix, "prefix", throttle.PrefixDefault, "")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", shutdownTimeoutDefault, "")
	fs.DurationVar(&o.recoverLease, "recover-lease", worker.RecoverLeaseDefault, "")
	fs.BoolVar(&o.tenantLabels, "tenant-labels", false, "")
	fs.StringVar(&o.logFormat, "log-format", "text", "")
	fs.StringVar(&logLevel, "log-level", "info", "")
	fs.BoolVar(&showHelp, "help", false, "")
	fs.BoolVar(&hlp, "h", false, "")
	fs.BoolVar(&showVersion, "version", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usagef("%s", flagError(err))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case showHelp || hlp:
		return nil, flag.ErrHelp
	case showVersion:
		return nil, errVersion
	case fs.NArg() > 0:
		return nil, usagef("unexpected argument %q: the worker takes only flags", fs.Arg(0))
	}

	o.redisSource = "--redis"
	if o.redis == "" {
		o.redisSource = redisurl.EnvVar
	}
	u, err := redisurl.Parse(redisurl.Value(o.redis, env))
	if err != nil {
		return nil, usagef("%s: %v", o.redisSource, err)
	}
	o.url = u
	if o.queues, err = parseQueues(queues); err != nil {
		return nil, usagef("--queues %q: %v", queues, err)
	}
	if o.concurrency < 1 {
		return nil, usagef("--concurrency %d: must be at least 1 (default %d)", o.concurrency, worker.ConcurrencyDefault)
	}
	if o.prefix == "" || strings.ContainsAny(o.prefix, "{}") {
		return nil, usagef("--prefix %q: must be non-empty and without { or }; use the prefix your producers and sluice use (default %q)", o.prefix, throttle.PrefixDefault)
	}
	if o.shutdownTimeout <= 0 {
		return nil, usagef("--shutdown-timeout %s: must be positive, e.g. 8s or 1m", o.shutdownTimeout)
	}
	if o.recoverLease < time.Second || o.recoverLease > 10*time.Minute {
		return nil, usagef("--recover-lease %s: must be between 1s and 10m, e.g. 15s", o.recoverLease)
	}
	if o.admin != adminOff {
		if _, _, err := net.SplitHostPort(o.admin); err != nil {
			source := "--admin"
			if !set["admin"] {
				source = adminEnv
			}
			return nil, usagef("%s %q: want HOST:PORT such as %s (port 0 picks a free one), or %q", source, o.admin, adminDefault, adminOff)
		}
	}
	if o.advertise != "" {
		host, port, err := net.SplitHostPort(o.advertise)
		if ip := net.ParseIP(host); err != nil || host == "" || port == "" || port == "0" || (ip != nil && ip.IsUnspecified()) {
			return nil, usagef("--advertise %q: want the HOST:PORT at which other machines reach this worker's admin endpoints, such as 10.0.3.7:9464", o.advertise)
		}
		if o.admin == adminOff {
			return nil, usagef("--advertise %q: the admin endpoints are off (--admin %s); give them an address with --admin", o.advertise, adminOff)
		}
	}
	switch o.probe {
	case "", "healthz", "readyz":
	default:
		return nil, usagef("--probe %q: want healthz or readyz, the admin endpoint to ask", o.probe)
	}
	if o.probe != "" && o.admin == adminOff {
		return nil, usagef("--probe %s: the admin endpoints are off (--admin %s); give the worker's --admin address", o.probe, adminOff)
	}
	switch o.logFormat {
	case "text", "json":
	default:
		return nil, usagef("--log-format %q: want text or json", o.logFormat)
	}
	if o.logLevel, o.asynqLevel, err = parseLevel(logLevel); err != nil {
		return nil, usagef("--log-level %q: %v", logLevel, err)
	}
	return &o, nil
}

// flagError turns the flag package's message into one naming the flag as
// the user wrote it.
func flagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "flag --" + strings.TrimPrefix(name, "-") + " needs a value"
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + strings.TrimPrefix(name, "-")
	}
	msg = strings.Replace(msg, " for flag -", " for flag --", 1)
	want := "want a whole number"
	if strings.Contains(msg, " for flag --shutdown-timeout: ") {
		want = "want a duration such as 30s or 5m"
	}
	msg = strings.Replace(msg, ": parse error", ": "+want, 1)
	return strings.Replace(msg, ": invalid syntax", ": "+want, 1)
}

// parseQueues reads NAME[=PRIORITY][,NAME[=PRIORITY]...].
func parseQueues(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, errors.New("empty queue name; write NAME=PRIORITY[,NAME=PRIORITY...], e.g. default=1,critical=6")
		}
		name, prio, hasPrio := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, fmt.Errorf("%q has no queue name; e.g. default=1", part)
		}
		n := 1
		if hasPrio {
			var err error
			n, err = strconv.Atoi(strings.TrimSpace(prio))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("queue %q: priority %q must be a whole number of at least 1", name, prio)
			}
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("queue %q is given twice", name)
		}
		out[name] = n
	}
	return out, nil
}

func formatQueues(q map[string]int) string {
	names := make([]string, 0, len(q))
	for n := range q {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		names[i] = n + "=" + strconv.Itoa(q[n])
	}
	return strings.Join(names, ",")
}

// serve runs the worker until ctx ends, then drains it.
func serve(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	log := newLogger(stderr, o.logFormat, o.logLevel)

	if o.url.Kind == redisurl.KindMemory {
		emb, err := startEmbedded(o.url.Addrs[0])
		if err != nil {
			return err
		}
		defer emb.Close()
		fmt.Fprintf(stdout, "embedded Redis (miniredis, in memory: its data ends with this process) listening on %s\n", emb.Addr())
		fmt.Fprintf(stdout, "in other terminals: export %s=memory://%s\n", redisurl.EnvVar, emb.Addr())
	}

	client := o.url.NewClient()
	defer client.Close()
	if err := o.url.Ping(ctx, client, 0); err != nil {
		return err
	}

	var ln net.Listener
	if o.admin != adminOff {
		var err error
		if ln, err = net.Listen("tcp", o.admin); err != nil {
			return fmt.Errorf("--admin %s: cannot listen: %v; choose another address with --admin HOST:PORT (port 0 picks a free one) or turn the endpoints off with --admin %s", o.admin, cmdline.ListenCause(err), adminOff)
		}
		defer ln.Close()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newQueueCollector(asynq.NewInspectorFromRedisClient(client), o.queues),
	)
	var advertised string
	if ln != nil {
		advertised = advertise(o.advertise, ln.Addr().(*net.TCPAddr))
	}
	srv, err := worker.New(client, &worker.Config{
		Prefix:       o.prefix,
		RecoverLease: o.recoverLease,
		Admin:        advertised,
		Asynq: asynq.Config{
			Queues:          o.queues,
			Concurrency:     o.concurrency,
			ShutdownTimeout: o.shutdownTimeout,
			Logger:          asynqLogger{log.With("component", "asynq")},
			LogLevel:        o.asynqLevel,
		},
		Gate: worker.GateConfig{Logger: log, Registerer: reg, TenantLabels: o.tenantLabels},
	})
	if err != nil {
		return err
	}
	// The built-in handlers, with an HTTP client that keeps a connection for
	// each job that may run at once.
	httpClient := worker.NewHTTPClient(o.concurrency)
	defer httpClient.CloseIdleConnections()
	worker.RegisterBuiltins(srv, httpClient, 0)
	var processed atomic.Int64
	srv.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			defer processed.Add(1)
			return next.ProcessTask(ctx, t)
		})
	})

	adm := &admin{client: client, gatherer: reg}
	var httpSrv *http.Server
	if ln != nil {
		httpSrv = &http.Server{Handler: adm.handler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() {
			if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin endpoints stopped", "err", err)
			}
		}()
	}

	if err := srv.Start(); err != nil {
		srv.Shutdown()
		stopAdmin(httpSrv)
		return err
	}
	adm.ready.Store(true)
	attrs := []any{
		"redis", o.url.String(), "queues", formatQueues(o.queues), "concurrency", o.concurrency,
		"prefix", o.prefix, "handlers", worker.TypeHTTP + "," + worker.TypeSleep, "pid", pidOf(),
	}
	if ln != nil {
		attrs = append(attrs, "admin", "http://"+ln.Addr().String())
		if advertised != "" && advertised != ln.Addr().String() {
			attrs = append(attrs, "advertise", advertised)
		}
	}
	log.Info("worker started", attrs...)

	<-ctx.Done()
	adm.ready.Store(false)
	log.Info("draining", "shutdown_timeout", o.shutdownTimeout)
	start := time.Now()
	srv.Shutdown()
	stopAdmin(httpSrv)
	log.Info("worker stopped", "jobs_processed", processed.Load(), "drain", time.Since(start).Round(time.Millisecond))
	return nil
}

func stopAdmin(s *http.Server) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
}

// queueCollector reports the sizes of the worker's queues, read with
// asynq's inspector at each scrape.
type queueCollector struct {
	inspector *asynq.Inspector
	queues    []string
	tasks     *prometheus.Desc
	latency   *prometheus.Desc
}

func newQueueCollector(in *asynq.Inspector, queues map[string]int) *queueCollector {
	c := &queueCollector{
		inspector: in,
		tasks:     prometheus.NewDesc("sluice_queue_tasks", "Tasks in each of the worker's queues, by state (pending, active, scheduled, retry, archived, completed), as asynq counts them.", []string{"queue", "state"}, nil),
		latency:   prometheus.NewDesc("sluice_queue_latency_seconds", "Age of the oldest pending task of each of the worker's queues.", []string{"queue"}, nil),
	}
	for q := range queues {
		c.queues = append(c.queues, q)
	}
	sort.Strings(c.queues)
	return c
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tasks
	ch <- c.latency
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	for _, q := range c.queues {
		info, err := c.inspector.GetQueueInfo(q)
		if err != nil {
			// A queue nobody has enqueued to yet does not exist in asynq.
			info = &asynq.QueueInfo{}
		}
		for _, s := range []struct {
			state string
			n     int
		}{{"pending", info.Pending}, {"active", info.Active}, {"scheduled", info.Scheduled}, {"retry", info.Retry}, {"archived", info.Archived}, {"completed", info.Completed}} {
			ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, float64(s.n), q, s.state)
		}
		ch <- prometheus.MustNewConstMetric(c.latency, prometheus.GaugeValue, info.Latency.Seconds(), q)
	}
}

// pingTimeout bounds /readyz's check of Redis.
const pingTimeout = time.Second

// admin serves /metrics, /healthz and /readyz.
type admin struct {
	ready    atomic.Bool // the asynq server takes jobs
	client   redis.UniversalClient
	gatherer prometheus.Gatherer
}

func (a *admin) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !a.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: the worker is not taking jobs (starting or draining)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pingTimeout)
	defer cancel()
	if err := a.client.Ping(ctx).Err(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: Redis does not answer: %v\n", err)
		return
	}
	fmt.Fprintln(w, "ok")
}
