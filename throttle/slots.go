package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/lua"
)

// Concurrency slots: releasing and renewing them under their claims.
//
// lua/release.lua and lua/renew.lua take a header (the clock, the number of
// ops; release.lua also whether to leave expiries alone), then per op the
// job's id, its claim and its scopes; each answers one reply per op, so
// concurrent calls share a run.
var (
	releaseMerge = headerMerger{header: 3}
	renewMerge   = headerMerger{header: 2}
)

// ErrClaimLost is returned by Release and Renew when a job's concurrency
// slot is no longer held under the claim given: its lease ran out before a
// renewal (another job may have the slot now) or a later admission of the
// same job took the slot over. Nothing held by another claim is changed.
var ErrClaimLost = errors.New("concurrency claim lost")

// Release gives back the concurrency slots (tenant and @global) that job id
// holds under claim (Decision.Claim); claim 0 releases them whichever
// admission holds them. A job that holds none costs nothing, and a second
// Release of the same claim returns ErrClaimLost without changing anything.
// Once a scope's last slot is gone its state expires as soon as the rest
// of it allows, not a lease later.
func (l *Limiter) Release(ctx context.Context, tenant, id string, claim uint64) error {
	_, err := l.release(ctx, tenant, "", id, claim)
	return err
}

// release runs release.lua for the slots job id holds; with a queue, the
// tenant's line of it is given: waiting reports that jobs wait there, and
// then the tenant's slots were not given back (its caller hands them on).
func (l *Limiter) release(ctx context.Context, tenant, queue, id string, claim uint64, pools ...string) (waiting bool, err error) {
	if tenant != "" {
		if err := ValidateTenant(tenant); err != nil {
			return false, err
		}
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return false, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	// Only scopes whose policy has a concurrency rule hold slots. A slot
	// taken under a policy that has since lost its rule is not stranded: it
	// is no longer renewed, so it frees itself when its lease runs out.
	var tenantKeys, globalKeys []string
	if tenant != "" && r.tenant != nil && r.tenant.Concurrency != nil {
		tenantKeys = []string{keysFor(l.cfg.Prefix, tenant).state}
	}
	if r.global != nil && r.global.Concurrency != nil {
		globalKeys = []string{keysFor(l.cfg.Prefix, GlobalPolicy).state}
	}
	// the job's pools share @global's slot
	ps, err := l.poolScopes(ctx, pools)
	if err != nil {
		return false, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	for _, p := range ps {
		if p.policy.Concurrency != nil {
			globalKeys = append(globalKeys, p.keys.state)
		}
	}
	var lines []string
	if queue != "" && tenant != "" {
		lines = keysFor(l.cfg.Prefix, tenant).lines(queueOf(queue))
	}
	var groups [][]string
	if l.cluster {
		if tenantKeys != nil {
			groups = append(groups, tenantKeys)
		}
		if globalKeys != nil {
			groups = append(groups, globalKeys)
		}
	} else if keys := append(tenantKeys, globalKeys...); len(keys) > 0 {
		groups = append(groups, keys)
	}
	lost := false
	var firstErr error
	for i, keys := range groups {
		noTTL := 0
		if l.noExpire {
			noTTL = 1
		}
		args := []any{l.clockArg(), 1, noTTL, id, claim, len(keys), 0}
		if lines != nil && i == 0 && tenantKeys != nil {
			// the tenant's group comes first and shares its slot with the line
			keys = append(keys[:len(keys):len(keys)], lines...)
			args[6] = len(lines)
		}
		// every group is tried: a scope that cannot be reached keeps its
		// slot until the lease runs out, the others are given back now
		res, err := l.batch.runMerged(ctx, lua.Release, keys, args, releaseMerge)
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err))
			continue
		}
		arr, ok := res.([]any)
		if !ok || len(arr) != 1 {
			return false, fmt.Errorf("release.lua: unexpected reply %v", res)
		}
		v, isInt := arr[0].(int64)
		if !isInt || v < 0 {
			return false, fmt.Errorf("release.lua: unexpected reply %v", res)
		}
		// released + 256 * lost + 65536 * waiting
		if v>>16 > 0 {
			waiting = true
			continue
		}
		if v>>8&0xff > 0 {
			lost = true
		}
	}
	if firstErr != nil {
		return waiting, firstErr
	}
	if lost && claim != 0 {
		return waiting, fmt.Errorf("release tenant %q job %q: %w", tenant, id, ErrClaimLost)
	}
	return waiting, nil
}

// releasePools gives back the concurrency slots job id holds under claim
// in the shared pools it names (one call: they share @global's slot).
func (l *Limiter) releasePools(ctx context.Context, id string, claim uint64, pools []string) error {
	ps, err := l.poolScopes(ctx, pools)
	if err != nil {
		return fmt.Errorf("release job %q: %w", id, err)
	}
	var keys []string
	for _, p := range ps {
		if p.policy.Concurrency != nil {
			keys = append(keys, p.keys.state)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	noTTL := 0
	if l.noExpire {
		noTTL = 1
	}
	res, err := l.batch.runMerged(ctx, lua.Release, keys, []any{l.clockArg(), 1, noTTL, id, claim, len(keys), 0}, releaseMerge)
	if err != nil {
		return fmt.Errorf("release job %q in pools %v: %w", id, pools, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 1 {
		return fmt.Errorf("release.lua: unexpected reply %v", res)
	}
	if v, _ := arr[0].(int64); v>>8&0xff > 0 && claim != 0 {
		return fmt.Errorf("release job %q in pools %v: %w", id, pools, ErrClaimLost)
	}
	return nil
}

// releaseLate gives back, in the background, the slot an admission whose
// caller gave up may still take: after a wait, so that the release does not
// overtake the admission on another connection. Its claim fences it: a
// later admission of the same job keeps its own slot.
func (l *Limiter) releaseLate(tenant, id string, claim uint64) {
	l.late.Add(1)
	go func() {
		defer l.late.Done()
		t := time.NewTimer(lateRelease)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.closing:
		}
		ctx, cancel := context.WithTimeout(context.Background(), lateRelease)
		defer cancel()
		_ = l.Release(ctx, tenant, id, claim)
	}()
}

// lateRelease is how long releaseLate waits for an abandoned admission to land.
const lateRelease = 2 * time.Second

// Renew extends the leases of the concurrency slots job id holds under
// claim (Decision.Claim; 0: whichever admission holds them). It returns
// ErrClaimLost when a slot is no longer held under the claim: the lease ran
// out before the renewal, or a later admission of the job took the slot
// over. The job may keep running but no longer counts; a slot another claim
// holds is left alone. Renew is shorthand for RenewAll with one job.
func (l *Limiter) Renew(ctx context.Context, tenant, id string, claim uint64) error {
	return l.RenewAll(ctx, []Held{{Tenant: tenant, ID: id, Claim: claim}})[0]
}

// Held is a running job holding concurrency slots under a claim, in its
// tenant's, @global's and its pools' scopes (Request.Pools).
type Held struct {
	Tenant string
	ID     string
	Claim  uint64
	Pools  []string
}

// RenewAll renews the leases of several running jobs in one round trip (a
// worker renews all its running jobs at once), and returns each one's
// error, in order, as Renew would.
func (l *Limiter) RenewAll(ctx context.Context, jobs []Held) []error {
	errs := make([]error, len(jobs))
	var calls []*call
	owner := []int{} // the job of each call
	for i, h := range jobs {
		cs, err := l.renewCalls(ctx, h)
		if err != nil {
			errs[i] = err
			continue
		}
		for _, c := range cs {
			c.ctx = ctx
			calls = append(calls, c)
			owner = append(owner, i)
		}
	}
	l.batch.runAll(calls)
	lost := make([]bool, len(jobs))
	for k, c := range calls {
		i := owner[k]
		if errs[i] != nil {
			continue
		}
		if c.err != nil {
			errs[i] = fmt.Errorf("renew tenant %q job %q: %w", jobs[i].Tenant, jobs[i].ID, c.err)
			continue
		}
		arr, isArr := c.res.([]any)
		if !isArr || len(arr) != 1 {
			errs[i] = fmt.Errorf("renew.lua: unexpected reply %v", c.res)
			continue
		}
		if v, _ := arr[0].(int64); v != 1 {
			lost[i] = true
		}
	}
	for i := range jobs {
		if errs[i] == nil && lost[i] {
			errs[i] = fmt.Errorf("renew tenant %q job %q: %w", jobs[i].Tenant, jobs[i].ID, ErrClaimLost)
		}
	}
	return errs
}

// renewCalls are the renew.lua calls of one job: one per group of its
// scopes that hold slots and share a slot (one, or on a Cluster one per
// scope); none when no scope holds one.
func (l *Limiter) renewCalls(ctx context.Context, h Held) ([]*call, error) {
	if h.Tenant != "" {
		if err := ValidateTenant(h.Tenant); err != nil {
			return nil, err
		}
	}
	scopes, err := l.scopes(ctx, h.Tenant)
	if err != nil {
		return nil, fmt.Errorf("renew tenant %q job %q: %w", h.Tenant, h.ID, err)
	}
	pools, err := l.poolScopes(ctx, h.Pools)
	if err != nil {
		return nil, fmt.Errorf("renew tenant %q job %q: %w", h.Tenant, h.ID, err)
	}
	scopes = append(scopes, pools...)
	var held []scope
	for _, s := range scopes {
		if s.policy != nil && s.policy.Concurrency != nil {
			held = append(held, s)
		}
	}
	if len(held) == 0 {
		return nil, nil
	}
	groups := [][]scope{held}
	if l.cluster {
		// one call per slot: the tenant's, and @global's with the pools'
		groups = nil
		var global []scope
		for _, s := range held {
			if inGlobalSlot(s.name) {
				global = append(global, s)
			} else {
				groups = append(groups, []scope{s})
			}
		}
		if global != nil {
			groups = append(groups, global)
		}
	}
	var calls []*call
	for _, g := range groups {
		keys := make([]string, len(g))
		args := []any{l.clockArg(), 1, h.ID, h.Claim, len(g)}
		for i, s := range g {
			keys[i] = s.keys.state
			args = append(args, micros(s.policy.Concurrency.lease()))
		}
		calls = append(calls, &call{script: lua.Renew, keys: keys, payload: args, merge: renewMerge})
	}
	return calls, nil
}
