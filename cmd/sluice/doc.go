// Command sluice manages and watches the limits that sluice workers share
// through Redis: it sets the policies of tenants, shows their throttle
// state and the jobs waiting in their lines, tells whether a job would be
// admitted now and why not, and lists, runs or deletes jobs.
//
// Usage:
//
//	sluice [--redis URL] [--prefix PREFIX] COMMAND [ARGS]
//
//	policy set TENANT 'RULES' [--shadow]
//	                                   store TENANT's policy (* is the default, @global applies to every job);
//	                                   --shadow: its shadow policy, counted and not enforced
//	policy get TENANT [--shadow]       print TENANT's policy
//	policy list [--shadow] [--json]    list every policy
//	policy delete TENANT [--shadow]    remove TENANT's policy (its throttle state is kept)
//	policy apply -f FILE.yaml [--prune] [--dry-run]
//	                                   store every policy of a YAML file at once, all or nothing
//	stats [TENANT] [--json]            throttle state of TENANT, or of every tenant with a policy or state
//	top [--once] [--interval 1s] [--limit N]
//	                                   live view of the busiest tenants (q or Ctrl-C quits)
//	dashboard [--listen 127.0.0.1:8080] [--metrics URL]... [--prometheus URL] [--allow-write]
//	                                   a web page of the tenants, live and over the last minutes, and of asynq's queues
//	admit TENANT --dry-run [--cost N] [--id JOB] [--json]
//	                                   would a job of TENANT be admitted now, and if not, why
//	jobs [TENANT] [--state S] [--queue Q] [--limit N] [--json]
//	                                   jobs by state (active, pending, waiting in a tenant's line,
//	                                   scheduled, retry, archived) with their last error
//	jobs explain ID [--queue Q] [--json]
//	                                   what holds a job and when it is expected to start
//	jobs prioritize ID --priority high|normal|low [--queue Q] [--json]
//	                                   move a waiting job to another priority in its tenant's line
//	jobs run ID | jobs delete ID [--queue Q]
//	                                   run a scheduled, retrying, archived or waiting job now; delete one
//	version                            print sluice's version
//	help [COMMAND]                     print the help, or a command's
//
// --redis (default $SLUICE_REDIS_URL, else redis://127.0.0.1:6379) takes
// redis://, rediss:// (TLS), redis+sentinel://HOST:PORT,.../MASTER,
// redis+cluster://HOST:PORT,... and memory://HOST:PORT (a worker's embedded
// Redis); see internal/redisurl. --prefix must match the workers' key
// prefix (default "sluice"). Both flags may come before or after the
// command; "--" ends the flags, for a tenant whose name starts with "-".
//
// A session:
//
//	$ sluice policy set acme 'rate=100/s burst=20 concurrency=5'
//	set policy acme: rate=100/s burst=20 concurrency=5
//	$ sluice policy apply -f policies.yaml --prune
//	created    @global  rate=1000/s
//	unchanged  acme     rate=100/s burst=20 concurrency=5
//	deleted    old
//	applied policies.yaml: 1 created, 0 updated, 1 unchanged, 1 deleted
//	$ sluice admit acme --dry-run
//	a job of acme would NOT be admitted now
//	  denied by    concurrency of policy acme (at most 5 running at once)
//	  retry after  1s
//	  ...
//	$ sluice stats --json | jq '.tenants[] | {tenant, started}'
//
// Output meant for scripts: `policy get` prints the policy text alone;
// `policy list --json`, `stats --json` and `admit --json` print JSON whose
// fields are stable (times in RFC 3339, durations in milliseconds, null for
// what does not apply). `top` redraws a terminal screen every interval; when
// standard output is not a terminal, or with --once, it measures over one
// interval, prints one table and exits.
//
// `dashboard` serves a web page on loopback (127.0.0.1:8080): the tenants
// and the shared pools live, a page per tenant with its last minutes
// plotted, and asynq's own queues and tasks (asynqmon) under /asynq/. It
// is read-only unless --allow-write, and serves another address only with
// --public (and, writable, only with a credential: --auth-file or
// SLUICE_DASHBOARD_AUTH). One goroutine samples Redis every second for
// every browser and keeps a few minutes of history per tenant, or draws it
// from Prometheus (--prometheus URL); the gate's decisions by rule come
// from the workers' /metrics, found in the fleet's registry in Redis or
// given with --metrics URL, repeated.
//
// Exit status: 0 on success, 1 on failure (Redis unreachable, a bad policy
// file, no such policy for `policy get`), 2 on bad usage (unknown command or
// flag, missing or malformed argument, bad --redis URL or policy text), with
// the message and the command's usage line on standard error. Nothing is
// changed in Redis when the exit status is not 0.
package main
