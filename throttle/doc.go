// Package throttle decides, fleet-wide and in Redis, whether a tenant's job
// may start now: it is the engine under sluice's queue and worker packages,
// and does not depend on asynq.
//
// A [Policy] holds a tenant's rules, in any combination:
//
//   - [Rate]: a leaky bucket used as a meter (GCRA), N per period with a
//     burst; several may be combined (10/s and 10000/h).
//   - [Window]: an exact sliding window, never more than N starts in any
//     interval of its length.
//   - [Quota]: N per calendar window (a day, an hour, or any cron spec) in a
//     time zone, resetting exactly at the boundary.
//   - [Concurrency]: at most M jobs running at once, each holding a lease
//     that frees itself if its worker dies.
//
// Policies are written as text ("rate=100/s burst=20 concurrency=5", see
// [ParsePolicy]) or YAML ([ParsePolicyFile]) and kept in Redis by a
// [PolicyStore], where every worker sees a change within a second. The
// policy "*" ([DefaultPolicy]) applies to tenants without their own, and
// "@global" ([GlobalPolicy]) to every job on top of its tenant's.
//
// A [Limiter] makes the decisions, each in one round trip (two or three on
// Redis Cluster when @global has rules) and on Redis server time. Every
// rule of the tenant and of @global is checked, and all are charged or none.
// Its verbs:
//
//   - [Limiter.Admit] asks whether a job may start now, and takes a
//     concurrency slot for it if so. A denied job is charged nothing and
//     learns when to come back ([Decision].RetryAfter).
//   - [Limiter.Do] is Admit with options ([Request]): a cost, a reservation
//     (a denied job takes its own future slot, so that many denied jobs
//     come back evenly spaced rather than all at once), a dry run.
//   - [Limiter.Reserve] takes a job's slot, now or later, without starting
//     it: for a producer that schedules the job for its slot. When the job
//     comes, Admit starts it on the reservation without charging it again.
//   - [Limiter.Release] and [Limiter.Renew] give back and keep alive the
//     concurrency slot an admission took, under its claim
//     ([Decision].Claim), which fences off a slot that has passed to
//     another admission ([ErrClaimLost]).
//   - [Limiter.Cooldown] pauses a tenant whose downstream is saturated;
//     [Limiter.Learn] lowers a tenant's rate, fleet-wide, to a limit its
//     downstream declared ([LearnedLimit]; learn=false pins a policy), until
//     it lapses or [Limiter.Forget]; [Limiter.Adapt] takes a worker's
//     report of what the downstream answered to a tenant's adaptive rule
//     ([AdaptRule], rate=50/s adapt=10..200/s), which the fleet follows;
//     [Limiter.Explain] says what holds a job waiting in its line and when
//     it is expected to start;
//     [Limiter.Stats] and [Limiter.Tenants] read the state; [Limiter.Reset]
//     forgets a tenant's state.
//
// The limiter's waiting room (reached by sluice's own packages, not part of
// this API) is what the queue and worker packages share: a job its tenant
// cannot start now waits in the tenant's line in Redis, one per queue,
// charged nothing; a pump promotes a line's head when it may start,
// serving the due tenants in turn by their weight=, and hands it to the
// queue engine; a release hands a freed concurrency slot to the head of
// the line in the same script run. A policy's backlog= caps each line
// ([ErrBacklogFull]).
//
// Every key of one tenant shares one Redis Cluster hash tag; a tenant's
// keys expire by themselves once its state has recovered.
//
// A worker's loop, in short:
//
//	lim, err := throttle.NewLimiter(client, nil)
//	...
//	d, err := lim.Admit(ctx, "acme", job.ID)
//	if err != nil {
//		return err // Redis unreachable: fail closed (or open, per policy)
//	}
//	if !d.Allowed {
//		return reschedule(job, d.RetryAfter) // not a failure
//	}
//	defer lim.Release(ctx, "acme", job.ID, d.Claim)
//	return run(job)
package throttle
