package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/lua"
)

// Concurrency slots: releasing and renewing them under their claims.
//
// lua/release.lua and lua/renew.lua take a header (the clock, the number of
// ops, whether to leave expiries alone), then per op the
// job's id, its claim and its scopes; each answers one reply per op, so
// concurrent calls share a run.
var (
	releaseMerge = headerMerger{header: 3}
	renewMerge   = headerMerger{header: 3}
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
	_, err := l.release(ctx, tenant, "", id, claim, waitroom.Scopes{})
	return err
}

// release runs release.lua for the slots job id holds (in its tenant's,
// @global's, and sc's key's and pools' scopes); with a queue, the
// tenant's line of it is given: waiting reports that jobs wait there, and
// then the slots of the tenant's slot (its own and its key's) were not
// given back (its caller hands them on).
func (l *Limiter) release(ctx context.Context, tenant, queue, id string, claim uint64, sc waitroom.Scopes) (waiting bool, err error) {
	waiting, _, err = l.releaseIn(ctx, tenant, queue, id, claim, sc, false)
	return waiting, err
}

// releaseIn is release; with yield (a queue given), the slots go back
// even while jobs wait in the line when none of the job's scopes was full
// before (the line's head does not wait for them: a pump promotes it in
// its turn), and given reports that they did. Then on one server its
// tenant is made due in the same run unless a pump holds it or it is due
// within the pumps' hold (room.lua's nudge); on a Cluster the caller
// nudges it.
func (l *Limiter) releaseIn(ctx context.Context, tenant, queue, id string, claim uint64, sc waitroom.Scopes, yield bool) (waiting, given bool, err error) {
	rc, err := l.releaseCalls(ctx, tenant, queue, id, claim, sc, yield)
	if err != nil {
		return false, false, err
	}
	if len(rc.calls) == 1 {
		// alone: it may share a run with other callers' (the batcher)
		c := rc.calls[0]
		c.res, c.err = l.batch.do(c)
	} else {
		l.batch.runAll(rc.calls)
	}
	return rc.read()
}

// releasing is a job's release as release.lua calls (one per group of its
// scopes: one on one server, the tenant's and @global's on a Cluster), to
// run alone or with other jobs' (Room.ReleaseAll).
type releasing struct {
	l                 *Limiter
	tenant, queue, id string
	claim             uint64
	calls             []*call
}

// releaseCalls are the calls of releaseIn.
func (l *Limiter) releaseCalls(ctx context.Context, tenant, queue, id string, claim uint64, sc waitroom.Scopes, yield bool) (*releasing, error) {
	if tenant != "" {
		if err := validateTenant(tenant); err != nil {
			return nil, err
		}
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	// Only scopes whose policy has a concurrency rule hold slots. A slot
	// taken under a policy that has since lost its rule is not stranded: it
	// is no longer renewed, so it frees itself when its lease runs out.
	// The scopes' state hashes and their concurrency limits, in order:
	var tenantKeys, globalKeys []string
	var tenantLimits, globalLimits []any
	if tenant != "" && r.tenant != nil && r.tenant.Concurrency != nil {
		tenantKeys = []string{keysFor(l.cfg.Prefix, tenant).state}
		tenantLimits = []any{r.tenant.Concurrency.Limit}
	}
	if r.global != nil && r.global.Concurrency != nil {
		globalKeys = []string{keysFor(l.cfg.Prefix, GlobalPolicy).state}
		globalLimits = []any{r.global.Concurrency.Limit}
	}
	// the job's key shares the tenant's slot, its pools @global's
	ks, ps, err := l.belowScopes(ctx, tenant, sc)
	if err != nil {
		return nil, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	for _, k := range ks {
		tenantKeys = append(tenantKeys, k.keys.state)
		tenantLimits = append(tenantLimits, k.policy.Concurrency.Limit)
	}
	for _, p := range ps {
		globalKeys = append(globalKeys, p.keys.state)
		globalLimits = append(globalLimits, p.policy.Concurrency.Limit)
	}
	var lines []string
	if queue != "" && tenant != "" {
		// the line's lists, the normal level's first: release.lua asks
		// only whether one holds jobs, and stops at the first that does
		k, q := keysFor(l.cfg.Prefix, tenant), queueOf(queue)
		lines = []string{k.lineAt(q, priorityNormal), k.lineAt(q, priorityHigh), k.lineAt(q, priorityLow)}
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
	yield = yield && lines != nil
	rc := &releasing{l: l, tenant: tenant, queue: queue, id: id, claim: claim}
	for i, keys := range groups {
		args := []any{l.clockArg(), 1, l.noTTLArg(), id, claim, len(keys), 0}
		if lines != nil && i == 0 && tenantKeys != nil {
			// the tenant's group comes first and shares its slot with the line
			n := len(keys)
			keys = append(keys[:n:n], lines...)
			args[6] = len(lines)
			if yield {
				// its scopes' limits, in its keys' order: the tenant's and
				// its key's, then (on one server) @global's and the pools'
				flags := len(lines) + 512
				args = append(args, tenantLimits...)
				if !l.cluster {
					args = append(args, globalLimits...)
				}
				// the pumps' hold: a tenant a pump holds is not marked
				args = append(args, micros(waitroom.HoldDefault))
				if !l.cluster {
					q := queueOf(queue)
					shard := dueShard(tenant)
					flags += 256
					keys = append(keys, dueKey(l.cfg.Prefix, q, shard))
					args = append(args, tenant, wakeChannel(l.cfg.Prefix), q+lineSep+strconv.Itoa(shard))
				}
				args[6] = flags
			}
		}
		rc.calls = append(rc.calls, &call{ctx: ctx, script: lua.Release, keys: keys, payload: args, merge: releaseMerge})
	}
	return rc, nil
}

// read reads the replies of the release's calls: every group was tried (a
// scope that could not be reached keeps its slot until the lease runs
// out, the others are given back now).
func (rc *releasing) read() (waiting, given bool, err error) {
	l := rc.l
	lost := false
	var firstErr error
	for _, c := range rc.calls {
		if c.err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("release tenant %q job %q: %w", rc.tenant, rc.id, c.err))
			continue
		}
		arr, ok := c.res.([]any)
		if !ok || len(arr) != 1 {
			return false, false, fmt.Errorf("release.lua: unexpected reply %v", c.res)
		}
		v, isInt := arr[0].(int64)
		if !isInt || v < 0 {
			return false, false, fmt.Errorf("release.lua: unexpected reply %v", c.res)
		}
		// released + 256 * lost + 65536 * waiting + 2^40 * given
		if v>>40&1 == 1 {
			given = true
			if !l.cluster {
				// this process's releases know at once (others from the wake)
				l.due.lower(queueOf(rc.queue), dueShard(rc.tenant), l.estimatedNow().UnixMicro())
			}
		} else if v>>16 > 0 {
			waiting = true
			continue
		}
		if v>>8&0xff > 0 {
			lost = true
		}
	}
	if firstErr != nil {
		return waiting, given, firstErr
	}
	if lost && rc.claim != 0 {
		return waiting, given, fmt.Errorf("release tenant %q job %q: %w", rc.tenant, rc.id, ErrClaimLost)
	}
	return waiting, given, nil
}

// releaseTurnlessCall is the call that gives back the slots job id holds
// under claim in its tenant's scope and, on one server, @global's, with
// release.lua and no line: for a release that found jobs waiting in the
// tenant's line (so gave back nothing there) when it is another tenant's
// turn (room.releaseAndMark sends it with the tenant's mark). The key's
// and the pools' slots went already (releaseBelow; on a Cluster @global's
// and the pools' went in a call of their own). nil: the job holds no slot
// to give back.
func (l *Limiter) releaseTurnlessCall(ctx context.Context, tenant, id string, claim uint64) (*call, error) {
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	var keys []string
	if r.tenant != nil && r.tenant.Concurrency != nil {
		keys = append(keys, keysFor(l.cfg.Prefix, tenant).state)
	}
	if !l.cluster && r.global != nil && r.global.Concurrency != nil {
		keys = append(keys, keysFor(l.cfg.Prefix, GlobalPolicy).state)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return &call{ctx: ctx, script: lua.Release, keys: keys, payload: []any{l.clockArg(), 1, l.noTTLArg(), id, claim, len(keys), 0}, merge: releaseMerge}, nil
}

// turnlessLost reads that call's reply: whether the claim held no slot.
func turnlessLost(tenant, id string, res any, err error) (bool, error) {
	if err != nil {
		return false, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 1 {
		return false, fmt.Errorf("release.lua: unexpected reply %v", res)
	}
	v, _ := arr[0].(int64)
	return v>>8&0xff > 0, nil
}

// noTTLArg is release.lua's "leave expiries alone" for tests that keep
// keys from expiring.
func (l *Limiter) noTTLArg() int {
	if l.noExpire {
		return 1
	}
	return 0
}

// belowScopes are the scopes of sc (a job's key below tenant, its pools)
// whose policies have a concurrency rule: the key's, and the pools'.
func (l *Limiter) belowScopes(ctx context.Context, tenant string, sc waitroom.Scopes) (key, pools []scope, err error) {
	if sc.Key != "" {
		k, err := l.keyScope(ctx, tenant, sc.Key)
		if err != nil {
			return nil, nil, err
		}
		if k != nil && k.policy.Concurrency != nil {
			key = []scope{*k}
		}
	}
	ps, err := l.poolScopes(ctx, sc.Pools)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range ps {
		if p.policy.Concurrency != nil {
			pools = append(pools, p)
		}
	}
	return key, pools, nil
}

// releaseBelow gives back the concurrency slots job id holds under claim
// in its key's scope and, withPools, its pools' (one call on one server;
// on a Cluster one per slot).
func (l *Limiter) releaseBelow(ctx context.Context, tenant, id string, claim uint64, sc waitroom.Scopes, withPools bool) error {
	ks, ps, err := l.belowScopes(ctx, tenant, sc)
	if err != nil {
		return fmt.Errorf("release job %q: %w", id, err)
	}
	if !withPools {
		ps = nil
	}
	var groups [][]string
	for _, g := range [][]scope{ks, ps} {
		var keys []string
		for _, s := range g {
			keys = append(keys, s.keys.state)
		}
		switch {
		case len(keys) == 0:
		case l.cluster || len(groups) == 0:
			groups = append(groups, keys)
		default:
			groups[0] = append(groups[0], keys...)
		}
	}
	for _, keys := range groups {
		res, err := l.batch.runMerged(ctx, lua.Release, keys, []any{l.clockArg(), 1, l.noTTLArg(), id, claim, len(keys), 0}, releaseMerge)
		if err != nil {
			return fmt.Errorf("release job %q of tenant %q (key %q, pools %v): %w", id, tenant, sc.Key, sc.Pools, err)
		}
		arr, ok := res.([]any)
		if !ok || len(arr) != 1 {
			return fmt.Errorf("release.lua: unexpected reply %v", res)
		}
		if v, _ := arr[0].(int64); v>>8&0xff > 0 && claim != 0 {
			return fmt.Errorf("release job %q of tenant %q (key %q, pools %v): %w", id, tenant, sc.Key, sc.Pools, ErrClaimLost)
		}
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
// holds is left alone.
func (l *Limiter) Renew(ctx context.Context, tenant, id string, claim uint64) error {
	return l.renewAll(ctx, []jobpath.Held{{Tenant: tenant, ID: id, Claim: claim}})[0]
}

// renewAll renews the leases of several running jobs in one round trip (a
// worker renews all its running jobs at once, through jobpath.Of), and
// returns each one's error, in order, as Renew would. Renew is renewAll
// with one job.
func (l *Limiter) renewAll(ctx context.Context, jobs []jobpath.Held) []error {
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
func (l *Limiter) renewCalls(ctx context.Context, h jobpath.Held) ([]*call, error) {
	if h.Tenant != "" {
		if err := validateTenant(h.Tenant); err != nil {
			return nil, err
		}
	}
	_, scopes, err := l.jobScopes(ctx, Request{Tenant: h.Tenant, Key: h.Key, Pools: h.Pools})
	if err != nil {
		return nil, fmt.Errorf("renew tenant %q job %q: %w", h.Tenant, h.ID, err)
	}
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
		// one call per slot: the tenant's (with its key's), and
		// @global's with the pools'
		var tenant, global []scope
		for _, s := range held {
			if inGlobalSlot(s.name) {
				global = append(global, s)
			} else {
				tenant = append(tenant, s)
			}
		}
		groups = nil
		for _, g := range [][]scope{tenant, global} {
			if g != nil {
				groups = append(groups, g)
			}
		}
	}
	var calls []*call
	for _, g := range groups {
		keys := make([]string, len(g))
		args := []any{l.clockArg(), 1, l.noTTLArg(), h.ID, h.Claim, len(g)}
		for i, s := range g {
			keys[i] = s.keys.state
			args = append(args, micros(s.policy.Concurrency.lease()))
		}
		calls = append(calls, &call{script: lua.Renew, keys: keys, payload: args, merge: renewMerge})
	}
	return calls, nil
}
