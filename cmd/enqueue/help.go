package main

import (
	"strings"

	"github.com/sluicehq/sluice/internal/redisurl"
)

func helpText() string {
	return `enqueue adds jobs to sluice's queues, each tagged with the tenant whose
limits it counts against; sluice workers run them when the limits allow.

Usage:
  enqueue --tenant T --type TYPE [--payload JSON] [JOB FLAGS] [--count N]
  enqueue --file F|- [--partial] [--dry-run] [JOB FLAGS]
  enqueue --cron SPEC --tenant T --type TYPE [--payload JSON] [JOB FLAGS]

Job flags (with --file, defaults for the lines that leave them out):
  --tenant T         the tenant: the customer, account or user the job is for
  --type TYPE        the job's type, which picks its handler (http, sleep, ...)
  --payload JSON     the job's payload: any JSON value, passed to the handler
                     as it is written (not with --file)
  --queue Q          the queue (default "default")
  --cost C           how much the job weighs on its tenant's rate, window and
                     quota rules (default 1); it must fit each of them: under
                     rate=2/s (burst 1) a job of cost 3 is refused every time
                     (give the rate burst=3 or more)
  --priority P       high, normal (the default) or low: the job's place among
                     its tenant's jobs while they wait (high leave first);
                     other tenants' jobs are served as before
  --key KEY          the job's key below its tenant (a user, a project):
                     its policy (sluice policy set TENANT/KEY RULES, else
                     TENANT/* or */*) limits it with its tenant's
  --pool @NAME       a shared pool the job draws from (repeat for several):
                     the pool's policy (sluice policy set @NAME RULES) limits
                     it with its tenant's, across every tenant that names it
  --in DUR           run the job no sooner than DUR from now, e.g. 30s or 5m
  --id ID            the task id; a second job with the same id in the queue is
                     refused (one job only; random when not given)
  --max-retry N      retries after handler errors (asynq's default is 25);
                     throttling never uses one

Modes:
  --count N          enqueue N jobs alike (default 1)
  --file F           enqueue one job per JSON line of F (- reads stdin):
                       {"tenant": "acme", "type": "http", "payload": {...},
                        "queue": "default", "cost": 1, "priority": "high",
                        "key": "user-42", "pools": ["@api"], "id": "order-17",
                        "process_in": "30s", "max_retry": 3}
                     the whole file is checked first: when a line is bad,
                     every bad line is reported with its number and nothing
                     is enqueued. A line without "id" gets one derived from
                     what it enqueues (and how many identical lines come
                     before it), so running a file again does not enqueue
                     its jobs twice while they are in the queue: they are
                     counted as "in the queue already"
  --partial          with --file: enqueue every good line and report the bad
                     ones (a file read as it comes, from a pipe, for one)
  --random-ids       with --file: lines without "id" get a random one, so
                     every run enqueues every line again
  --dry-run          check the job or the file and show what would be
                     enqueued (each line's task id); nothing is, and Redis
                     is not needed
  --cron SPEC        enqueue the job (or --count of them) each time SPEC fires,
                     until SIGINT or SIGTERM: "*/5 * * * *" (5 fields), six
                     fields with seconds first, "@every 30s", "@hourly";
                     "CRON_TZ=Europe/Paris 0 9 * * *" picks a time zone

Other flags:
  --redis URL        the Redis of the workers (forms below); default
                     $SLUICE_REDIS_URL, else redis://127.0.0.1:6379
  --prefix PREFIX    the key prefix the workers use (default "sluice")
  -q, --quiet        no progress display (errors and the summary are printed)
  --version          print the version
  -h, --help         print this help

Redis URL forms:
` + indent(redisurl.Forms, "  ") + `

Output: one job prints its task id on stdout; --count and --file print a
summary there, report each job that was not enqueued on stderr (with its line
number), and show progress on stderr: a bar with the rate and the time left on
a terminal, a line every 2s otherwise. A tenant whose backlog is full
(backlog= in its policy) refuses jobs; each is reported, and the jobs
enqueued stay (run the file again for the rest). SIGINT or SIGTERM stops
after the batch in progress and says exactly how many jobs were enqueued.

Examples:
  enqueue --tenant acme --type sleep --payload '{"ms":200}' --count 100
  enqueue --tenant acme --type http --in 5m \
          --payload '{"method":"POST","url":"https://api.example.com/sync"}'
  enqueue --file jobs.jsonl --queue imports
  enqueue --tenant acme --type report --priority high
  enqueue --cron '@every 10s' --tenant acme --type sleep --payload '{"ms":50}'

Exit status: 0 when every job was enqueued (or was in the queue already), 1
when any was not (a bad line, a full backlog, Redis unreachable, an
interrupt), 2 on bad usage.
`
}

func indent(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}
