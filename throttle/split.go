package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/lua"
)

// doSplit admits a job whose tenant and @global live in different Cluster
// slots, where no script can see both. The tenant is decided first, then
// @global no earlier than the tenant's slot. When @global denies, the
// tenant's charge is refunded (and, if @global reserved a slot, the tenant
// takes one no earlier than it), so the effect is all or nothing even though
// the two steps are not one transaction: between them another job may see
// the tenant charged for a moment, which can only make it more cautious.
func (l *Limiter) doSplit(ctx context.Context, id string, cost int64, flags int, scopes []scope, lease time.Duration) (Decision, error) {
	tenant, global := scopes[:1], scopes[1:]
	d1, err := l.admitOnce(ctx, id, cost, flags, tenant, 0)
	if err != nil {
		return Decision{}, err
	}
	if !d1.Allowed && !d1.Reserved {
		return d1, nil
	}
	var notBefore int64
	if !d1.Allowed || flags&flagPlan != 0 {
		notBefore = d1.Slot.UnixMicro()
	}
	d2, err := l.admitOnce(ctx, id, cost, flags, global, notBefore)
	if err != nil {
		l.refundQuietly(ctx, tenant[0], id, cost, d1)
		return Decision{}, err
	}
	d2.Policy = global[0].name
	switch {
	case d1.Allowed && d2.Allowed:
		d1.Remaining = minRemaining(d1.Remaining, d2.Remaining)
		d1.ResetAfter = max(d1.ResetAfter, d2.ResetAfter)
		if d1.InFlight < 0 {
			d1.InFlight = d2.InFlight
		}
		if flags&flagHold != 0 && flags&flagPlan == 0 {
			d1.Lease = lease
		}
		if flags&flagPlan != 0 && d2.Slot.After(d1.Slot) {
			d1.Slot = d2.Slot
		}
		return d1, nil
	case d2.Reserved:
		// @global's slot is later: the tenant's slot moves to it.
		if err := l.refund(ctx, tenant[0], id, cost, d1); err != nil {
			return Decision{}, err
		}
		d3, err := l.admitOnce(ctx, id, cost, flagReserve|flagPlan|(flags&flagNoTTL), tenant, d2.Slot.UnixMicro())
		if err != nil {
			return Decision{}, err
		}
		if !d3.Reserved {
			l.refundQuietly(ctx, global[0], id, cost, d2)
			return d3, nil
		}
		d2.Slot = d3.Slot
		d2.RetryAfter = d3.Slot.Sub(d2.Now)
		return d2, nil
	default:
		l.refundQuietly(ctx, tenant[0], id, cost, d1)
		return d2, nil
	}
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
	var qstart int64
	if p.Quota != nil {
		start, _ := p.Quota.WindowAt(at)
		qstart = start.UnixMicro()
	}
	args := []any{id, at.UnixMicro(), d.charged, cost, qstart, len(p.Rates)}
	for _, r := range p.Rates {
		inc, _, _ := rateArgs(r, cost)
		args = append(args, inc)
	}
	if _, err := l.batch.run(ctx, lua.Refund, s.keys.admitKeys(), args); err != nil {
		return fmt.Errorf("refund %s for job %q: %w", s.name, id, err)
	}
	return nil
}

// refundQuietly refunds on a path that already has an answer; a failed
// refund leaves the scope charged, which is the cautious side.
func (l *Limiter) refundQuietly(ctx context.Context, s scope, id string, cost int64, d Decision) {
	_ = l.refund(ctx, s, id, cost, d)
}
