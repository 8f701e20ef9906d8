package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// An admission: its scopes, the checks made once, and the run of
// lua/admit.lua (wire.go lays out its arguments and reads its reply).

// scope is one set of keys and the policy that governs them.
type scope struct {
	name   string // policy name reported in decisions
	keys   scopeKeys
	policy *Policy
	facts  *policyFacts
}

func (l *Limiter) scopes(ctx context.Context, tenant string) ([]scope, error) {
	r, err := l.policies.policiesFor(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return l.scopesOf(tenant, r), nil
}

// scopesOf are the scopes a job of tenant is decided in under r.
func (l *Limiter) scopesOf(tenant string, r jobPolicies) []scope {
	var out []scope
	if tenant != "" {
		if r.facts == nil {
			r.facts = factsOf(r.Policy)
		}
		out = append(out, scope{name: r.Name, keys: keysFor(l.cfg.Prefix, tenant), policy: r.Policy, facts: r.facts})
	}
	if r.Global.HasRules() {
		if r.globalFacts == nil {
			r.globalFacts = factsOf(r.Global)
		}
		out = append(out, scope{name: GlobalPolicy, keys: keysFor(l.cfg.Prefix, GlobalPolicy), policy: r.Global, facts: r.globalFacts})
	}
	return out
}

// jobScopes are the policies and every scope a job of req is decided in
// (its tenant's, @global's, its pools'), from req.policies or the cache.
func (l *Limiter) jobScopes(ctx context.Context, req Request) (jobPolicies, []scope, error) {
	var res jobPolicies
	if req.policies != nil {
		res = *req.policies
	} else {
		r, err := l.policies.policiesFor(ctx, req.Tenant)
		if err != nil {
			return jobPolicies{}, nil, err
		}
		res = r
	}
	pools, err := l.poolScopes(ctx, req.Pools)
	if err != nil {
		return jobPolicies{}, nil, err
	}
	scopes := l.scopesOf(req.Tenant, res)
	if req.Key != "" {
		ks, err := l.keyScope(ctx, req.Tenant, req.Key)
		if err != nil {
			return jobPolicies{}, nil, err
		}
		if ks != nil {
			// the key's scope shares the tenant's slot: it goes right
			// after the tenant's, before @global's (split.go)
			scopes = slices.Insert(scopes, 1, *ks)
		}
	}
	return res, append(scopes, pools...), nil
}

// keyScope is the scope of tenant's key (Request.Key) when its policy
// (TENANT/KEY, TENANT/* or */*) has rules; nil when none applies.
func (l *Limiter) keyScope(ctx context.Context, tenant, key string) (*scope, error) {
	if tenant == "" {
		return nil, fmt.Errorf("%w: key %q: a key is below a tenant; give the job's tenant too", ErrInvalidTenant, key)
	}
	if err := validateKey(key); err != nil {
		return nil, err
	}
	name, c, err := l.policies.keyPolicy(ctx, tenant, key)
	if err != nil || !c.policy.HasRules() {
		return nil, err
	}
	// named for the policy that applies, as a tenant's scope is (its own
	// or "*"), keyed by the key
	return &scope{name: name, keys: keysFor(l.cfg.Prefix, keyPolicyName(tenant, key)), policy: c.policy, facts: c.facts}, nil
}

// requestScopes is jobScopes, and a *CostError when cost is more than a
// rule of one of the scopes can ever admit.
func (l *Limiter) requestScopes(ctx context.Context, req Request, cost int64) (jobPolicies, []scope, error) {
	res, scopes, err := l.jobScopes(ctx, req)
	if err != nil {
		return jobPolicies{}, nil, err
	}
	for _, s := range scopes {
		if f := s.facts; f.maxCost >= 0 && cost > f.maxCost {
			return jobPolicies{}, nil, &CostError{Tenant: req.Tenant, Cost: cost, Max: f.maxCost, Rule: s.name + " " + f.maxCostRule}
		}
	}
	return res, scopes, nil
}

// checkCost reports whether a job of req could ever be admitted for its
// cost: a *CostError when req.Cost is more than a rule of its tenant's,
// @global's or one of its pools' policies can ever admit (a burst, a window
// or a quota smaller than the cost), nil otherwise. It reads the policy
// cache and decides nothing; queue.Client calls it (through jobpath.Of)
// for the jobs it sends to asynq without deciding on them, so that a
// producer hears of such a job at once rather than a worker deferring it
// until a policy changes.
func (l *Limiter) checkCost(ctx context.Context, req Request) error {
	if req.Tenant != "" {
		if err := validateTenant(req.Tenant); err != nil {
			return err
		}
	}
	cost := max(req.Cost, 1)
	_, _, err := l.requestScopes(ctx, req, cost)
	var ce *CostError
	if err != nil && !errors.As(err, &ce) {
		return fmt.Errorf("check the cost of a job of tenant %q: %w", req.Tenant, err)
	}
	return err
}

// poolScopes are the scopes of the shared pools a job names (Request.Pools)
// whose policies have rules, in the order named, each once; a pool without
// a policy limits nothing.
func (l *Limiter) poolScopes(ctx context.Context, pools []string) ([]scope, error) {
	var out []scope
	for i, name := range pools {
		if err := validatePool(name); err != nil {
			return nil, err
		}
		if slices.Contains(pools[:i], name) {
			continue
		}
		c, err := l.policies.pool(ctx, name)
		if err != nil {
			return nil, err
		}
		if c.policy.HasRules() {
			out = append(out, scope{name: name, keys: keysFor(l.cfg.Prefix, name), policy: c.policy, facts: c.facts})
		}
	}
	return out, nil
}

func (l *Limiter) do(ctx context.Context, req Request, flags int) (Decision, error) {
	if req.Tenant != "" {
		if err := validateTenant(req.Tenant); err != nil {
			return Decision{}, err
		}
	}
	cost := req.Cost
	if cost == 0 {
		cost = 1
	}
	if cost < 0 {
		return Decision{}, fmt.Errorf("admit tenant %q: cost %d: must be at least 1", req.Tenant, cost)
	}
	if req.DryRun {
		flags |= flagDry
	}
	if l.noExpire {
		flags |= flagNoTTL
	}
	if l.general {
		flags |= flagGeneral
	}
	res, scopes, err := l.requestScopes(ctx, req, cost)
	if err != nil {
		var ce *CostError
		if errors.As(err, &ce) {
			return Decision{}, err
		}
		return Decision{}, fmt.Errorf("admit tenant %q: %w", req.Tenant, err)
	}
	lease := time.Duration(0)
	for _, s := range scopes {
		if s.facts.lease > 0 {
			lease = max(lease, s.facts.lease)
			if req.ID == "" && flags&flagHold != 0 && flags&flagPlan == 0 {
				return Decision{}, fmt.Errorf("admit tenant %q: the policy %q has a concurrency rule, which needs the job's id to hold a slot", req.Tenant, s.name)
			}
		}
	}
	if req.ID == "" && flags&flagReserve != 0 {
		return Decision{}, fmt.Errorf("admit tenant %q: a reservation needs the job's id", req.Tenant)
	}
	if len(scopes) == 0 {
		now := time.Now()
		if l.clock != nil {
			now = l.clock()
		}
		return Decision{Allowed: true, RetryAfter: -1, Remaining: -1, ResetAfter: -1, InFlight: -1, Now: now}, nil
	}
	holds := lease > 0 && flags&flagHold != 0 && flags&flagPlan == 0 && flags&flagDry == 0
	op := &admitOp{id: req.ID, cost: cost, flags: flags}
	if t, ok := parseTicket(req.Ticket); ok && t.late >= 0 && flags&flagDry == 0 {
		op.flags |= flagTicket
		op.ticketSlot, op.ticketSlack = t.slot, t.slack
	}
	if req.Wait > 0 && flags&(flagDry|flagPlan) == 0 && !l.needsSplit(scopes) {
		op.flags |= flagWait
		op.wait = micros(req.Wait)
		if op.flags&flagTicket != 0 {
			// decided once and came late: decided anew as its line would
			// decide it, at the next slot its meters give (admit.lua)
			op.flags |= flagOnce
		}
	}
	if holds {
		op.claim = newClaim()
	}
	for _, s := range scopes {
		op.scopes = append(op.scopes, opScope{scope: s})
	}
	var d Decision
	if l.needsSplit(scopes) {
		d, err = l.doSplit(ctx, op)
	} else {
		var r *admitReply
		if r, err = l.run(ctx, op, -1); err == nil {
			d = r.decision(op.scopes)
		}
	}
	if err != nil {
		if holds && ctx.Err() != nil {
			// The caller stopped waiting; the admission may still land. Its
			// slot is given back once it had time to, under its own claim,
			// so a later admission of the same job keeps its slot.
			l.releaseLate(req.Tenant, req.ID, op.claim)
		}
		return Decision{}, fmt.Errorf("admit tenant %q: %w", req.Tenant, err)
	}
	if d.Allowed && holds {
		d.Lease, d.Claim = lease, op.claim
	}
	if op.flags&flagWait != 0 && d.Allowed && !d.Slot.IsZero() {
		// allowed at its slot, a little ahead (Wait): the caller redeems
		// the decision as a ticket there, up to d.late after it (its
		// started meters were charged the tolerance after the slot, or
		// counted it further)
		d.Reserved = false
		d.Ticket = ticketFor(d.Slot.UnixMicro(), d.late, micros(l.startedTolerance(scopes)), d.Now.UnixMicro(), d.Lease, d.Claim, printWith(res.fingerprint(), scopes))
	}
	return d, nil
}

// startedTolerance is how early a start may be on the started meters of
// the scopes' rates (admit.lua's tolerance: Config.Tolerance, at most a
// quarter of a rate's interval).
func (l *Limiter) startedTolerance(scopes []scope) time.Duration {
	tol := l.cfg.Tolerance
	for _, s := range scopes {
		if s.policy == nil {
			continue
		}
		for _, r := range s.policy.Rates {
			tol = min(tol, r.Interval()/4)
		}
	}
	return tol
}

// newClaim returns a fresh claim token: random, non-zero and exact in the
// scripts' numbers (below 2^52).
func newClaim() uint64 {
	return rand.Uint64()>>12 | 1
}

// run runs admit.lua for op in one round trip (shared with concurrent
// calls), at clock (µs; -1 for Redis time), retrying once with fresh quota
// windows when the local estimate of Redis time was off.
func (l *Limiter) run(ctx context.Context, op *admitOp, clock int64) (*admitReply, error) {
	raw, err := l.runRaw(ctx, op, clock)
	if err != nil {
		return nil, err
	}
	return decodeAdmit(raw)
}

// runRaw runs op, answering admit.lua's raw reply for it: {op's reply, now}.
func (l *Limiter) runRaw(ctx context.Context, op *admitOp, clock int64) (any, error) {
	if clock < 0 {
		clock = l.clockArg()
	}
	// the server the op runs on: its first local scope's (on a Cluster
	// the op's local scopes share a slot)
	key := op.localKey()
	for attempt := 0; ; attempt++ {
		now := l.nowFor(ctx, key, false)
		if clock >= 0 {
			now = time.UnixMicro(clock)
		}
		keys, aa := l.encode(op, clock, now)
		sent := time.Now()
		res, err := l.batch.runMerged(ctx, lua.Admit, keys, aa, admitMerge)
		if err != nil {
			if attempt == 0 && clock < 0 && isClockError(err) {
				if err := l.syncClock(ctx, key); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		}
		l.observedReply(ctx, key, res, sent)
		return res, nil
	}
}

// runRawAll runs ops together (runRaw), in one round trip whoever else is
// calling: on one server in one admit.lua run. An op whose server's clock
// the limiter no longer matches runs again on its own.
func (l *Limiter) runRawAll(ctx context.Context, ops []*admitOp) ([]any, []error) {
	raws := make([]any, len(ops))
	errs := make([]error, len(ops))
	if len(ops) == 0 {
		return raws, errs
	}
	clock := l.clockArg()
	calls := make([]*call, len(ops))
	for i, op := range ops {
		now := l.nowFor(ctx, op.localKey(), false)
		if clock >= 0 {
			now = time.UnixMicro(clock)
		}
		keys, aa := l.encode(op, clock, now)
		calls[i] = &call{ctx: ctx, script: lua.Admit, keys: keys, payload: aa, merge: admitMerge}
	}
	sent := time.Now()
	l.batch.runAll(calls)
	for i, c := range calls {
		if c.err != nil {
			if clock < 0 && isClockError(c.err) {
				raws[i], errs[i] = l.runRaw(ctx, ops[i], -1)
				continue
			}
			errs[i] = c.err
			continue
		}
		raws[i] = c.res
		l.observedReply(ctx, ops[i].localKey(), c.res, sent)
	}
	return raws, errs
}

// observedReply bounds the Redis time of key's server by an admit.lua
// reply ({op's reply, now}) to a call sent at sent (observed).
func (l *Limiter) observedReply(ctx context.Context, key string, res any, sent time.Time) {
	if arr, ok := res.([]any); ok && len(arr) == 2 && l.clock == nil {
		if now, ok := arr[1].(int64); ok {
			l.observed(ctx, key, now, sent)
		}
	}
}

// localKey is the state hash of op's first local scope ("": none).
func (op *admitOp) localKey() string {
	for _, s := range op.scopes {
		if s.snapshot == nil {
			return s.keys.state
		}
	}
	return ""
}

// noTTLFlag is flagNoTTL for tests that keep keys from expiring.
func (l *Limiter) noTTLFlag() int {
	if l.noExpire {
		return flagNoTTL
	}
	return 0
}

// errClockPrefix starts the script error for a time outside the quota
// windows sent (see admit.lua's header).
const errClockPrefix = "ERR sluice: clock"

func isClockError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), errClockPrefix)
}
