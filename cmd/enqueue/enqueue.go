package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/sluicehq/sluice/internal/cmdline"
	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/redisurl"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// Exit codes: the contract scripts rely on.
const (
	exitOK      = cmdline.ExitOK
	exitFailure = cmdline.ExitFailure
	exitUsage   = cmdline.ExitUsage
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version string

const usageLine = "enqueue [--tenant T --type TYPE [--payload JSON] | --file F|-] [FLAGS]"

// usageError is a malformed command line: exit code 2 and the usage line.
type usageError = cmdline.UsageError

var usagef = cmdline.Usagef

var errVersion = cmdline.ErrVersion

// options are the parsed flags. The job flags are also the defaults of the
// lines of --file.
type options struct {
	url    *redisurl.URL
	prefix string

	tenant, typ, queue string
	payload            []byte
	cost               int64
	in                 time.Duration
	id                 string
	maxRetry           int
	maxRetrySet        bool
	priority           taskspec.Priority
	pools              []string
	key                string

	count    int
	file     string
	cronSpec string
	schedule cron.Schedule
	quiet    bool

	// partial enqueues the good lines of a file with bad ones; dryRun only
	// checks and shows; randomIDs gives lines without an id a random one
	// instead of one derived from the line.
	partial, dryRun, randomIDs bool
}

// run is the whole program: it parses args, enqueues and returns the exit
// code. ctx ends on SIGINT or SIGTERM (see main): enqueue then stops at the
// next batch and says how many jobs it enqueued.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	o, err := parseFlags(args, env)
	if code, done := cmdline.Parsed(err, "enqueue", version, usageLine, helpText, stdout, stderr); done {
		return code
	}

	var in io.Reader
	name := o.file
	if o.file == "-" {
		in, name = stdin, "standard input"
	} else if o.file != "" {
		f, err := os.Open(o.file)
		if err != nil {
			fmt.Fprintf(stderr, "enqueue: cannot read %s\n", strings.TrimPrefix(err.Error(), "open "))
			return exitFailure
		}
		defer f.Close()
		in = f
	}

	if o.dryRun {
		e := &enqueuer{o: o, stdout: stdout, stderr: stderr}
		if o.file != "" {
			return e.file(ctx, in, name)
		}
		return e.dryRunFlags()
	}

	client := o.url.NewInteractiveClient()
	defer client.Close()
	if err := o.url.Ping(ctx, client, 0); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "enqueue: interrupted: nothing was enqueued")
		} else {
			fmt.Fprintf(stderr, "enqueue: %s\n", err)
		}
		return exitFailure
	}
	qc, err := queue.New(client, &queue.Config{Prefix: o.prefix})
	if err != nil {
		fmt.Fprintf(stderr, "enqueue: %s\n", err)
		return exitFailure
	}
	defer qc.Close()

	e := &enqueuer{o: o, client: qc, rdb: client, stdout: stdout, stderr: stderr}
	switch {
	case o.cronSpec != "":
		return e.cron(ctx)
	case o.file != "":
		return e.file(ctx, in, name)
	case o.count > 1:
		return e.count(ctx)
	default:
		return e.one(ctx)
	}
}

func versionString() string { return cmdline.Version(version) }

// cronParser reads --cron: five fields, six with seconds first, or a
// descriptor such as @every 10s; CRON_TZ=Zone in front picks a time zone.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseFlags reads and checks the command line. Every error but the
// requests for help and version is a *usageError.
func parseFlags(args []string, env func(string) string) (*options, error) {
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var (
		o                     options
		redisFlag, payload    string
		priority              string
		showHelp, showVersion bool
	)
	fs.StringVar(&redisFlag, "redis", "", "")
	fs.StringVar(&o.prefix, "prefix", throttle.PrefixDefault, "")
	fs.StringVar(&o.tenant, "tenant", "", "")
	fs.StringVar(&o.typ, "type", "", "")
	fs.StringVar(&payload, "payload", "", "")
	fs.StringVar(&o.queue, "queue", "default", "")
	fs.Int64Var(&o.cost, "cost", 1, "")
	fs.StringVar(&priority, "priority", "normal", "")
	fs.Func("pool", "", func(v string) error {
		if err := names.Pool(v); err != nil {
			return err
		}
		if !slices.Contains(o.pools, v) {
			o.pools = append(o.pools, v)
		}
		return nil
	})
	fs.Func("key", "", func(v string) error {
		if err := names.Key(v); err != nil {
			return err
		}
		o.key = v
		return nil
	})
	fs.IntVar(&o.count, "count", 1, "")
	fs.DurationVar(&o.in, "in", 0, "")
	fs.StringVar(&o.id, "id", "", "")
	fs.IntVar(&o.maxRetry, "max-retry", 0, "")
	fs.StringVar(&o.file, "file", "", "")
	fs.StringVar(&o.cronSpec, "cron", "", "")
	fs.BoolVar(&o.partial, "partial", false, "")
	fs.BoolVar(&o.dryRun, "dry-run", false, "")
	fs.BoolVar(&o.randomIDs, "random-ids", false, "")
	fs.BoolVar(&o.quiet, "quiet", false, "")
	fs.BoolVar(&o.quiet, "q", false, "")
	fs.BoolVar(&showHelp, "help", false, "")
	fs.BoolVar(&showHelp, "h", false, "")
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
	case showHelp:
		return nil, flag.ErrHelp
	case showVersion:
		return nil, errVersion
	case fs.NArg() > 0:
		return nil, usagef("unexpected argument %q; enqueue takes only flags (quote a payload: --payload '{\"ms\":100}')", fs.Arg(0))
	}
	o.maxRetrySet = set["max-retry"]

	source := "--redis"
	if redisFlag == "" {
		source = redisurl.EnvVar
	}
	u, err := redisurl.Parse(redisurl.Value(redisFlag, env))
	if err != nil {
		return nil, usagef("%s: %v", source, err)
	}
	o.url = u
	if o.prefix == "" || strings.ContainsAny(o.prefix, "{}") {
		return nil, usagef("--prefix %q: must be non-empty and without { or }; use the prefix your workers use (default %q)", o.prefix, throttle.PrefixDefault)
	}

	if o.file != "" {
		for _, f := range []string{"payload", "id", "count", "cron"} {
			if set[f] {
				return nil, usagef("--%s cannot be used with --file: each line gives its own job (the other job flags are defaults for the lines)", f)
			}
		}
	} else {
		for _, f := range []string{"partial", "random-ids"} {
			if set[f] {
				return nil, usagef("--%s goes with --file: it says how the lines of a file are enqueued", f)
			}
		}
		if o.tenant == "" {
			return nil, usagef("missing --tenant: the tenant whose limits the job counts against (or --file for JSON lines)")
		}
		if o.typ == "" {
			return nil, usagef("missing --type: the job's type, e.g. http or sleep")
		}
	}
	if set["tenant"] {
		if err := names.Tenant(o.tenant); err != nil {
			return nil, usagef("--tenant: %v", err)
		}
	}
	if set["type"] && strings.TrimSpace(o.typ) == "" {
		return nil, usagef("--type %q: the type must not be blank; it names the handler that runs the job", o.typ)
	}
	if set["payload"] {
		if !json.Valid([]byte(payload)) {
			return nil, usagef("--payload %s: not valid JSON (%s); quote it for the shell, e.g. --payload '{\"ms\":100}'", clip(payload), jsonProblem([]byte(payload)))
		}
		o.payload = []byte(strings.TrimSpace(payload))
	}
	if strings.TrimSpace(o.queue) == "" {
		return nil, usagef("--queue %q: the queue name must not be blank (default \"default\")", o.queue)
	}
	if o.cost < 1 {
		return nil, usagef("--cost %d: must be at least 1 (the default)", o.cost)
	}
	if o.priority, err = taskspec.ParsePriority(priority); err != nil {
		return nil, usagef("--priority %q: must be high, normal or low (default normal)", priority)
	}
	if o.count < 1 {
		return nil, usagef("--count %d: must be at least 1", o.count)
	}
	if o.in < 0 {
		return nil, usagef("--in %s: must not be negative", o.in)
	}
	if o.maxRetry < 0 {
		return nil, usagef("--max-retry %d: must be 0 or more", o.maxRetry)
	}
	if set["id"] {
		if strings.TrimSpace(o.id) == "" {
			return nil, usagef("--id %q: the task id must not be blank; leave --id out for a random one", o.id)
		}
		if o.count > 1 || o.cronSpec != "" {
			return nil, usagef("--id names one job: it cannot be used with --count %d or --cron (a second job with the id would be refused)", o.count)
		}
	}
	if o.dryRun && o.cronSpec != "" {
		return nil, usagef("--dry-run cannot be used with --cron: check the job once with --dry-run alone")
	}
	if set["cron"] {
		o.schedule, err = cronParser.Parse(o.cronSpec)
		if err != nil {
			return nil, usagef("--cron %q: %v; e.g. \"*/5 * * * *\" (every 5 minutes), \"*/10 * * * * *\" (every 10 s, seconds first) or \"@every 30s\"", o.cronSpec, err)
		}
	}
	return &o, nil
}

// clip quotes s for a message, shortened when long.
func clip(s string) string {
	if len(s) > 60 {
		return strconv.Quote(s[:57]) + "…"
	}
	return strconv.Quote(s)
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
	if strings.Contains(msg, " for flag --in: ") {
		want = "want a duration such as 30s or 5m"
	}
	msg = strings.Replace(msg, ": parse error", ": "+want, 1)
	return strings.Replace(msg, ": invalid syntax", ": "+want, 1)
}

// enqueuer runs one mode.
type enqueuer struct {
	o      *options
	client *queue.Client
	rdb    redis.UniversalClient
	stdout io.Writer
	stderr io.Writer
}

// flagJob is the job the flags describe.
func (e *enqueuer) flagJob() queue.Job {
	o := e.o
	return queue.Job{Tenant: o.tenant, Task: asynq.NewTask(o.typ, o.payload), Options: jobOptions(o.queue, o.cost, o.priority, o.key, o.pools, o.in, o.id, o.maxRetry, o.maxRetrySet)}
}

func jobOptions(q string, cost int64, p taskspec.Priority, key string, pools []string, in time.Duration, id string, maxRetry int, maxRetrySet bool) []asynq.Option {
	opts := []asynq.Option{asynq.Queue(q)}
	if cost != 1 {
		opts = append(opts, queue.Cost(cost))
	}
	if key != "" {
		opts = append(opts, queue.Key(key))
	}
	if len(pools) > 0 {
		opts = append(opts, queue.Pools(pools...))
	}
	if p != taskspec.PriorityNormal {
		opts = append(opts, queue.Priority(p))
	}
	if in > 0 {
		opts = append(opts, asynq.ProcessIn(in))
	}
	if id != "" {
		opts = append(opts, asynq.TaskID(id))
	}
	if maxRetrySet {
		opts = append(opts, asynq.MaxRetry(maxRetry))
	}
	return opts
}

// describe says what was enqueued, in one line. A job scheduled without
// --in waits in its tenant's line, parked in asynq's schedule at its
// fallback time, until a worker promotes it.
func describe(info *asynq.TaskInfo, tenant string, p taskspec.Priority, in time.Duration) string {
	s := fmt.Sprintf("enqueued task %s (type %s, tenant %s, queue %s%s", info.ID, info.Type, tenant, info.Queue, priorityNote(p))
	switch {
	case info.State == asynq.TaskStateScheduled && in == 0:
		s += ", waiting in its tenant's line"
	case info.State == asynq.TaskStateScheduled && !info.NextProcessAt.IsZero():
		s += ", due " + info.NextProcessAt.UTC().Format(time.RFC3339)
	}
	return s + ")"
}

// priorityNote names a priority other than normal, after a comma.
func priorityNote(p taskspec.Priority) string {
	if p == taskspec.PriorityNormal {
		return ""
	}
	return ", " + p.String() + " priority"
}

// dryRunFlags says what the flags would enqueue, without Redis.
func (e *enqueuer) dryRunFlags() int {
	o := e.o
	what := fmt.Sprintf("%d %s of type %s for tenant %s in queue %s%s", o.count, plural(o.count, "job", "jobs"), o.typ, o.tenant, o.queue, priorityNote(o.priority))
	if o.in > 0 {
		what += ", due in " + o.in.String()
	}
	if o.id != "" {
		what += ", task id " + o.id
	}
	fmt.Fprintf(e.stdout, "dry run: would enqueue %s; nothing was enqueued\n", what)
	return exitOK
}

// one enqueues the single job of the flags.
func (e *enqueuer) one(ctx context.Context) int {
	j := e.flagJob()
	info, err := e.client.Enqueue(context.WithoutCancel(ctx), j.Tenant, j.Task, j.Options...)
	if err != nil {
		fmt.Fprintf(e.stderr, "enqueue: %s\n", explain(err))
		return exitFailure
	}
	fmt.Fprintln(e.stdout, describe(info, j.Tenant, e.o.priority, e.o.in))
	return exitOK
}

// explain is the message for a job that could not be enqueued.
func explain(err error) string {
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return err.Error() + ": a task with this id is already in the queue (give another --id or \"id\")"
	}
	return err.Error()
}

// batchSize is how many jobs go to EnqueueBatch at once. Between batches
// enqueue reports progress and notices an interrupt.
const batchSize = 256

// count enqueues --count copies of the job of the flags.
func (e *enqueuer) count(ctx context.Context) int {
	o := e.o
	p := e.progress(int64(o.count))
	start := time.Now()
	var done, failed int
	interrupted := false
	for sent := 0; sent < o.count; {
		if ctx.Err() != nil {
			interrupted = true
			break
		}
		n := min(batchSize, o.count-sent)
		jobs := make([]queue.Job, n)
		for i := range jobs {
			jobs[i] = e.flagJob()
		}
		for i, r := range e.client.EnqueueBatch(context.WithoutCancel(ctx), jobs) {
			if r.Err != nil {
				failed++
				p.note(fmt.Sprintf("enqueue: job %d: %s", sent+i+1, explain(r.Err)))
				continue
			}
			done++
		}
		sent += n
		p.add(done, failed)
	}
	p.finish()
	if interrupted {
		fmt.Fprintf(e.stdout, "interrupted: enqueued %d of %s for tenant %s (%d failed); the other %d %s not enqueued\n", done, human.Count(o.count, "job", "jobs"), o.tenant, failed, o.count-done-failed, plural(o.count-done-failed, "was", "were"))
		return exitFailure
	}
	fmt.Fprintf(e.stdout, "enqueued %d of %s for tenant %s in %s%s\n", done, human.Count(o.count, "job", "jobs"), o.tenant, elapsed(start, done), failedNote(failed))
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// elapsed is "0.52s (1923/s)".
func elapsed(start time.Time, n int) string {
	d := time.Since(start)
	s := fmt.Sprintf("%.2fs", d.Seconds())
	if n > 1 && d > 0 {
		s += fmt.Sprintf(" (%.0f/s)", float64(n)/d.Seconds())
	}
	return s
}

func failedNote(failed int) string {
	if failed == 0 {
		return ""
	}
	return fmt.Sprintf("; %d failed (reported above)", failed)
}
