// Package jobpath holds the calls a job's way through the worker's gate and
// the producer makes into the limiter beyond throttle's public API: starting
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
// throttle, cannot name: sluice holds an Engine[throttle.Request,
// throttle.Decision]. An Engine is safe for concurrent use.
type Engine[Request, Decision any] interface {
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

// Of returns the Engine[throttle.Request, throttle.Decision] of a
// *throttle.Limiter. Package throttle, which imports this one, sets it;
// sluice's worker and queue packages reach the calls through it, so that
// they are no part of throttle's public API.
var Of func(limiter any) any
