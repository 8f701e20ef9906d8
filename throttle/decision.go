package throttle

import (
	"errors"
	"fmt"
	"time"
)

// Decision is the outcome of one admission.
type Decision struct {
	// Allowed reports that the job may start now. For Reserve it reports
	// that the job's slot is due now.
	Allowed bool
	// RetryAfter is how long until the job would be admitted; -1 when it is
	// allowed. For a job holding a reservation it is the time until its slot.
	RetryAfter time.Duration
	// Rule names the rule that denied the job: "rate[0]" (the index of the
	// rate in its policy), "window", "quota", "concurrency", "cooldown", or
	// "reserved" for a job whose own reserved slot is not due yet. Empty when
	// allowed.
	Rule string
	// Policy is the name of the policy the deciding rule belongs to: the
	// tenant's own, "*" or "@global". Empty when allowed.
	Policy string
	// Remaining is how many more jobs of cost 1 the tightest rule allows
	// right now; -1 when no rule limits the job.
	Remaining int64
	// ResetAfter is how long until every rule is back to full capacity if
	// nothing else starts; -1 when no rule limits the job.
	ResetAfter time.Duration
	// InFlight is how many jobs hold the tenant's concurrency slots after
	// this decision; -1 without a concurrency rule.
	InFlight int64
	// Reserved reports that the job holds a reservation for Slot: when it
	// comes back at Slot it is admitted without being charged again.
	Reserved bool
	// Slot is the job's reserved start time; zero without a reservation.
	// An allowed job with a Slot (Request.Wait) starts at Slot.
	Slot time.Time
	// Lease is the concurrency lease the job now holds; renew it every
	// Lease/3 while the job runs. Zero when no slot is held.
	Lease time.Duration
	// Claim identifies this admission's hold on its concurrency slots: give
	// it to Renew and Release, which change nothing once another admission
	// of the job has taken the slots over. Zero when no slot is held.
	Claim uint64
	// Now is the Redis server time the decision was made at.
	Now time.Time
	// Ticket, for a job allowed at a Slot ahead (Request.Wait), is the
	// decision to start it on once the Slot comes (sluice's worker gate
	// starts a job on its ticket without deciding again): it no longer
	// holds when the job comes later than the rate's tolerance, or, where
	// the started meters run ahead of the Slot (a tenant kept at its rate
	// with a burst), later than they have counted the start already (at
	// most 25 ms).
	Ticket string

	// planned and started are where an allowed job was charged (µs, Redis
	// time): its planned meters and quota at planned, its started meters
	// at started; Settle settles there. 0 when nothing was charged.
	planned, started int64
	// late, for a job allowed at a Slot ahead, is how long after it the
	// job may still start on the decision, besides the rate's tolerance
	// (µs): its started meters count it as started that late.
	late int64
}

// String summarises the decision for logs.
func (d Decision) String() string {
	if d.Allowed {
		return fmt.Sprintf("allowed (remaining %d)", d.Remaining)
	}
	s := fmt.Sprintf("denied by %s %s, retry after %s", d.Policy, d.Rule, d.RetryAfter)
	if d.Reserved {
		s += fmt.Sprintf(", slot reserved at %s", d.Slot.Format(time.RFC3339Nano))
	}
	return s
}

// ThrottledError is the error form of a denial, for code that passes
// denials up as errors. Match it with errors.As.
type ThrottledError struct {
	Tenant     string
	Rule       string
	Policy     string
	RetryAfter time.Duration
	Reserved   bool
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("tenant %q throttled by %s %s: retry after %s", e.Tenant, e.Policy, e.Rule, e.RetryAfter)
}

// Err returns the decision as a *ThrottledError, or nil when it is allowed.
func (d Decision) Err(tenant string) error {
	if d.Allowed {
		return nil
	}
	return &ThrottledError{Tenant: tenant, Rule: d.Rule, Policy: d.Policy, RetryAfter: d.RetryAfter, Reserved: d.Reserved}
}

// ErrBacklogFull is returned when a tenant already has as many jobs waiting
// in its line as its policy's backlog allows. The producer decides what to
// do: retry later, shed the work, or tell its own caller.
var ErrBacklogFull = errors.New("backlog full")

// BacklogError carries the tenant, how many of its jobs wait (Backlog) and
// its cap (Limit); it matches ErrBacklogFull.
type BacklogError struct {
	Tenant  string
	Backlog int64
	Limit   int64
}

func (e *BacklogError) Error() string {
	return fmt.Sprintf("tenant %q: backlog full (%d waiting, cap %d): retry later or raise backlog= in its policy", e.Tenant, e.Backlog, e.Limit)
}

// Is makes errors.Is(err, ErrBacklogFull) match.
func (e *BacklogError) Is(target error) bool { return target == ErrBacklogFull }
