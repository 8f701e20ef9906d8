// Command enqueue adds jobs to sluice's queues, each tagged with its tenant
// (package queue): one job, --count N alike, one per JSON line of --file, or
// on a --cron schedule.
//
// Usage:
//
//	enqueue --tenant T --type TYPE [--payload JSON] [JOB FLAGS] [--count N]
//	enqueue --file F|- [--partial] [--dry-run] [--random-ids] [JOB FLAGS]
//	enqueue --cron SPEC --tenant T --type TYPE [--payload JSON] [JOB FLAGS]
//
//	job flags: --queue Q --cost C --priority high|normal|low --key KEY --pool @NAME --in DUR --id ID --max-retry N
//	other:     --redis URL --prefix PREFIX -q/--quiet --version -h/--help
//
// A line of --file is a JSON object; absent fields take the job flags'
// values:
//
//	{"tenant": "acme", "type": "http", "payload": {"url": "https://…"},
//	 "queue": "default", "cost": 1, "priority": "high", "id": "order-17",
//	 "process_in": "30s", "max_retry": 3}
//
// --priority (or "priority") orders a tenant's own jobs while they wait in
// its line: high ones leave it first, low ones last; other tenants' jobs
// are served as before. It does not change the id derived for a line
// without one: the same job at another priority is the same job.
//
// The payload is any JSON value, given to the handler as it is written.
// Every good line is enqueued (in batches, queue.Client.EnqueueBatch); each
// bad line, and each job refused (a full backlog, a task id already taken),
// is reported on standard error with its line number and the reason. A
// summary goes to standard output:
//
//	$ enqueue --file jobs.jsonl
//	enqueue: line 3: not valid JSON: unexpected end of JSON input at byte 50
//	enqueue: line 7: "cost" is a JSON string; want a whole number
//	enqueued 998 of 1000 jobs from jobs.jsonl in 0.41s (2434/s); 2 failed (reported above)
//
// Progress shows on standard error: a bar with the rate and the time left
// on a terminal, a line every 2 s otherwise, nothing with --quiet. SIGINT or
// SIGTERM stops after the batch in progress and says exactly what was
// enqueued; with --cron it is the normal way to stop.
//
// Exit status: 0 when every job was enqueued or was in the queue already
// (and after --cron is stopped, unless a run failed), 1 when any job was
// not, Redis is unreachable or the run was interrupted, 2 on bad usage.
package main
