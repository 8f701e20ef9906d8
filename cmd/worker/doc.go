// Command worker runs one member of a sluice worker fleet: an asynq server
// whose every job passes sluice's gate (package worker), with the built-in
// job types "http" and "sleep", admin endpoints and structured logs.
//
// Usage:
//
//	worker [--redis URL] [--queues Q=1,...] [--concurrency N] [FLAGS]
//
//	--redis URL             the Redis of the queues and the limits; default
//	                        $SLUICE_REDIS_URL, else redis://127.0.0.1:6379;
//	                        memory://HOST:PORT starts an embedded Redis there
//	--queues LIST           queues and priorities (default "default=1")
//	--concurrency N         jobs handled at once (default 100)
//	--admin ADDR            /metrics, /healthz, /readyz (default $SLUICE_WORKER_ADMIN,
//	                        else 127.0.0.1:9464; "off")
//	--advertise ADDR        where sluice dashboard reaches them, recorded in the
//	                        fleet's registry (default: --admin's address)
//	--probe healthz|readyz  ask the running worker at --admin; exit 0 on 200
//	--prefix PREFIX         key prefix of sluice's limits (default "sluice")
//	--shutdown-timeout D    how long running jobs may finish after SIGTERM (default 8s)
//	--recover-lease D       heartbeat lease: a worker silent this long is taken
//	                        for dead and its jobs run again (default 15s)
//	--log-format text|json  logs on stderr (default text)
//	--log-level LEVEL       debug, info, warn or error (default info)
//
// A trial on one machine, with nothing else installed:
//
//	$ worker --redis memory://127.0.0.1:6379
//	embedded Redis (miniredis, in memory: its data ends with this process) listening on 127.0.0.1:6379
//	in other terminals: export SLUICE_REDIS_URL=memory://127.0.0.1:6379
//	time=… level=INFO msg="worker started" redis=memory://127.0.0.1:6379 queues="default=1" concurrency=100 …
//
// /readyz answers 200 while Redis answers and the worker takes jobs, 503
// otherwise (starting, draining, Redis unreachable). SIGTERM or SIGINT
// drains the worker: no new jobs, jobs waiting for their slots go back to
// the queue with their reservations, running jobs finish for up to
// --shutdown-timeout (then asynq puts them back), every concurrency slot is
// released, and the worker exits 0. A second signal ends it at once.
//
// Exit status: 0 after a clean shutdown, 1 on failure (Redis unreachable,
// an address taken), 2 on bad usage, with the message and the usage line on
// standard error.
package main
