package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/cmdline"
	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/redisurl"
	"github.com/sluicehq/sluice/throttle"
)

// Exit codes: the contract scripts rely on.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitDenied is admit --dry-run's answer "the job would not be
	// admitted now": neither a success nor a failure of the command.
	exitDenied = 3
)

// errDenied makes run exit with exitDenied; the command has printed why.
var errDenied = errors.New("would not be admitted")

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version string

// usageError is a malformed command line: exit code 2 and the usage line.
type usageError struct {
	cmd *command // nil: the top-level usage
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd *command, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// helpRequested makes run print a command's help and exit 0.
type helpRequested struct{ cmd *command }

func (helpRequested) Error() string { return "help requested" }

// app is one invocation of sluice.
type app struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	env    func(string) string

	redisFlag string
	prefix    string
}

// command is one subcommand.
type command struct {
	name    string // "policy set"
	usage   string // the usage line, after "sluice "
	summary string // for the command list
	help    string // more text for "sluice help CMD"
	flags   func(fs *flag.FlagSet, o *opts)
	run     func(a *app, c *command, o *opts, args []string) error
}

// opts holds every subcommand flag; each command registers the ones it has.
type opts struct {
	json     bool
	file     string
	prune    bool
	dryRun   bool
	cost     int64
	id       string
	once     bool
	interval durationFlag
	limit    int
	invalid  bool
	shadow   bool
	state    string
	queue    string
	priority string

	listen     string
	public     bool
	allowWrite bool
	metrics    stringList
	prometheus string
	authFile   string
	history    durationFlag
	maxTenants int
}

// run is the whole program: it parses args, runs the command and returns
// the exit code. stdin, stdout and stderr are the process's own in main.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	a := &app{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, env: env}
	err := a.dispatch(args)
	var (
		ue   *usageError
		help helpRequested
	)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errDenied):
		return exitDenied
	case errors.As(err, &help):
		a.printHelp(stdout, help.cmd)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "sluice: %s\n", ue.msg)
		if ue.cmd != nil {
			fmt.Fprintf(stderr, "usage: sluice %s\n", ue.cmd.usage)
			fmt.Fprintf(stderr, "run 'sluice help %s' for details\n", ue.cmd.name)
		} else {
			fmt.Fprintf(stderr, "usage: %s\n", topUsage)
			fmt.Fprintln(stderr, "run 'sluice help' for the commands and flags")
		}
		return exitUsage
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		fmt.Fprintln(stderr, "sluice: interrupted")
		return exitFailure
	default:
		fmt.Fprintf(stderr, "sluice: %s\n", err)
		return exitFailure
	}
}

const topUsage = "sluice [--redis URL] [--prefix PREFIX] COMMAND [ARGS]"

// globalFlags registers --redis and --prefix, which every command accepts
// before or after its name.
func (a *app) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.redisFlag, "redis", a.redisFlag, "")
	fs.StringVar(&a.prefix, "prefix", a.prefix, "")
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses flags anywhere among the positional arguments (the
// standard library stops at the first one); "--" ends the flags.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// flagError turns the flag package's message into one naming the flag as
// the user wrote it.
func flagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "flag --" + name + " needs a value"
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + strings.TrimPrefix(name, "-")
	}
	return strings.Replace(msg, " for flag -", " for flag --", 1)
}

func (a *app) dispatch(args []string) error {
	fs := newFlagSet("sluice")
	a.globalFlags(fs)
	var showHelp, showVersion bool
	fs.BoolVar(&showHelp, "help", false, "")
	fs.BoolVar(&showHelp, "h", false, "")
	fs.BoolVar(&showVersion, "version", false, "")
	if err := fs.Parse(args); err != nil {
		return usagef(nil, "%s", flagError(err))
	}
	rest := fs.Args()
	switch {
	case showHelp:
		return helpRequested{}
	case showVersion:
		return a.version()
	case len(rest) == 0:
		return usagef(nil, "no command given")
	}
	name := rest[0]
	rest = rest[1:]
	switch name {
	case "help":
		if len(rest) == 0 {
			return helpRequested{}
		}
		c := lookup(strings.Join(rest, " "))
		if c == nil {
			if g := group(rest[0]); g != nil && len(rest) == 1 {
				return helpRequested{cmd: groupCommand(rest[0])}
			}
			return usagef(nil, "no command %q; commands: %s", strings.Join(rest, " "), commandNames())
		}
		return helpRequested{cmd: c}
	case "version":
		if len(rest) > 0 {
			return usagef(lookup("version"), "version takes no arguments, got %q", rest[0])
		}
		return a.version()
	}
	if g := group(name); g != nil {
		gc := groupCommand(name)
		if len(rest) > 0 {
			if c := lookup(name + " " + rest[0]); c != nil {
				return a.runCommand(c, rest[1:])
			}
		}
		if c := lookup(name); c != nil {
			// a command that also has subcommands (jobs, jobs run)
			return a.runCommand(c, rest)
		}
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help") {
				return helpRequested{cmd: gc}
			}
			return usagef(gc, "%s needs a subcommand: %s", name, subNames(g))
		}
		c := lookup(name + " " + rest[0])
		if c == nil {
			return usagef(gc, "unknown subcommand %q of %s; use one of: %s", rest[0], name, subNames(g))
		}
		return a.runCommand(c, rest[1:])
	}
	c := lookup(name)
	if c == nil {
		return usagef(nil, "unknown command %q; commands: %s", name, commandNames())
	}
	return a.runCommand(c, rest)
}

func (a *app) runCommand(c *command, args []string) error {
	fs := newFlagSet(c.name)
	a.globalFlags(fs)
	o := &opts{}
	if c.flags != nil {
		c.flags(fs, o)
	}
	if fs.Lookup("json") != nil {
		// -o json, kubectl's and asynq's CLI habit, is --json
		fs.Var(outputFlag{&o.json}, "o", "")
		fs.Var(outputFlag{&o.json}, "output", "")
	}
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return helpRequested{cmd: c}
	}
	if err != nil {
		return usagef(c, "%s: %s", c.name, flagError(err))
	}
	return c.run(a, c, o, pos)
}

// outputFlag is -o and --output: -o json is --json; the table is the
// other output, given by neither.
type outputFlag struct{ json *bool }

func (f outputFlag) String() string {
	if f.json != nil && *f.json {
		return "json"
	}
	return ""
}

func (f outputFlag) Set(s string) error {
	if s != "json" {
		return errors.New("want json (-o json is --json; leave both out for the table)")
	}
	*f.json = true
	return nil
}

func (a *app) version() error {
	fmt.Fprintf(a.stdout, "sluice %s %s %s/%s\n", cmdline.Version(version), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}

// conn is an open connection to Redis with sluice's stores over it.
type conn struct {
	url     *redisurl.URL
	prefix  string
	client  redis.UniversalClient
	store   *throttle.PolicyStore
	limiter *throttle.Limiter
}

// policies are the policies that apply to a tenant's jobs (resolve).
type policies = jobpath.Policies[throttle.Policy, throttle.LearnedLimit, throttle.AdaptiveLimit]

// resolve returns the policies that apply to tenant's jobs, as the
// workers decide by them: its own or the default, @global's, its shadow,
// its learned limit.
func (c *conn) resolve(ctx context.Context, tenant string) (*policies, error) {
	return jobpath.Of(c.limiter).(jobpath.Engine[throttle.Request, throttle.Decision, *policies]).Resolve(ctx, tenant)
}

func (c *conn) Close() {
	if c.limiter != nil {
		_ = c.limiter.Close() // and its store
	}
	_ = c.client.Close()
}

// connect opens the Redis of --redis / SLUICE_REDIS_URL and checks that it
// answers. A bad URL or prefix is a usage error; an unreachable server a
// failure with one line naming it.
func (a *app) connect(cmd *command) (*conn, error) {
	raw := redisurl.Value(a.redisFlag, a.env)
	u, err := redisurl.Parse(raw)
	if err != nil {
		source := "--redis"
		if a.redisFlag == "" {
			source = redisurl.EnvVar
		}
		return nil, usagef(cmd, "%s: %v", source, err)
	}
	prefix := a.prefix
	if prefix == "" {
		prefix = throttle.PrefixDefault
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, usagef(cmd, "--prefix %q: must not contain { or }; use the prefix your workers use (default %q)", prefix, throttle.PrefixDefault)
	}
	client := u.NewInteractiveClient()
	if err := u.Ping(a.ctx, client, 0); err != nil {
		_ = client.Close()
		return nil, err
	}
	c := &conn{url: u, prefix: prefix, client: client}
	c.limiter, err = throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		c.Close()
		return nil, err
	}
	c.store = c.limiter.Policies()
	return c, nil
}

// checkPolicyName accepts a tenant, "*", "@global", a shared pool or a
// shadow as a policy's name.
func checkPolicyName(cmd *command, name string) error {
	if err := names.Policy(name); err != nil {
		return usagef(cmd, "%v", err)
	}
	return nil
}

// checkTenant accepts a tenant, "@global" (whose state is shared by all),
// a shared pool ("@openai", shared by the jobs that name it) or a key
// below a tenant ("acme/user-42").
func checkTenant(cmd *command, name string) error {
	if name == throttle.GlobalPolicy || isKeyName(name) {
		return nil
	}
	if t, k, ok := strings.Cut(name, "/"); ok && !strings.HasPrefix(name, "@") {
		if err := names.Tenant(t); err != nil {
			return usagef(cmd, "%v", err)
		}
		if err := names.Key(k); err != nil {
			return usagef(cmd, "%v (a key's state is read as TENANT/KEY; TENANT/* is a policy for every key, see sluice policy get)", err)
		}
	}
	if strings.HasPrefix(name, "@") && !strings.HasPrefix(name, throttle.ShadowPrefix) {
		if err := names.Pool(name); err != nil {
			return usagef(cmd, "%v", err)
		}
		return nil
	}
	if name == throttle.DefaultPolicy {
		return usagef(cmd, "* is the default policy, not a tenant; give a tenant that follows it, or @global")
	}
	if err := names.Tenant(name); err != nil {
		return usagef(cmd, "%v", err)
	}
	return nil
}

// isKeyName reports whether name is a key below a tenant: TENANT/KEY,
// neither of them *.
func isKeyName(name string) bool {
	t, k, ok := strings.Cut(name, "/")
	return ok && names.Tenant(t) == nil && names.Key(k) == nil
}

func wantArgs(cmd *command, args []string, min, max int, what string) error {
	if len(args) < min {
		return usagef(cmd, "%s: missing %s", cmd.name, what)
	}
	if max >= 0 && len(args) > max {
		return usagef(cmd, "%s: unexpected argument %q", cmd.name, args[max])
	}
	return nil
}
