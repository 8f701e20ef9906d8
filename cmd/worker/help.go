package main

import (
	"strings"

	"github.com/sluicehq/sluice/internal/redisurl"
)

func helpText() string {
	return `worker runs one member of a sluice worker fleet: it takes asynq jobs from its
queues and runs each one when its tenant's limits, shared by the whole fleet
through Redis, allow it.

Usage:
  ` + usageLine + `

Flags:
  --redis URL              the Redis of the queues and the limits (forms
                           below); default $SLUICE_REDIS_URL, else
                           redis://127.0.0.1:6379. memory://HOST:PORT starts
                           an embedded Redis there, for a trial on one machine
  --queues LIST            the queues to take jobs from, with their priorities:
                           default=1,critical=6 (default "default=1")
  --concurrency N          jobs handled at once, those waiting in the worker for
                           their slot included (default 100)
  --admin ADDR             address of the admin endpoints (default
                           $SLUICE_WORKER_ADMIN, else 127.0.0.1:9464; port 0
                           picks a free one; "off" turns them off)
  --advertise ADDR         the HOST:PORT at which sluice dashboard reaches the
                           admin endpoints, recorded in the fleet's registry
                           (default --admin's; an unspecified host such as
                           0.0.0.0 becomes this machine's first address
                           beyond loopback)
  --probe ENDPOINT         ask the worker running at --admin for healthz or
                           readyz and exit 0 when it answers 200, else 1: a
                           health check for images with no shell
  --prefix PREFIX          the key prefix of sluice's limits (default "sluice")
  --shutdown-timeout D     how long running jobs may take to finish after
                           SIGTERM before they go back to the queue (default 8s)
  --recover-lease D        how long this worker may go without a heartbeat in
                           Redis before the fleet takes it for dead and runs
                           its jobs again elsewhere (default 15s); shorter
                           finds a dead worker sooner, but a worker paused
                           longer than it has its jobs run twice
  --tenant-labels          label the per-job metrics with the tenant, for
                           sluice dashboard's decisions per tenant (one series
                           per tenant: mind the cardinality of many tenants)
  --log-format FORMAT      text or json (default text); logs go to stderr
  --log-level LEVEL        debug, info, warn or error (default info)
  --version                print the version
  -h, --help               print this help

Job types:
  http    payload {"method","url","headers","body","timeout_ms"}: a 2xx answer
          completes the job; 429 or 503 pauses the tenant for the Retry-After
          and retries the job after it, without using a retry; other 5xx
          answers and network errors are retried; other answers are archived.
          Every answer's rate-limit headers (RateLimit, X-RateLimit-*) act for
          the fleet: a used-up quota pauses the tenant until its reset, and a
          declared limit below the policy's is followed until it lapses
          (a policy with learn=false pins its limits)
  sleep   payload {"ms":N}: waits N milliseconds

Admin endpoints:
  /metrics   Prometheus metrics: the gate's (sluice_worker_*), the queues'
             (sluice_queue_*), sluice_build_info, Go's and the process's
  /healthz   200 while the process is alive
  /readyz    200 while Redis answers and the worker takes jobs, else 503

Redis URL forms:
` + indent(redisurl.Forms, "  ") + `

SIGTERM or SIGINT drains the worker: it stops taking jobs, hands the jobs
waiting for their slots back to the queue (their reservations kept), lets
running jobs finish for up to --shutdown-timeout (asynq puts back the ones that
do not), releases every concurrency slot and exits 0. A second signal ends it
at once.

Example, a trial on one machine:
  worker --redis memory://127.0.0.1:6379
  sluice --redis memory://127.0.0.1:6379 policy set acme 'rate=2/s'
  enqueue --redis memory://127.0.0.1:6379 --tenant acme --type sleep \
          --payload '{"ms":100}' --count 10

Exit status: 0 after a clean shutdown, 1 on failure (Redis unreachable, the
admin address taken), 2 on bad usage.
`
}

func indent(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}
