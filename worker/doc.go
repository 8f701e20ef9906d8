// Package worker runs asynq jobs behind sluice's throttle: every job passes
// a gate that admits it only when its tenant's policy and @global allow it,
// fleet-wide, and every server runs a pump of the waiting room, which hands
// jobs waiting in their tenants' lines to asynq when they may start.
//
// Server wraps asynq.Server with the gate, the pump, sluice's asynq
// settings and metrics:
//
//	srv, err := worker.New(rdb, &worker.Config{Asynq: asynq.Config{Queues: map[string]int{"default": 1}}})
//	if err != nil { ... }
//	srv.HandleFunc("email", sendEmail)
//	worker.RegisterBuiltins(srv, nil, 0) // "http" and "sleep"
//	err = srv.Run(ctx)           // until ctx ends or SIGTERM
//
// An application that already runs asynq adopts sluice with a Gate: its
// Middleware goes first on the ServeMux, and Configure sets the asynq.Config
// hooks it needs, wrapping the application's own (see the examples), and
// starts the pump for the configured queues.
//
// The waiting room (throttle's room; docs/architecture.md): producers using queue.Client park the
// jobs their tenants cannot start now in the tenants' lines in Redis,
// charged nothing, instead of asynq's pending list. The pump (started by
// Server.Start and Gate.Configure, ended by Gate.Stop and Server.Shutdown)
// promotes a line's head when its slot is due or a concurrency slot is
// free, serving the due tenants in turn while the fleet has room (the
// asynq servers' concurrency less the pending list), and moves its task to
// asynq's pending list. A job that ends hands its concurrency slot to the
// head of its tenant's line in the same script run, and the worker gives
// that job to asynq at once. Jobs enqueued with asynq's own client, or
// scheduled for later, skip the room; the gate decides on every job either
// way.
//
// What the gate does with a job:
//   - The tenant comes from the task header taskspec.TenantHeader (set by
//     queue.Client) or a TenantFunc; a job without one follows @global only
//     (a missing header is logged and counted, a TenantFunc returning "" is
//     not); a tenant that cannot be used is logged and counted, and the job
//     runs under @global only. The cost comes from taskspec.CostHeader; the job's
//     identity, which holds its reservation and concurrency slot, is its
//     task id (or taskspec.IDHeader on a copy, below).
//   - Admitted: the handler runs; a concurrency lease is renewed every
//     Lease/3 and released when the handler returns, fails or panics,
//     handed on to the next job of the tenant's line when one waits (not
//     while the worker shuts down). A job from the waiting room arrives
//     holding its slot and concurrency slot, and is admitted on them.
//   - Denied: the job keeps its own future slot (a reservation). When the
//     slot is near (GateConfig.InProcessWait) the job waits for it
//     in-process; otherwise, per the policy's overflow: defer (the default)
//     returns a *DeferError, which the hooks make asynq reschedule shortly
//     before the slot without counting a failure or using a retry; wait
//     holds the job up to max_wait, then defers it; drop archives it with a
//     *DropError, whose message starts with "throttled".
//   - asynq archives a task at its retry limit whatever IsFailure says, so a
//     deferred job at its limit (MaxRetry(0) included) is carried on by an
//     identical copy, enqueued under a task id derived from the job's
//     identity (a second enqueue conflicts instead of duplicating it), and
//     the original is revoked.
//   - A handler that learns the downstream is saturated returns
//     RetryAfter(d, err): the tenant pauses for d and the job is deferred.
//   - A handler gives sluice its downstream's answers with Observe(ctx,
//     resp) (the built-in http handler does it for every answer): their
//     rate-limit headers (ParseSignal: Retry-After, the IETF RateLimit
//     fields, X-RateLimit-*, OpenAI, Anthropic and Shopify forms) pause the
//     tenant when its quota is used up, and a declared limit below its
//     policy is learned by the whole fleet (throttle.Limiter.Learn) until
//     it lapses; learn=false in a policy pins it.
//   - Redis unreachable: the job is deferred with capped, jittered
//     exponential backoff (fail closed), unless its policy, as last cached,
//     says fail_open=true. A stored policy that cannot be read (garbage in
//     Redis) defers the job with backoff until the policy is replaced.
//
// A worker that dies: every Server registers its process in Redis with a
// lease (Config.RecoverLease, 15 s by default, renewed every lease/3) and
// records the asynq tasks it runs; one process of the fleet at a time
// gives the tasks of a process whose lease ran out back to asynq's pending
// list at once, and tasks asynq left active with nobody running them (a
// Redis restart) once their asynq lease has gone 10 s unextended. They run
// again without a retry counted, on their own concurrency slots. asynq's
// own recoverer (1–2 minutes, a retry counted) remains the fallback, and
// the only one for a Gate used without Server.
//
// The waiting room writes asynq v0.26's keys: before it runs, the worker
// and the producer check asynq's version (build info) and layout (a
// probe); on one sluice does not know the room is off (one ERROR log line,
// sluice_worker_errors_total{kind="asynq_layout"}) and the gate alone
// throttles every job.
//
// A handler learns how its job was admitted (tenant, cost, the limiter's
// decision, how long it waited) from AdmissionFrom(ctx).
//
// Deferred jobs come back on asynq's whole-second schedule, some early and
// some late; the gate holds early ones until their slots, and the limiter's
// started-jobs meter spaces late ones, so starts stay within the policy.
//
// Metrics (Prometheus, GateConfig.Registerer; docs/metrics.md describes
// each, and every labelled series starts at zero): sluice_build_info,
// sluice_worker_decisions_total,
// sluice_worker_deferrals_total, sluice_worker_drops_total,
// sluice_worker_wait_seconds, sluice_worker_in_flight,
// sluice_worker_lease_renewals_total, sluice_worker_errors_total,
// sluice_worker_handler_outcomes_total, and, counted by a Server,
// sluice_worker_unknown_types_total, sluice_worker_recovered_total and
// sluice_worker_taken_for_dead_total; the waiting room's
// sluice_room_promoted_total, sluice_room_skipped_total, sluice_room_waiting
// and sluice_room_oldest_wait_seconds; the downstream signals'
// sluice_downstream_signals_total, sluice_downstream_actions_total,
// sluice_downstream_learned_tenants and, with tenant labels,
// sluice_downstream_learned_limit.
package worker
