// Package queue is sluice's producer side: Client enqueues asynq tasks for
// tenants, so that sluice's workers can throttle them per tenant.
//
// Client.Enqueue sets the tenant header (taskspec.TenantHeader) and the job's cost
// (Cost, taskspec.CostHeader) and passes asynq's own options through, and it
// brings the job to the waiting room (throttle's room; docs/architecture.md), with the tenant's
// policy read once from the policy store:
//
//   - A job its tenant may start now, while the fleet has room for it (the
//     asynq servers' concurrency for its queue less the pending list), takes
//     its slot and goes straight to asynq's pending list.
//   - Any other waits in its tenant's line of its queue in Redis, charged
//     nothing, its task parked in asynq's schedule at a fallback time
//     (Config.Fallback, at least an hour); the workers' pumps promote it to
//     the pending list when it may start. A burst of 200,000 jobs so waits
//     in its own line, not in the pending list ahead of other tenants' jobs,
//     and a policy change reaches the jobs still waiting.
//   - backlog=K caps the tenant's line: past K waiting jobs Enqueue returns
//     a *throttle.BacklogError, which matches throttle.ErrBacklogFull, and
//     nothing is enqueued.
//   - A job scheduled for later (asynq.ProcessAt, asynq.ProcessIn), or of an
//     overflow=drop policy, goes to asynq as asked; the workers' gate
//     decides on it when it is due.
//
// asynq's options go to Enqueue, not to asynq.NewTask: options given to
// asynq.NewTask are not carried (asynq keeps them private, and sluice
// reads nothing private of asynq's), so the job gets asynq's defaults.
//
// Bad input (an empty or oversized tenant, a cost below 1, an option asynq
// would refuse or ignore) is an *InvalidError (ErrInvalid), returned before
// anything is written. EnqueueBatch enqueues many jobs and reports each
// one's result.
//
//	client, err := queue.New(rdb, nil)
//	if err != nil { ... }
//	defer client.Close()
//	info, err := client.Enqueue(ctx, "acme", asynq.NewTask("email", payload),
//		asynq.Queue("mail"), queue.Cost(3))
//
// Workers (package worker) read the same headers and run the pumps; start
// them before, or with, the producers: a parked job that no worker
// promotes starts only at its fallback time.
package queue
