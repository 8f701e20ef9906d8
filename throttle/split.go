package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/lua"
)

// On Redis Cluster a job's tenant and @global live in different slots, where
// no script sees both, so doSplit decides in steps and reaches the decision
// one script would reach over both scopes (the same Allowed, RetryAfter,
// Rule, Policy, Slot, Remaining, ResetAfter and InFlight, given the same
// state):
//
//   - The tenant is asked first, then @global, each charged for real. When
//     both admit the job, that is all: two round trips.
//   - When @global denies a job its tenant admitted, the tenant's charge is
//     refunded (refund.lua) and @global's answer stands.
//   - When a reservation is taken, both scopes must hold it at the same slot:
//     the later of the two wins and the other scope moves to it (align).
//   - When the tenant denies, @global is asked too, without writing unless
//     the job is to hold a slot in both, and the two answers are weighed the
//     way admit.lua weighs its scopes: a start later than now (rate, window,
//     quota, cooldown or the job's own slot) before a full concurrency rule,
//     before a started meter a few moments ahead; within each, the longer
//     wait; on a tie, the tenant.
//
// The steps are not one transaction: between them another job may see the
// tenant charged for a moment, which can only make that job more cautious.
// A failed refund leaves a scope charged, which is the cautious side too.
//
// Two traces remain when @global denies a job its tenant alone admits,
// because admit.lua does not report the values its tenant step replaced: a
// job that already held its tenant's concurrency slot (a redelivery) keeps
// the lease that step renewed, so the slot is held at most one lease longer;
// and a reservation the job started on is put back at the refund's time, so
// its grace counts from then. cluster_test.go's model carries both.

// The kinds of answer admit.lua gives for one scope, weakest first.
const (
	classAllowed      = iota
	classStartedMeter // the planned meters allow now; a started meter is a few moments ahead
	classConcurrency  // every concurrency slot is taken
	classPlanned      // the earliest start is later than now
)

const tenantStep, globalStep = 0, 1

// split is one admission on a Cluster.
type split struct {
	l      *Limiter
	ctx    context.Context
	id     string
	cost   int64
	flags  int
	scopes [2]scope // the tenant's, then @global's
	now    time.Time
}

func (l *Limiter) doSplit(ctx context.Context, id string, cost int64, flags int, scopes []scope, lease time.Duration) (Decision, error) {
	s := &split{l: l, ctx: ctx, id: id, cost: cost, flags: flags, scopes: [2]scope{scopes[0], scopes[1]}}
	d, err := s.decide()
	if err != nil {
		return Decision{}, err
	}
	d.charged = 0
	if d.Allowed && flags&flagHold != 0 && flags&flagPlan == 0 {
		d.Lease = lease
	}
	return d, nil
}

// admit runs admit.lua for one scope.
func (s *split) admit(i, flags int, notBefore time.Time) (Decision, error) {
	var nb int64
	if !notBefore.IsZero() {
		nb = notBefore.UnixMicro()
	}
	d, err := s.l.admitOnce(s.ctx, s.id, s.cost, flags, s.scopes[i:i+1], nb)
	if err != nil {
		return Decision{}, fmt.Errorf("%s: %w", s.scopes[i].name, err)
	}
	return d, nil
}

func (s *split) decide() (Decision, error) {
	d1, err := s.admit(tenantStep, s.flags, time.Time{})
	if err != nil {
		return Decision{}, err
	}
	s.now = d1.Now
	if d1.Allowed {
		return s.tenantAllowed(d1)
	}
	c1, err := s.classify(tenantStep, d1)
	if err != nil {
		return Decision{}, err
	}
	if c1 == classPlanned {
		return s.tenantLater(d1)
	}
	return s.tenantNotNow(d1, c1)
}

// tenantAllowed: @global decides a job its tenant admits.
func (s *split) tenantAllowed(d1 Decision) (Decision, error) {
	d2, err := s.admit(globalStep, s.flags, time.Time{})
	if err != nil {
		s.refundQuietly(tenantStep, d1)
		return Decision{}, err
	}
	if d2.Allowed {
		return s.answer(d1, d1, d2), nil
	}
	if err := s.refund(tenantStep, d1); err != nil {
		s.refundQuietly(globalStep, d2)
		return Decision{}, err
	}
	if d2.Reserved {
		return s.align(globalStep, d2, d2)
	}
	ft, err := s.figures(tenantStep, d1)
	if err != nil {
		return Decision{}, err
	}
	return s.answer(d2, ft, d2), nil
}

// tenantLater: the tenant's earliest start is later than now, so @global is
// asked no earlier than that.
func (s *split) tenantLater(d1 Decision) (Decision, error) {
	at := d1.Now.Add(d1.RetryAfter)
	flags := s.flags
	if d1.Reserved {
		at = d1.Slot
	} else {
		// the tenant's slot is out of reach (or none was asked for): so is
		// the job's
		flags &^= flagReserve
	}
	d2, err := s.admit(globalStep, flags, at)
	if err != nil {
		s.refundQuietly(tenantStep, d1)
		return Decision{}, err
	}
	if d2.Reserved {
		if !d2.Slot.After(d1.Slot) {
			return s.answer(d1, d1, d2), nil
		}
		// @global's slot is later: the tenant moves to it
		if err := s.refund(tenantStep, d1); err != nil {
			s.refundQuietly(globalStep, d2)
			return Decision{}, err
		}
		return s.align(globalStep, d2, d2)
	}
	ft := d1
	if d1.Reserved {
		// @global cannot hold a slot that late: neither holds one
		if err := s.refund(tenantStep, d1); err != nil {
			return Decision{}, err
		}
		if ft, err = s.figures(tenantStep, d1); err != nil {
			return Decision{}, err
		}
	}
	lead := d1
	if d2.Rule != "" {
		lead = d2 // @global pushed the start later still
	}
	lead.RetryAfter, lead.Reserved, lead.Slot = d2.RetryAfter, false, time.Time{}
	return s.answer(lead, ft, d2), nil
}

// tenantNotNow: the tenant's planned meters allow now, but its concurrency
// rule or a started meter does not. @global is asked without writing: its
// own later start, or its full concurrency rule, may weigh more.
func (s *split) tenantNotNow(d1 Decision, c1 int) (Decision, error) {
	g, err := s.admit(globalStep, s.flags|flagDry|flagReserve, time.Time{})
	if err == nil {
		var c2 int
		if c2, err = s.classify(globalStep, g); err == nil {
			return s.weigh(d1, c1, g, c2)
		}
	}
	s.refundQuietly(tenantStep, d1)
	return Decision{}, err
}

func (s *split) weigh(d1 Decision, c1 int, g Decision, c2 int) (Decision, error) {
	if s.flags&flagReserve == 0 {
		g.Reserved, g.Slot = false, time.Time{} // the probe asked for the slot, the job did not
	}
	switch {
	case c2 == classPlanned, c2 == classConcurrency && (c1 == classStartedMeter || g.RetryAfter > d1.RetryAfter):
		// @global's answer weighs more; the tenant's place in line at now,
		// if it took one, is given back
		if err := s.refund(tenantStep, d1); err != nil {
			return Decision{}, err
		}
		if c2 == classPlanned && s.flags&flagReserve != 0 {
			d2, err := s.admit(globalStep, s.flags, time.Time{})
			if err != nil {
				return Decision{}, err
			}
			if d2.Reserved {
				return s.align(globalStep, d2, d2)
			}
			if d2.Allowed {
				// @global freed up meanwhile: the job waits for its tenant
				if err := s.refund(globalStep, d2); err != nil {
					return Decision{}, err
				}
				d2 = d1
				d2.Reserved, d2.Slot = false, time.Time{}
			}
			g = d2
		}
		ft, err := s.figures(tenantStep, d1)
		if err != nil {
			return Decision{}, err
		}
		return s.answer(g, ft, g), nil
	}
	lead := d1
	if c1 == classStartedMeter && c2 == classStartedMeter && g.RetryAfter > d1.RetryAfter {
		lead = g
	}
	if !d1.Reserved {
		return s.answer(lead, d1, g), nil
	}
	// the tenant keeps its place in line at now, and so does @global
	d2, err := s.admit(globalStep, flagReserve|flagPlan|(s.flags&flagNoTTL), time.Time{})
	if err != nil {
		s.refundQuietly(tenantStep, d1)
		return Decision{}, err
	}
	// A slot due now at @global is the tenant's slot: @global's clock read
	// a moment after the tenant's, which is no later start.
	if d2.Reserved && !d2.Allowed && d2.Slot.After(d1.Slot) {
		// @global's start moved later meanwhile
		if err := s.refund(tenantStep, d1); err != nil {
			s.refundQuietly(globalStep, d2)
			return Decision{}, err
		}
		return s.align(globalStep, d2, d2)
	}
	lead.Reserved, lead.Slot = true, d1.Slot
	return s.answer(lead, d1, d2), nil
}

// align makes both scopes hold the job's reservation at one slot. Scope i
// holds it at held.Slot; the other scope takes one no earlier, and whenever
// its slot is later (its quota window is full, say) the roles swap. ans
// gives the rule and policy of the answer until another scope pushes the
// slot.
func (s *split) align(i int, held, ans Decision) (Decision, error) {
	flags := flagReserve | flagPlan | (s.flags & (flagDry | flagNoTTL))
	for round := 0; ; round++ {
		j := 1 - i
		dj, err := s.admit(j, flags, held.Slot)
		if err != nil {
			s.refundQuietly(i, held)
			return Decision{}, err
		}
		if dj.Reserved && !dj.Slot.After(held.Slot) {
			d := ans
			d.Reserved, d.Slot = true, held.Slot
			if held.Slot.After(s.now) {
				d.RetryAfter = held.Slot.Sub(s.now)
			}
			if d.Allowed && s.flags&flagPlan == 0 {
				// a slot taken without starting (ans planned it) is not a
				// start: the job comes back for it and is charged then
				d.Allowed, d.RetryAfter = false, max(d.RetryAfter, 0)
			}
			f := [2]Decision{}
			f[i], f[j] = held, dj
			return s.answer(d, f[tenantStep], f[globalStep]), nil
		}
		if err := s.refund(i, held); err != nil {
			s.refundQuietly(j, dj)
			return Decision{}, err
		}
		if !dj.Reserved || round == 3 {
			// no slot both can hold (past a quota window or the horizon,
			// or still moving after several rounds): none is held
			if dj.Reserved {
				if err := s.refund(j, dj); err != nil {
					return Decision{}, err
				}
			}
			fi, err := s.figures(i, held)
			if err != nil {
				return Decision{}, err
			}
			fj, err := s.figures(j, dj)
			if err != nil {
				return Decision{}, err
			}
			d := ans
			if dj.Rule != "" {
				d = dj
			}
			d.Reserved, d.Slot = false, time.Time{}
			d.RetryAfter = min(dj.Now.Add(dj.RetryAfter).Sub(s.now), s.l.cfg.Horizon)
			if dj.Reserved {
				d.RetryAfter = min(dj.Slot.Sub(s.now), s.l.cfg.Horizon)
			}
			f := [2]Decision{}
			f[i], f[j] = fi, fj
			return s.answer(d, f[tenantStep], f[globalStep]), nil
		}
		if dj.Rule != "" {
			ans = dj
		}
		i, held = j, dj
	}
}

// classify tells which kind of answer a scope's denial is. A rate or window
// rule may deny for either of two reasons; a dry run that only plans tells
// them apart.
func (s *split) classify(i int, d Decision) (int, error) {
	switch {
	case d.Allowed:
		return classAllowed, nil
	case d.Rule == "concurrency":
		return classConcurrency, nil
	case d.Reserved:
		if d.Slot.After(d.Now) {
			return classPlanned, nil
		}
		return classStartedMeter, nil
	case d.Rule == "cooldown" || d.Rule == "quota" || d.Rule == "reserved":
		return classPlanned, nil
	}
	p, err := s.admit(i, flagPlan|flagDry|(s.flags&flagNoTTL), time.Time{})
	if err != nil {
		return 0, err
	}
	if p.Allowed {
		return classStartedMeter, nil
	}
	return classPlanned, nil
}

// answer is lead's verdict with the figures of what is left from both
// scopes, as one script over both would report them.
func (s *split) answer(lead, tenant, global Decision) Decision {
	d := lead
	d.Now = s.now
	d.Remaining = minRemaining(tenant.Remaining, global.Remaining)
	d.ResetAfter = max(tenant.ResetAfter, global.ResetAfter)
	d.InFlight = tenant.InFlight
	if d.InFlight < 0 {
		d.InFlight = global.InFlight
	}
	if d.Allowed {
		d.RetryAfter, d.Rule, d.Policy = -1, "", ""
	}
	if !d.Allowed && d.Rule == "" {
		d.Policy = ""
	}
	return d
}

// figures is a scope's decision after d was refunded: d itself when d
// charged nothing, else a dry run's.
func (s *split) figures(i int, d Decision) (Decision, error) {
	if d.charged == 0 {
		return d, nil
	}
	return s.admit(i, flagDry|(s.flags&flagNoTTL), time.Time{})
}

// refund undoes scope i's charge, even when the caller has given up
// waiting: a charge left behind would hold back later jobs.
func (s *split) refund(i int, d Decision) error {
	return s.l.refund(context.WithoutCancel(s.ctx), s.scopes[i], s.id, s.cost, d)
}

// refundQuietly refunds on a path that already has an answer (an error).
func (s *split) refundQuietly(i int, d Decision) {
	_ = s.refund(i, d)
}

func minRemaining(a, b int64) int64 {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	}
	return min(a, b)
}

// refund undoes what admitOnce charged the job in one scope.
func (l *Limiter) refund(ctx context.Context, s scope, id string, cost int64, d Decision) error {
	if d.charged == 0 {
		return nil
	}
	at := d.Now
	if !d.Allowed && d.Reserved {
		at = d.Slot
	}
	p := s.policy
	if p == nil {
		p = &Policy{}
	}
	what := d.charged
	if d.Allowed && d.charged&2 != 0 {
		if len(p.Rates) > 0 || p.Window != nil || p.Quota != nil || p.Concurrency != nil {
			what |= 8 // admit.lua counted the start
		}
		if d.charged&1 == 0 {
			what |= 16 // it started on its reservation, which admit.lua deleted
		}
	}
	var qstart int64
	if p.Quota != nil {
		start, _ := p.Quota.WindowAt(at)
		qstart = start.UnixMicro()
	}
	args := []any{id, at.UnixMicro(), what, cost, qstart, len(p.Rates)}
	for _, r := range p.Rates {
		inc, _, _ := rateArgs(r, cost)
		args = append(args, inc)
	}
	args = append(args, micros(l.cfg.Grace))
	if _, err := l.batch.run(ctx, lua.Refund, s.keys.admitKeys(), args); err != nil {
		return fmt.Errorf("refund %s for job %q: %w", s.name, id, err)
	}
	return nil
}
