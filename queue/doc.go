// Package queue is sluice's producer side: Client enqueues asynq tasks for
// tenants, so that sluice's workers can throttle them per tenant.
//
// Client.Enqueue sets the tenant header (taskspec.TenantHeader) and the job's cost
// (Cost, taskspec.CostHeader) and passes asynq's own options through. What else
// happens depends on the tenant's policy, read from the policy store:
//
//   - backlog=K: the job is counted in the tenant's backlog (queued and
//     deferred jobs) and Enqueue returns a *throttle.BacklogError, which
//     matches throttle.ErrBacklogFull, once K jobs are waiting; the worker
//     takes a job out when it finishes for good.
//   - shape=true: the job's slot is taken at enqueue time
//     (throttle.Limiter.Reserve) and the task is scheduled for it with
//     asynq.ProcessAt (see taskspec.ScheduleFor), so that a burst of 200,000 jobs
//     waits in asynq's schedule instead of in the pending list ahead of
//     other tenants' jobs.
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
// Workers (package worker) read the same headers.
package queue
