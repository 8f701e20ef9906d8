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
// A [Limiter] makes the decisions, each in one round trip and on Redis
// server time: [Limiter.Admit] checks every rule of the tenant and of
// @global and charges all of them or none, returning a [Decision].
// A denied job can take its own future slot ([Request].Reserve, or
// [Limiter.Reserve] when shaping at enqueue) so that many denied jobs come
// back evenly spaced rather than all at once. [Limiter.Release] and
// [Limiter.Renew] manage concurrency slots, [Limiter.Cooldown] pauses a
// tenant whose downstream is saturated, and [Limiter.Stats] reads a
// tenant's state.
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
//	defer lim.Release(ctx, "acme", job.ID)
//	return run(job)
package throttle
