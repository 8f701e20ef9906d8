package throttle

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/lua"
)

// Settled costs: a job admitted on an estimated cost (Request.Cost) is
// settled to its actual cost once it ran, by lua/settle.lua, on every
// rate, window and quota meter of every scope it was charged in. Where it
// was charged travels in its Decision (from Do, or the ticket the worker's
// gate started it on); nothing per job is stored in Redis.

// Settle settles the cost of a job that ran: req is the request it was
// admitted on (its Tenant, its Cost: the estimate it was charged, and
// its Policies), d the decision it started on (from Do, or its ticket), and
// actual the cost it turned out to have; 0 refunds the whole estimate (a
// job that failed before it used anything). A cheaper job is refunded, a
// dearer one charged the difference, possibly into debt: the tenant's next
// start waits until the debt is paid off. Windows and quotas are settled
// exactly, as if the actual cost had been charged at the job's start; a
// rate's meter exactly where the job's charge is its last, and otherwise
// on the cautious side (docs/llm.md, "Settled costs").
//
// Settle a job once: a second settlement of the same decision moves the
// meters again. A job whose actual cost is its estimate needs no call, and
// Settle makes none. An error changes nothing (on Redis Cluster the tenant
// and @global are settled in a run each, and the error says which one was
// settled). Safe for concurrent use.
func (l *Limiter) Settle(ctx context.Context, req Request, d Decision, actual int64) error {
	est := req.Cost
	if est == 0 {
		est = 1
	}
	if actual < 0 {
		return fmt.Errorf("settle tenant %q: actual cost %d: must be 0 or more (0 refunds the whole estimate)", req.Tenant, actual)
	}
	if est < 0 {
		return fmt.Errorf("settle tenant %q: estimated cost %d: must be the cost the job was admitted on, at least 1", req.Tenant, est)
	}
	if !d.Allowed {
		return fmt.Errorf("settle tenant %q: the decision did not admit the job, so nothing was charged: settle only a job that started", req.Tenant)
	}
	if actual == est || d.planned == 0 {
		// nothing to move, or nothing was charged (no rules, fail-open)
		return nil
	}
	if req.Tenant != "" {
		if err := validateTenant(req.Tenant); err != nil {
			return err
		}
	}
	// the job's pools were charged with it: they are settled with it
	_, scopes, err := l.jobScopes(ctx, req)
	if err != nil {
		return fmt.Errorf("settle tenant %q: %w", req.Tenant, err)
	}
	for _, s := range scopes {
		if err := settleBound(s, actual); err != nil {
			return fmt.Errorf("settle tenant %q: %w", req.Tenant, err)
		}
	}
	planned := time.UnixMicro(d.planned)
	run := func(scopes []scope) error {
		var keys []string
		args := []any{l.clockArg(), est, actual, d.planned, d.started, l.noTTLFlag(), len(scopes)}
		for _, s := range scopes {
			p := s.policy
			if p == nil {
				p = noPolicy
			}
			keys = append(keys, s.keys.admitKeysFor(p)...)
			// the quota's windows around the planned time: the count of
			// the window that holds it is settled
			args = append(args, encodePolicyArgs(p, planned).args...)
		}
		raw, err := l.batch.run(ctx, lua.Settle, keys, args)
		if err != nil {
			return err
		}
		if _, err := int64s(raw, 3); err != nil {
			return fmt.Errorf("settle.lua: %w", err)
		}
		return nil
	}
	if l.cluster && len(scopes) > 1 {
		// the tenant and @global live in different slots: one run each
		// (a settlement is a sum of moves per meter, so the two need no
		// agreement)
		for i, s := range scopes {
			if err = run([]scope{s}); err != nil {
				if i > 0 {
					err = fmt.Errorf("%w (%s was settled, %s was not)", err, scopes[0].name, s.name)
				}
				break
			}
		}
	} else if len(scopes) > 0 {
		err = run(scopes)
	}
	if err != nil {
		return fmt.Errorf("settle tenant %q: %w", req.Tenant, err)
	}
	return nil
}

// settleBound checks that the scripts compute a settlement of actual
// exactly under s's rules (a rate's increment below 2^53).
func settleBound(s scope, actual int64) error {
	if s.policy == nil {
		return nil
	}
	for i, r := range s.policy.Rates {
		if inc, ok := mulDivCeilExact(micros(r.Period), actual, r.Limit); !ok || inc > 1<<53 || inc > math.MaxInt64/2 {
			return fmt.Errorf("actual cost %d is beyond what %s rate[%d] (%s) can count exactly: report at most %d",
				actual, s.name, i, r, int64(float64(1<<53)/float64(micros(r.Period))*float64(r.Limit)))
		}
	}
	return nil
}
