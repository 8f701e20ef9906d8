package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/redisurl"
)

// commands in the order help lists them.
var commands []*command

func init() {
	commands = []*command{
		{
			name: "policy set", usage: "policy set TENANT 'RULES' [--shadow]",
			summary: "store TENANT's policy (* is the default, @global applies to every job)",
			help: "Stores the policy of TENANT; workers use it within a second. The tenant's\n" +
				"throttle state is kept. An empty RULES ('') is a policy that limits nothing.\n\n" +
				"  --shadow   store the rules as TENANT's shadow policy (stored as\n" +
				"             @shadow:TENANT), beside its enforced one: every job of TENANT\n" +
				"             that starts is decided by it and counted as if it were enforced,\n" +
				"             and nothing is held back; sluice stats TENANT shows what it would\n" +
				"             have denied. A shadow of * is tried on the tenants that follow the\n" +
				"             default policy; @global has none.",
			flags: func(fs *flag.FlagSet, o *opts) { fs.BoolVar(&o.shadow, "shadow", false, "") },
			run:   policySet,
		},
		{
			name: "policy get", usage: "policy get TENANT [--shadow] [--json]",
			summary: "print TENANT's policy",
			help: "Prints the policy stored for TENANT in its text form (with --json as\n" +
				"{\"name\": …, \"policy\": …}), or fails (exit 1) saying which policy the tenant\n" +
				"follows instead. --shadow prints TENANT's shadow policy instead.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.json, "json", false, "")
				fs.BoolVar(&o.shadow, "shadow", false, "")
			},
			run: policyGet,
		},
		{
			name: "policy list", usage: "policy list [--shadow] [--json]",
			summary: "list every policy",
			help: "Lists every stored policy as a table of NAME and POLICY, or with --json as\n[{\"name\": …, \"policy\": …}] (\"error\" instead of \"policy\" for an unreadable one).\n" +
				"Shadow policies are listed as @shadow:TENANT (with --json also \"shadow_of\");\n" +
				"--shadow lists only them.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.json, "json", false, "")
				fs.BoolVar(&o.shadow, "shadow", false, "")
			},
			run: policyList,
		},
		{
			name: "policy delete", usage: "policy delete TENANT [--shadow] | --invalid",
			summary: "remove TENANT's policy (its throttle state is kept)",
			help: "Removes the policy of TENANT; the tenant then follows the default policy *.\n" +
				"Deleting a policy that does not exist succeeds, says so and changes nothing.\n" +
				"--shadow removes TENANT's shadow policy instead (its enforced one stays).\n" +
				"--invalid removes every policy whose name is not a valid tenant (a control\n" +
				"character, say: left by an older version or a writer that bypassed sluice;\n" +
				"policy list marks them).",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.invalid, "invalid", false, "")
				fs.BoolVar(&o.shadow, "shadow", false, "")
			},
			run: policyDelete,
		},
		{
			name: "policy apply", usage: "policy apply -f FILE.yaml [--prune] [--dry-run]",
			summary: "store every policy of a YAML file at once, all or nothing",
			help: "Stores every policy of FILE (- reads standard input) in one transaction: a file\n" +
				"with one bad entry changes nothing and names the entry and its line. --prune\n" +
				"also deletes the policies that FILE does not list; --dry-run only prints what\n" +
				"would change. The file maps each name to its rules, as text or as fields:\n\n" +
				"  \"*\": rate=10/s concurrency=2\n" +
				"  \"@global\": rate=1000/s\n" +
				"  acme:\n" +
				"    rate: [100/s burst 20, 5000/h]\n" +
				"    quota: 10000/day\n" +
				"    tz: America/Los_Angeles\n" +
				"    concurrency: 5\n" +
				"  \"@shadow:acme\": rate=50/s    # acme's shadow policy (see policy set --shadow)",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.file, "f", "", "")
				fs.StringVar(&o.file, "file", "", "")
				fs.BoolVar(&o.prune, "prune", false, "")
				fs.BoolVar(&o.dryRun, "dry-run", false, "")
			},
			run: policyApply,
		},
		{
			name: "stats", usage: "stats [TENANT] [--json]",
			summary: "throttle state of TENANT, or of every tenant with a policy or state",
			help: "Prints a table of the throttle state: starts counted, free rate tokens, window\n" +
				"and quota use, jobs in flight, reserved slots, cooldown and jobs waiting. With\n" +
				"TENANT (or @global) one tenant in detail. --json prints\n" +
				"{\"now\": …, \"tenants\": [{…}]} for scripts; times are RFC 3339, durations in ms.",
			flags: func(fs *flag.FlagSet, o *opts) { fs.BoolVar(&o.json, "json", false, "") },
			run:   stats,
		},
		{
			name: "top", usage: "top [--once] [--interval 1s] [--limit N] [--json]",
			summary: "live view of the busiest tenants (q or Ctrl-C quits)",
			help: "Shows, refreshed every --interval, the busiest tenants: starts per second\n" +
				"against the rate limit, jobs in flight against the concurrency cap, reserved\n" +
				"slots, cooldown and the jobs waiting in each tenant's line. While Redis does\n" +
				"not answer, a STALE line says for how long, above the last figures read.\n" +
				"When standard output is not a terminal, or with --once, it measures over one\n" +
				"interval, prints one table and exits. --json prints a JSON line each interval\n" +
				"until interrupted (with --once, one): {\"time\", \"interval_ms\", \"stale\",\n" +
				"\"error\", \"tenants\": [{\"tenant\", \"starts_per_s\", \"limit\", \"in_flight\",\n" +
				"\"concurrency\", \"reserved\", \"cooldown_ms\", \"waiting\", \"backlog_cap\",\n" +
				"\"policy\", \"shadow\"}]}. A tenant with a shadow policy (policy set --shadow)\n" +
				"shows what it would deny: the share of its starts over the interval.",
			flags: func(fs *flag.FlagSet, o *opts) {
				o.interval = durationFlag(time.Second)
				fs.BoolVar(&o.once, "once", false, "")
				fs.Var(&o.interval, "interval", "")
				fs.IntVar(&o.limit, "limit", 0, "")
				fs.BoolVar(&o.json, "json", false, "")
			},
			run: top,
		},
		{
			name: "dashboard", usage: "dashboard [--listen 127.0.0.1:8080] [--metrics URL]... [--prometheus URL] [--allow-write]",
			summary: "a web page of the tenants, live and over the last minutes, and of asynq's queues",
			help: "Serves a web page: every tenant's starts per second against its rate limit,\n" +
				"jobs in flight against its concurrency cap, waiting and reserved jobs, cooldown\n" +
				"and the gate's decisions by rule; a page per tenant plotting the last\n" +
				"--history; asynq's queues and tasks (asynqmon) under /asynq/. One sampler reads\n" +
				"Redis every --interval for every browser; /api/tenants and /api/tenants/NAME\n" +
				"serve its figures as JSON.\n\n" +
				"  --listen ADDR     where to serve (default 127.0.0.1:8080; port 0 picks one)\n" +
				"  --public          allow an address other than loopback (in a cluster); with\n" +
				"                    --allow-write it needs a credential\n" +
				"  --allow-write     let asynq's pages pause queues and run, archive or delete\n" +
				"                    tasks (read-only by default)\n" +
				"  --auth-file FILE  ask every request (but /healthz) for the credential in\n" +
				"                    FILE, else in $SLUICE_DASHBOARD_AUTH: USER:PASSWORD for\n" +
				"                    HTTP basic auth, or a token (Authorization: Bearer, or\n" +
				"                    basic auth's password)\n" +
				"  --metrics URL     a worker's metrics (http://HOST:9464/metrics, its --admin\n" +
				"                    address), repeated for every worker: the decisions by rule\n" +
				"                    live only there; per tenant when the workers run with\n" +
				"                    --tenant-labels. Without it the dashboard finds the\n" +
				"                    workers in the fleet's registry in Redis (each records\n" +
				"                    its --advertise address) and shows which are up\n" +
				"  --prometheus URL  a Prometheus server scraping the workers: a tenant's\n" +
				"                    history comes from it (workers with --tenant-labels), so\n" +
				"                    it survives the dashboard's restarts and every worker\n" +
				"                    that came and went\n" +
				"  --interval D      how often to sample (default 1s, at least 100ms)\n" +
				"  --history D       how much history each tenant keeps (default 5m)\n" +
				"  --max-tenants N   how many tenants to follow at once (default 500); past it,\n" +
				"                    tenants idle for the whole history make room for others\n\n" +
				"SIGINT or SIGTERM stops it (exit 0).",
			flags: dashboardFlags,
			run:   dashboard,
		},
		{
			name: "admit", usage: "admit TENANT --dry-run [--cost N] [--id JOB] [--json]",
			summary: "would a job of TENANT be admitted now, and if not, why",
			help: "Asks the throttle, without changing anything, whether a job of TENANT costing\n" +
				"N (default 1) would start now; if not, which rule of which policy denies it and\n" +
				"when it would fit. --id asks for a given job, which may hold a reserved slot.\n" +
				"--dry-run is required: the command line never admits a job for real.\n" +
				"Exit status: 0 the job would be admitted now, 3 it would not (the output says\n" +
				"why and when it would fit), 1 the question could not be answered, 2 bad usage.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.dryRun, "dry-run", false, "")
				fs.Int64Var(&o.cost, "cost", 1, "")
				fs.StringVar(&o.id, "id", "", "")
				fs.BoolVar(&o.json, "json", false, "")
			},
			run: admit,
		},
		{
			name: "jobs", usage: "jobs [TENANT] [--state S] [--queue Q] [--limit N] [--json]",
			summary: "jobs by state with their last error (of TENANT, or every tenant)",
			help: "Lists the jobs in asynq's queues (every queue, or --queue Q), with their\n" +
				"tenant, type, retries, when they run next and their last error: the jobs that\n" +
				"fail are here. --state picks active, pending, waiting (in a tenant's line),\n" +
				"scheduled, retry or archived, or several separated by commas (default: all).\n" +
				"At most --limit jobs are listed (default 50; 0 lists all). --json prints\n" +
				"{\"now\": …, \"jobs\": [{\"id\", \"queue\", \"state\", \"tenant\", \"type\", \"retried\",\n" +
				"\"max_retry\", \"last_error\", \"last_failed_at\", \"next_process_at\", \"payload\"}],\n" +
				"\"more\": …}; a waiting job's \"priority\" in its line, which the table shows\n" +
				"after its state when it is not normal: waiting (high). A tenant named explain,\n" +
				"prioritize, run or delete is written after --. A job's id in place of TENANT,\n" +
				"when no tenant of that name has jobs, lists that job.\n\n" +
				"  sluice jobs explain ID [--queue Q]  what holds a job and when it is expected to start\n" +
				"  sluice jobs prioritize ID --priority high|normal|low [--queue Q]\n" +
				"                                      move a waiting job to another priority in its line\n" +
				"  sluice jobs run ID [--queue Q]      run a scheduled, retrying or archived job now\n" +
				"  sluice jobs delete ID [--queue Q]   delete a job that is not running",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.state, "state", "", "")
				fs.StringVar(&o.queue, "queue", "", "")
				fs.IntVar(&o.limit, "limit", jobsLimitDefault, "")
				fs.BoolVar(&o.json, "json", false, "")
			},
			run: jobs,
		},
		{
			name: "jobs explain", usage: "jobs explain ID [--queue Q] [--json]",
			summary: "what holds a job and when it is expected to start",
			help: "Says where job ID (a task id, as sluice jobs lists it) stands. A job waiting\n" +
				"in its tenant's line: how many wait ahead of it, what holds it (a rate rule, a\n" +
				"limit learned from the downstream, the window, the quota, a cooldown, the\n" +
				"concurrency cap, or its turn in the fleet) and when it is expected to start,\n" +
				"from the tenant's meters and the line ahead of it. Any other job: its state\n" +
				"in asynq. --json prints {\"id\", \"queue\", \"tenant\", \"state\", \"ahead\",\n" +
				"\"expected_start\", \"expected_in_ms\", \"held_by\", \"holds\", \"priority\", …}.\n" +
				"A waiting job's priority is its level in the line (high, normal, low; the\n" +
				"text says it when it is not normal). --queue is needed only when the id is in\n" +
				"several queues.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.queue, "queue", "", "")
				fs.BoolVar(&o.json, "json", false, "")
			},
			run: jobsExplain,
		},
		{
			name: "jobs prioritize", usage: "jobs prioritize ID --priority high|normal|low [--queue Q] [--json]",
			summary: "move a waiting job to another priority in its tenant's line",
			help: "Moves job ID (a task id, as sluice jobs lists it), waiting in its tenant's\n" +
				"line, to the end of the line's jobs of priority --priority: the high ones leave\n" +
				"the line first, then the normal ones, then the low ones, each in the order\n" +
				"they came. It orders the tenant's own jobs only: other tenants' jobs are\n" +
				"served as before. It prints how many jobs are ahead of the job now; --json\n" +
				"prints what sluice jobs explain --json prints after the move, with\n" +
				"\"previous_priority\". A job at that priority already stays where it is. A job\n" +
				"that does not wait in its tenant's line (pending, running, scheduled by\n" +
				"asynq, in retry, archived) has no place to move: exit 1, nothing changed.\n" +
				"The job's sluice-priority header keeps the level it was enqueued with; its\n" +
				"place in the line is what counts, and what sluice jobs and jobs explain show.\n" +
				"--queue is needed only when the id is in several queues.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.priority, "priority", "", "")
				fs.StringVar(&o.queue, "queue", "", "")
				fs.BoolVar(&o.json, "json", false, "")
			},
			run: jobsPrioritize,
		},
		{
			name: "jobs run", usage: "jobs run ID [--queue Q]",
			summary: "run a scheduled, retrying or archived job now",
			help: "Moves job ID (a task id, as sluice jobs lists it) to the pending list, from\n" +
				"the scheduled, retry or archived set: a worker takes it next, and it still\n" +
				"passes its tenant's limits. --queue is needed only when the id is in several\n" +
				"queues.",
			flags: func(fs *flag.FlagSet, o *opts) { fs.StringVar(&o.queue, "queue", "", "") },
			run:   jobsRun,
		},
		{
			name: "jobs delete", usage: "jobs delete ID [--queue Q]",
			summary: "delete a job that is not running",
			help: "Deletes job ID (a task id, as sluice jobs lists it) from its queue, whatever\n" +
				"its state but running. A job waiting in its tenant's line leaves its entry\n" +
				"there until it reaches the head, where it is dropped. --queue is needed only\n" +
				"when the id is in several queues.",
			flags: func(fs *flag.FlagSet, o *opts) { fs.StringVar(&o.queue, "queue", "", "") },
			run:   jobsDelete,
		},
		{
			name: "version", usage: "version",
			summary: "print sluice's version",
			run:     func(a *app, _ *command, _ *opts, _ []string) error { return a.version() },
		},
		{
			name: "help", usage: "help [COMMAND]",
			summary: "print this help, or a command's",
			run:     func(*app, *command, *opts, []string) error { return helpRequested{} },
		},
	}
}

// groupCommand stands for a group of subcommands in help and usage errors.
func groupCommand(name string) *command {
	g := group(name)
	return &command{name: name, usage: name + " " + strings.ReplaceAll(subNames(g), ", ", "|") + " ..."}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// group returns the subcommands of a group such as "policy", or nil.
func group(name string) []*command {
	var out []*command
	for _, c := range commands {
		if strings.HasPrefix(c.name, name+" ") {
			out = append(out, c)
		}
	}
	return out
}

func subNames(g []*command) string {
	var names []string
	for _, c := range g {
		names = append(names, c.name[strings.IndexByte(c.name, ' ')+1:])
	}
	return strings.Join(names, ", ")
}

func commandNames() string {
	var names []string
	seen := map[string]bool{}
	for _, c := range commands {
		n, _, _ := strings.Cut(c.name, " ")
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

const flagsHelp = `Flags (before or after the command):
  --redis URL        the Redis the workers use (forms below); default
                     $SLUICE_REDIS_URL, else redis://127.0.0.1:6379
  --prefix PREFIX    the key prefix the workers use (default "sluice")
  --json, -o json    JSON instead of a table (the commands that list --json)

Redis URL forms:
%s
`

// rulesHelp is the policy language in full: every option the parser
// reads and every form of a policy's name (cli_test holds it to
// internal/policylang's lists, which throttle's tests hold to the parser).
const rulesHelp = `Rules (policy set, policy apply), in any combination; a job starts only when
every rule of its tenant's policy (and of @global, its key's and its pools')
allows it, and a job held back is charged nothing:
  rate=N/PERIOD [burst=B]     N starts per PERIOD (s, min, h, day or e.g. 10s);
                              at most B back to back (default 1: evenly spaced)
  window=N/DURATION           never more than N starts in any DURATION
  quota=N/PERIOD [tz=ZONE]    N per calendar hour, day, week or month, in ZONE
  quota=N reset="CRON"        or N per window of a cron spec
  concurrency=M [lease=D]     at most M jobs running at once across the fleet;
                              a dead worker's slots free within D (default 30s)
A job's cost (enqueue --cost, queue.Cost; default 1) counts against rate,
window and quota, and must fit each of them: at most a rate's burst, a
window's N, a quota's N. Under rate=2/s (burst 1) a job of cost 3 is refused
every time; give that rate burst=3 or more, or split the job.

Options:
  overflow=defer|wait|drop    a job denied when a worker starts it: defer it to
  max_wait=D                  its slot (default), wait in the worker up to D
                              (overflow=wait), or drop it (archived, throttled)
  backlog=K                   at most K jobs waiting in each of the tenant's lines
  weight=W                    the tenant's share of a saturated fleet (1-1000)
  fail_open=true              run jobs unthrottled while Redis is unreachable
  learn=false                 show, but do not apply, limits the downstream
                              declares in its answers' headers
  adapt=FLOOR..CEILING/PERIOD the rate of that PERIOD adapts to the downstream:
  adapt_step=N                up N (default CEILING/50) every adapt_every
  adapt_every=D               (default 1s) while answers are good, cut to 3/4
  adapt_latency=D             on 429/503 or on answers slower than D
  shape=true                  retired: accepted, without effect

Policy names (what a policy applies to):
  TENANT          a tenant's jobs: acme
  *               the default: tenants without a policy of their own
  TENANT/KEY      a key below a tenant (enqueue --key): acme/user-42; the
                  tenant's own policy limits the sum of its keys
  TENANT/*        every key of TENANT without a policy of its own
  */*             every key of every tenant without one
  @global         every job, beside its tenant's policy
  @NAME           a shared pool that the jobs naming it draw from
                  (enqueue --pool): @openai
  @shadow:TENANT  TENANT's shadow (policy set --shadow): decided and counted
                  on its jobs' starts, never enforced
  @shadow:*       the default policy's shadow
Example: sluice policy set acme 'rate=100/s burst=20 concurrency=5'
`

func (a *app) printHelp(w io.Writer, c *command) {
	forms := "  " + strings.ReplaceAll(redisurl.Forms, "\n", "\n  ")
	if c != nil {
		if g := group(c.name); g != nil && lookup(c.name) == nil {
			fmt.Fprintf(w, "usage:\n")
			for _, sub := range g {
				fmt.Fprintf(w, "  sluice %s\n      %s\n", sub.usage, sub.summary)
			}
			fmt.Fprintf(w, "\nRun 'sluice help %s SUBCOMMAND' for details.\n\n%s", c.name, rulesHelp)
			fmt.Fprintf(w, "\n"+flagsHelp, forms)
			return
		}
		fmt.Fprintf(w, "usage: sluice %s\n\n%s\n", c.usage, c.summary)
		if c.help != "" {
			fmt.Fprintf(w, "\n%s\n", c.help)
		}
		if strings.HasPrefix(c.name, "policy ") {
			fmt.Fprintf(w, "\nOther policy commands: %s\n", subNames(group("policy")))
		}
		if c.name == "policy set" || c.name == "policy apply" {
			fmt.Fprintf(w, "\n%s", rulesHelp)
		}
		fmt.Fprintf(w, "\n"+flagsHelp, forms)
		return
	}
	fmt.Fprintf(w, "sluice manages and watches the limits that sluice workers share through Redis.\n\n")
	fmt.Fprintf(w, "Usage:\n  %s\n\nCommands:\n", topUsage)
	for _, c := range commands {
		if len(c.usage) <= 30 {
			fmt.Fprintf(w, "  %-30s  %s\n", c.usage, c.summary)
		} else {
			fmt.Fprintf(w, "  %s\n  %-30s  %s\n", c.usage, "", c.summary)
		}
	}
	fmt.Fprintf(w, "\n"+flagsHelp, forms)
	fmt.Fprintf(w, "\n%s", rulesHelp)
	fmt.Fprintf(w, "\nExit status: 0 success, 1 failure (e.g. Redis unreachable, a bad policy file),\n2 bad usage (unknown command or flag, missing or malformed argument), 3 admit\n--dry-run: the job would not be admitted now.\n")
}

// durationFlag is a positive duration flag.
type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return fmt.Errorf("want a positive duration such as 1s or 500ms")
	}
	*d = durationFlag(v)
	return nil
}
