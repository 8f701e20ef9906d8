// Package jobpath holds the calls a job's way through the worker's gate and
// the producer makes into the limiter beyond throttle's public API:
// resolving a job's policies once and deciding by them everywhere, starting
// a job on the decision the waiting room made for it (its ticket), renewing
// the leases of a worker's running jobs together, checking the cost of a job
// sent on without a decision, and recording a start for its tenant's shadow
// policy. Package throttle implements them (Engine, reached through Of);
// sluice's worker and queue packages call them. Applications never use this
// package: they admit jobs with throttle's verbs, or run them with queue and
// worker, which make these calls.
package jobpath

import (
	"context"
	"time"
)

// Engine is what the gate and the producer call. Request and Decision are
// throttle.Request and throttle.Decision, which this package, imported by
// throttle, cannot name, and Policies is *Policies[throttle.Policy,
// throttle.LearnedLimit, throttle.AdaptiveLimit]. An Engine is safe for
// concurrent use.
type Engine[Request, Decision, Policies any] interface {
	// Resolve returns the policies that apply to tenant's jobs ("" for
	// jobs that follow @global only), from the limiter's cache or with one
	// round trip: a job's are resolved once, on its way in, and everything
	// it meets follows them.
	Resolve(ctx context.Context, tenant string) (Policies, error)
	// With returns req to be decided by p, as Resolve returned them for
	// req's tenant, instead of the policies the limiter would resolve.
	With(req Request, p Policies) Request
	// Redeem starts a job on the decision the waiting room made for it
	// ahead of time, the ticket it carries (taskspec.DecidedHeader),
	// without a round trip when the ticket holds. ok is false when the job
	// must be decided anew (throttle.Limiter.Do); a ticket that only
	// carries a reservation says when its slot is. throttle's ticket.go
	// says when a ticket holds.
	Redeem(ctx context.Context, req Request, ticket string) (d Decision, ok bool, err error)
	// RenewAll renews the leases of several running jobs in one round trip
	// (a worker renews all its running jobs at once), and returns each
	// one's error, in order, as throttle.Limiter.Renew would.
	RenewAll(ctx context.Context, jobs []Held) []error
	// CheckCost reports whether a job of req could ever be admitted for its
	// cost: a *throttle.CostError when req's cost is more than a rule of
	// its tenant's, @global's or one of its pools' policies can ever admit,
	// nil otherwise. It decides nothing.
	CheckCost(ctx context.Context, req Request) error
	// Shadow records that job req of its tenant started at at (Redis time;
	// zero: now) for the tenant's shadow policy, which decides in the
	// background whether it would have let the job start then and counts
	// the verdict; counted, when not nil, is then called with it. Call the
	// returned end when the job ends.
	Shadow(req Request, at time.Time, counted func(Decision, error)) (end func())
}

// Policies are the policies that apply to a tenant's jobs, as
// Engine.Resolve returns them. Policy is throttle.Policy, Learned
// throttle.LearnedLimit and Adaptive throttle.AdaptiveLimit. They are
// shared: read them, never change them.
type Policies[Policy, Learned, Adaptive any] struct {
	// Policy is the tenant's own policy, or the default "*"; nil when
	// neither exists (or for jobs without a tenant).
	Policy *Policy
	// Name is the name Policy is stored under: the tenant or "*".
	Name string
	// Global is the @global policy; nil when there is none.
	Global *Policy
	// Learned is the limit learned from the tenant's downstream, nil when
	// none is in place; Policy includes it as its last rate rule when it
	// is applied (Learned.Rule).
	Learned *Learned
	// Shadow is the policy tried on the tenant's jobs without being
	// enforced (the worker's gate records its starts), nil when none is;
	// ShadowName is the name it is stored under: throttle.ShadowPrefix and
	// the tenant, or "*".
	Shadow     *Policy
	ShadowName string
	// Adaptive is the state of the policy's adaptive rule, nil when it has
	// none; Policy holds the rule at its current limit.
	Adaptive *Adaptive
	// Pace is the steady time between two starts that Policy and Global
	// impose on a long line of jobs of cost 1, the longer of the two: 0
	// when neither spaces starts out. The producer reads it to tell how
	// long a tenant's line may take to drain.
	Pace time.Duration
	// Own is the limiter's own form of them, which With reads.
	Own any
}

// Held is a running job holding concurrency slots under a claim, in its
// tenant's, @global's, its key's (throttle.Request.Key) and its pools'
// scopes (throttle.Request.Pools).
type Held struct {
	Tenant string
	ID     string
	Claim  uint64
	Pools  []string
	Key    string
}

// Of returns the Engine of a *throttle.Limiter. Package throttle, which imports this one, sets it;
// sluice's worker and queue packages reach the calls through it, so that
// they are no part of throttle's public API.
var Of func(limiter any) any
