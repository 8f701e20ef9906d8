package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/jobpath"
)

// Decide once: the waiting room decides a job when it may start (a
// straight arrival, a promotion) and the decision travels with the job as
// a ticket. The worker's gate redeems it without asking Redis again: it
// waits for the slot when it is early, and asks anew only when the job
// comes late for its slot or the ticket no longer holds.

// ticket is a decision carried with its job: the slot it starts at (µs,
// Redis time), how long after it the job may still start (µs; -1: any
// time), how long after it its started meters were charged (its slack),
// when its concurrency lease runs out (µs; 0 without one), the claim
// holding that slot (0: none), and the fingerprint of the policies it was
// decided by.
type ticket struct {
	slot, late, slack, leaseEnd int64
	claim                       uint64
	fp                          uint32
}

// ticketVersion starts a ticket's text, so that a later format is told
// apart.
const ticketVersion = "1"

// lateReserved is a ticket's late for a job that holds a reservation for
// its slot and is decided there by the gate (near its limits, or a rule
// kind decided at the start): the ticket only says when.
const lateReserved = -2

func (t ticket) String() string {
	return ticketVersion + ":" + strconv.FormatInt(t.slot, 10) + ":" + strconv.FormatInt(t.late, 10) + ":" +
		strconv.FormatInt(t.slack, 10) + ":" + strconv.FormatInt(t.leaseEnd, 10) + ":" +
		strconv.FormatUint(t.claim, 10) + ":" + strconv.FormatUint(uint64(t.fp), 10)
}

func parseTicket(s string) (ticket, bool) {
	f := strings.Split(s, ":")
	if len(f) != 7 || f[0] != ticketVersion {
		return ticket{}, false
	}
	var v [5]int64
	for i := range v {
		n, err := strconv.ParseInt(f[1+i], 10, 64)
		if err != nil {
			return ticket{}, false
		}
		v[i] = n
	}
	claim, err1 := strconv.ParseUint(f[5], 10, 64)
	fp, err2 := strconv.ParseUint(f[6], 10, 32)
	if err1 != nil || err2 != nil || v[0] <= 0 || v[1] < lateReserved || v[2] < 0 || v[3] < 0 {
		return ticket{}, false
	}
	return ticket{slot: v[0], late: v[1], slack: v[2], leaseEnd: v[3], claim: claim, fp: uint32(fp)}, true
}

// ticketFor is the ticket of a job decided at now (µs) for slot, which it
// may start up to late after (-1: any time), its started meters charged
// slack after it, holding its concurrency slots under claim for lease (0:
// none), by the policies of fingerprint fp.
func ticketFor(slot, late, slack, now int64, lease time.Duration, claim uint64, fp uint32) string {
	t := ticket{slot: slot, late: late, slack: slack, fp: fp}
	if late == lateReserved {
		// a reservation: the gate decides at its slot
		return t.String()
	}
	if lease > 0 && claim != 0 {
		t.leaseEnd, t.claim = now+micros(lease), claim
	}
	return t.String()
}

// fingerprint identifies the policies a job is decided by: a ticket
// decided by others (a policy changed meanwhile) is decided anew.
func (r jobPolicies) fingerprint() uint32 {
	a, b := r.facts, r.globalFacts
	if a == nil {
		a = factsOf(r.Policy)
	}
	if b == nil {
		b = factsOf(r.Global)
	}
	return a.fp*16777619 ^ b.fp
}

// printWith is fp (jobPolicies.fingerprint: the tenant's and @global's
// policies) with the policies of the job's other scopes mixed in, its
// key's and its pools': a ticket decided before one of them changed is
// decided anew too.
func printWith(fp uint32, scopes []scope) uint32 {
	for _, s := range scopes {
		if inGlobalSlot(s.name) && s.name != GlobalPolicy || isKeyScope(s.name) {
			f := s.facts
			if f == nil {
				f = factsOf(s.policy)
			}
			fp = fp*16777619 ^ f.fp
		}
	}
	return fp
}

// isKeyScope reports whether a scope's name is a key policy's
// (TENANT/KEY, TENANT/* or */*).
func isKeyScope(name string) bool {
	_, _, ok := keyOf(name)
	return ok
}

// policyPrint is a policy's fingerprint (its text's FNV-1a; 0 for none).
func policyPrint(p *Policy) uint32 {
	if p == nil {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(p.String()))
	return h.Sum32()
}

// redeem starts a job on the decision the waiting room made for it ahead
// of time, the ticket it carries (queue.Client and the room's hand-over
// put it in the job's headers), without a round trip when the ticket holds:
// the returned decision is Allowed, its Slot the job's start time and Now
// the Redis time as estimated from earlier replies (the caller waits
// Slot - Now when it is early), and its Claim and Lease the concurrency
// slot it holds. ok is false when the job must be decided anew (Do): the
// ticket is unreadable or stale (the job comes later than its slack after
// its slot, as a retried or deferred job does), the policies changed since
// the decision, or the job's concurrency slot is no longer held under its
// claim. A ticket that only carries a reservation (a tenant near its
// limits) says when its slot is (Reserved, Slot, RetryAfter): the caller
// waits for it, then asks. A ticket whose lease has run a third or more is
// renewed first, and a job at its slot whose bounds of Redis time are
// wider than what is left of its window is judged by Redis's TIME: those
// are the round trips redeem may take (besides the TIME its bounds need
// once a second). The worker's gate calls it through jobpath.Of.
func (l *Limiter) redeem(ctx context.Context, req Request, text string) (d Decision, ok bool, err error) {
	t, ok := parseTicket(text)
	if !ok {
		return Decision{}, false, nil
	}
	if t.late == lateReserved {
		// decided at its slot: the caller waits for it, then asks
		now := l.nowFor(ctx, keysFor(l.cfg.Prefix, cmp.Or(req.Tenant, GlobalPolicy)).state, false)
		return Decision{Reserved: true, Slot: time.UnixMicro(t.slot), Now: now,
			RetryAfter: max(time.UnixMicro(t.slot).Sub(now), 0), Remaining: -1, ResetAfter: -1, InFlight: -1}, false, nil
	}
	r, scopes, err := l.jobScopes(ctx, req)
	if err != nil {
		return Decision{}, false, fmt.Errorf("redeem tenant %q: %w", req.Tenant, err)
	}
	res := &r
	// the slot is a time of the server of the job's first scope (its
	// tenant's; on a Cluster that master's clock decided it)
	var key string
	if len(scopes) > 0 {
		key = scopes[0].keys.state
	}
	if err := l.freshClock(ctx, key); err != nil {
		return Decision{}, false, fmt.Errorf("redeem tenant %q: %w", req.Tenant, err)
	}
	// the job waits for its slot by the earliest Redis time can be now, and
	// is late by the latest
	now := l.nowFor(ctx, key, false).UnixMicro()
	if t.fp != printWith(res.fingerprint(), scopes) {
		return Decision{}, false, nil // decided by other policies
	}
	if end := t.slot + t.late; t.late >= 0 && now >= t.slot && l.nowFor(ctx, key, true).UnixMicro() > end {
		// too late for its slot by the latest Redis time can be now (the
		// started meters were charged for a start up to late after it),
		// or the bounds are wider than what is left of its window (a
		// loaded process, whose quickest replies still take a few ms):
		// Redis tells, as it tells any job's admission, by its time. (A
		// job early for its slot waits for it and is asked again then.)
		if now > end {
			return Decision{}, false, nil
		}
		r, err := l.readClock(ctx, key)
		if err != nil {
			return Decision{}, false, fmt.Errorf("redeem tenant %q: %w", req.Tenant, err)
		}
		if r > end {
			return Decision{}, false, nil
		}
		now = max(now, r)
	}
	// the job's concurrency slots: its tenant's, @global's and its pools'
	lease := leaseOf(scopes)
	if lease > 0 && t.claim == 0 {
		return Decision{}, false, nil
	}
	d = Decision{Allowed: true, RetryAfter: -1, Remaining: -1, ResetAfter: -1, InFlight: -1,
		Slot: time.UnixMicro(t.slot), Now: time.UnixMicro(now), planned: t.slot, started: t.slot + t.slack}
	if lease > 0 {
		if t.leaseEnd-now < micros(lease)*2/3 {
			if err := l.renewAll(ctx, []jobpath.Held{{Tenant: req.Tenant, ID: req.ID, Claim: t.claim, Pools: req.Pools, Key: req.Key}})[0]; err != nil {
				if errors.Is(err, ErrClaimLost) {
					return Decision{}, false, nil
				}
				return Decision{}, false, err
			}
		}
		d.Lease, d.Claim = lease, t.claim
	}
	return d, true, nil
}
