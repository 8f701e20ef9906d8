package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// Defaults of Config.
const (
	HorizonDefault          = time.Hour
	GraceDefault            = time.Minute
	ToleranceDefault        = 2 * time.Millisecond
	ConcurrencyRetryDefault = 200 * time.Millisecond
	MaxBatchDefault         = 128
	PipelinesDefault        = 4
)

// Config configures a Limiter. The zero value is ready to use.
type Config struct {
	// Prefix of every key sluice writes; PrefixDefault ("sluice") when empty.
	Prefix string
	// Policies is the store the limiter reads policies from. When nil the
	// limiter makes one over the same client and prefix, and closes it on
	// Close.
	Policies *PolicyStore
	// Horizon is how far ahead a reservation may be made; a job whose slot
	// is further away is told to come back at the horizon, without one.
	// HorizonDefault when zero.
	Horizon time.Duration
	// Grace is how long a reservation outlives its slot: a job that comes
	// back later is treated as a new one. GraceDefault when zero.
	Grace time.Duration
	// Tolerance is how early a job may start on the started-jobs meter of a
	// rate rule (never more than a quarter of the rule's interval); it
	// absorbs the jitter of sleeping and round trips. ToleranceDefault when
	// zero; negative means none.
	Tolerance time.Duration
	// ConcurrencyRetry caps the retry-after of a concurrency denial: a slot
	// freed by a finished job is not announced, so a waiting job looks again
	// this often. ConcurrencyRetryDefault when zero.
	ConcurrencyRetry time.Duration
	// MaxBatch is how many concurrent decisions may share one round trip.
	// MaxBatchDefault when zero; 1 turns sharing off.
	MaxBatch int
	// Pipelines is how many round trips may be in flight at once.
	// PipelinesDefault when zero.
	Pipelines int
}

func (c Config) withDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, PrefixDefault)
	c.Horizon = cmp.Or(c.Horizon, HorizonDefault)
	c.Grace = cmp.Or(c.Grace, GraceDefault)
	c.Tolerance = cmp.Or(c.Tolerance, ToleranceDefault)
	if c.Tolerance < 0 {
		c.Tolerance = 0
	}
	c.ConcurrencyRetry = cmp.Or(c.ConcurrencyRetry, ConcurrencyRetryDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.Pipelines = cmp.Or(c.Pipelines, PipelinesDefault)
	return c
}

func (c Config) validate() error {
	if err := validatePrefix(c.Prefix); err != nil {
		return err
	}
	switch {
	case c.Horizon < time.Second:
		return fmt.Errorf("throttle config: Horizon %s: must be at least 1s", c.Horizon)
	case c.Grace < 100*time.Millisecond:
		return fmt.Errorf("throttle config: Grace %s: must be at least 100ms, or jobs returning a little late lose their slots", c.Grace)
	case c.ConcurrencyRetry < time.Millisecond:
		return fmt.Errorf("throttle config: ConcurrencyRetry %s: must be at least 1ms", c.ConcurrencyRetry)
	case c.MaxBatch < 1 || c.MaxBatch > 10_000:
		return fmt.Errorf("throttle config: MaxBatch %d: must be between 1 and 10000", c.MaxBatch)
	case c.Pipelines < 1 || c.Pipelines > 1024:
		return fmt.Errorf("throttle config: Pipelines %d: must be between 1 and 1024", c.Pipelines)
	}
	return nil
}

// Limiter makes admission decisions for jobs, fleet-wide, in Redis. Every
// decision takes one round trip and uses Redis server time only; concurrent
// decisions share round trips.
//
// A Limiter is safe for concurrent use. Close it when done.
type Limiter struct {
	client   redis.UniversalClient
	cfg      Config
	policies *PolicyStore
	ownStore bool
	cluster  bool
	batch    *batcher

	// clock, when set, replaces Redis time (tests drive time with it).
	clock func() time.Time
	// noExpire makes the scripts set no TTLs (tests compare with and without).
	noExpire bool

	offset atomic.Int64 // Redis time minus local time, µs; for quota windows
}

// NewLimiter returns a limiter over the caller's client, which may be a
// single node, Sentinel or Cluster client.
func NewLimiter(client redis.UniversalClient, cfg *Config) (*Limiter, error) {
	if client == nil {
		return nil, errors.New("throttle: NewLimiter needs a Redis client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	l := &Limiter{client: client, cfg: c, policies: c.Policies}
	if l.policies == nil {
		s, err := NewPolicyStore(client, &StoreConfig{Prefix: c.Prefix})
		if err != nil {
			return nil, err
		}
		l.policies, l.ownStore = s, true
	} else if l.policies.prefix != c.Prefix {
		return nil, fmt.Errorf("throttle config: the policy store's prefix %q differs from the limiter's %q", l.policies.prefix, c.Prefix)
	}
	_, l.cluster = client.(*redis.ClusterClient)
	l.batch = newBatcher(client, c.MaxBatch, c.Pipelines)
	return l, nil
}

// Policies returns the store the limiter reads policies from.
func (l *Limiter) Policies() *PolicyStore { return l.policies }

// Close stops the limiter's background work. It does not close the client.
func (l *Limiter) Close() error {
	l.batch.close()
	if l.ownStore {
		return l.policies.Close()
	}
	return nil
}

// Request describes one admission.
type Request struct {
	// Tenant the job belongs to; "" for jobs that follow @global only.
	Tenant string
	// ID identifies the job: it holds the job's concurrency slot and its
	// reservation, so the same job admitted twice holds one slot. Required
	// when the policy has a concurrency rule or Reserve is set.
	ID string
	// Cost is how much the job weighs on rate, window and quota rules;
	// 0 means 1.
	Cost int64
	// Reserve makes a denied job take its own future slot (see Decision.Slot)
	// instead of only learning when to come back.
	Reserve bool
	// DryRun decides without writing anything.
	DryRun bool
}

// Admit decides whether job id of tenant may start now, taking a
// concurrency slot if the tenant's policy has one. A denied job is charged
// nothing. Admit is shorthand for AdmitN(ctx, tenant, id, 1).
func (l *Limiter) Admit(ctx context.Context, tenant, id string) (Decision, error) {
	return l.AdmitN(ctx, tenant, id, 1)
}

// AdmitN is Admit for a job of cost n.
func (l *Limiter) AdmitN(ctx context.Context, tenant, id string, n int64) (Decision, error) {
	if n < 1 {
		return Decision{}, fmt.Errorf("admit tenant %q: cost %d: must be at least 1", tenant, n)
	}
	return l.Do(ctx, Request{Tenant: tenant, ID: id, Cost: n})
}

// Reserve takes job id's slot without starting it, for shaping at enqueue:
// the job should be scheduled for Decision.Slot, and when it is processed
// Admit finds the reservation and does not charge it again. Allowed reports
// that the slot is due now. A job whose slot would be beyond the horizon
// gets no reservation (Reserved is false; RetryAfter is the horizon).
func (l *Limiter) Reserve(ctx context.Context, tenant, id string, n int64) (Decision, error) {
	if n < 1 {
		return Decision{}, fmt.Errorf("reserve for tenant %q: cost %d: must be at least 1", tenant, n)
	}
	return l.do(ctx, Request{Tenant: tenant, ID: id, Cost: n, Reserve: true}, flagReserve|flagPlan)
}

// Do makes the admission described by req: Admit with options.
//
// When ctx ends before Redis answers, Do returns ctx's error at once; the
// decision may still have been applied, so a caller that gives up should
// Release the job (always safe) and let an unused reservation expire.
func (l *Limiter) Do(ctx context.Context, req Request) (Decision, error) {
	flags := flagHold
	if req.Reserve {
		flags |= flagReserve
	}
	if req.DryRun {
		flags |= flagDry
	}
	return l.do(ctx, req, flags)
}

const (
	flagReserve = 1
	flagHold    = 2
	flagDry     = 4
	flagPlan    = 8
	flagNoTTL   = 16
)

// scope is one set of keys and the policy that governs them.
type scope struct {
	name   string // policy name reported in decisions
	keys   scopeKeys
	policy *Policy
}

func (l *Limiter) scopes(ctx context.Context, tenant string) ([]scope, error) {
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []scope
	if tenant != "" {
		out = append(out, scope{name: r.tenantName, keys: keysFor(l.cfg.Prefix, tenant), policy: r.tenant})
	}
	if r.global.HasRules() {
		out = append(out, scope{name: GlobalPolicy, keys: keysFor(l.cfg.Prefix, GlobalPolicy), policy: r.global})
	}
	return out, nil
}

func (l *Limiter) do(ctx context.Context, req Request, flags int) (Decision, error) {
	if req.Tenant != "" {
		if err := ValidateTenant(req.Tenant); err != nil {
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
	scopes, err := l.scopes(ctx, req.Tenant)
	if err != nil {
		return Decision{}, fmt.Errorf("admit tenant %q: %w", req.Tenant, err)
	}
	lease := time.Duration(0)
	for _, s := range scopes {
		if max := s.policy.maxCost(); max >= 0 && cost > max {
			_, rule := s.policy.MaxCost()
			return Decision{}, &CostError{Tenant: req.Tenant, Cost: cost, Max: max, Rule: s.name + " " + rule}
		}
		if c := s.policy; c != nil && c.Concurrency != nil {
			lease = max(lease, c.Concurrency.lease())
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
	if l.cluster && len(scopes) > 1 {
		return l.doSplit(ctx, req.ID, cost, flags, scopes, lease)
	}
	d, err := l.admitOnce(ctx, req.ID, cost, flags, scopes, 0)
	if err != nil {
		return Decision{}, fmt.Errorf("admit tenant %q: %w", req.Tenant, err)
	}
	if d.Allowed && flags&flagHold != 0 && flags&flagPlan == 0 {
		d.Lease = lease
	}
	return d, nil
}

// admitOnce runs admit.lua for the scopes in one round trip, retrying once
// with fresh quota windows when the local clock estimate was off.
func (l *Limiter) admitOnce(ctx context.Context, id string, cost int64, flags int, scopes []scope, notBefore int64) (Decision, error) {
	for attempt := 0; ; attempt++ {
		keys, aa := l.encodeAdmit(id, cost, flags, scopes, notBefore)
		res, err := l.batch.runAdmit(ctx, admitScript(scopes), keys, aa)
		if err != nil {
			if attempt == 0 && strings.Contains(err.Error(), "sluice: clock") {
				if err := l.syncClock(ctx); err != nil {
					return Decision{}, err
				}
				continue
			}
			return Decision{}, err
		}
		return l.decode(res, scopes)
	}
}

func (l *Limiter) clockArg() int64 {
	if l.clock == nil {
		return -1
	}
	return l.clock().UnixMicro()
}

// estimatedNow is the local guess of Redis time, used only to choose which
// quota windows to send; the script tells when the guess was off.
func (l *Limiter) estimatedNow() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now().Add(time.Duration(l.offset.Load()) * time.Microsecond)
}

func (l *Limiter) syncClock(ctx context.Context) error {
	if l.clock != nil {
		return errors.New("quota windows do not cover the test clock")
	}
	t, err := l.client.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("read Redis time: %w", err)
	}
	l.offset.Store(t.Sub(time.Now()).Microseconds())
	return nil
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// ceilDiv returns ceil(a/b) for positive b, exactly.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// mulDivCeil returns ceil(a*b/c) without overflowing for the values rules use.
func mulDivCeil(a, b, c int64) int64 {
	if a <= math.MaxInt64/max(b, 1) {
		return ceilDiv(a*b, c)
	}
	return int64(math.Ceil(float64(a) * float64(b) / float64(c)))
}

// rateArgs are the integers admit.lua uses for a rate rule and a cost.
func rateArgs(r Rate, cost int64) (inc, unit, off int64) {
	p := micros(r.Period)
	return mulDivCeil(p, cost, r.Limit), ceilDiv(p, r.Limit), mulDivCeil(p, r.burst(), r.Limit)
}

// quotaBounds are the starts of the quota windows around now: the window
// containing now (give or take clock skew) and the two after it.
func quotaBounds(q *Quota, now time.Time) []int64 {
	const skew = 2 * time.Second
	starts := q.Boundaries(now.Add(-skew), now.Add(skew), 16)
	for i := 0; i < 2; i++ {
		if n := q.schedule.Next(starts[len(starts)-1]); !n.IsZero() {
			starts = append(starts, n)
		}
	}
	out := make([]int64, len(starts))
	for i, t := range starts {
		out[i] = t.UnixMicro()
	}
	return out
}

// admitScript picks the script for an admission: admit_fast.lua when the
// job has one scope whose policy has only rate and concurrency rules (most
// jobs), admit.lua otherwise. Both decide alike.
func admitScript(scopes []scope) *redis.Script {
	if len(scopes) == 1 {
		if p := scopes[0].policy; p == nil || (p.Window == nil && p.Quota == nil) {
			return lua.AdmitFast
		}
	}
	return lua.Admit
}

// admitArgs is one admission's part of admit.lua's ARGV: the policies it
// uses and its op, whose policy references are positions in that list.
// Calls merged into one script run share the policies they have in common.
type admitArgs struct {
	header   []any // clock, 1, horizon, grace, tolerance, concurrency retry
	policies []encodedPolicy
	op       []any
	refs     []int // indexes in op of the policy references
}

type encodedPolicy struct {
	key  policyKey
	args []any
}

// policyKey identifies an encoded policy: the cached *Policy and, for a
// quota, the first window start sent with it.
type policyKey struct {
	p     *Policy
	start int64
}

var noPolicy = &Policy{}

// flatten lays the parts out as admit.lua reads them, for a call of its own.
func (aa *admitArgs) flatten() []any {
	n := len(aa.header) + 1 + len(aa.op)
	for _, p := range aa.policies {
		n += len(p.args)
	}
	args := make([]any, 0, n)
	args = append(args, aa.header...)
	args = append(args, len(aa.policies))
	for _, p := range aa.policies {
		args = append(args, p.args...)
	}
	return append(args, aa.op...)
}

func encodePolicyArgs(p *Policy, now func() time.Time) encodedPolicy {
	features := 0
	if p.Window != nil {
		features |= 1
	}
	if p.Quota != nil {
		features |= 2
	}
	if p.Concurrency != nil {
		features |= 4
	}
	args := make([]any, 0, 4+2*len(p.Rates))
	args = append(args, features, len(p.Rates))
	for _, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		args = append(args, unit, off)
	}
	if w := p.Window; w != nil {
		args = append(args, w.Limit, micros(w.Period))
	}
	key := policyKey{p: p}
	if q := p.Quota; q != nil {
		bounds := quotaBounds(q, now())
		key.start = bounds[0]
		args = append(args, q.Limit, len(bounds))
		for _, b := range bounds {
			args = append(args, b)
		}
	}
	if c := p.Concurrency; c != nil {
		args = append(args, c.Limit, micros(c.lease()))
	}
	return encodedPolicy{key: key, args: args}
}

func (l *Limiter) encodeAdmit(id string, cost int64, flags int, scopes []scope, notBefore int64) ([]string, *admitArgs) {
	keys := make([]string, 0, scopeKeyCount*len(scopes))
	aa := &admitArgs{
		header: []any{l.clockArg(), 1, micros(l.cfg.Horizon), micros(l.cfg.Grace),
			micros(l.cfg.Tolerance), micros(l.cfg.ConcurrencyRetry)},
		op: make([]any, 0, 5+2*len(scopes)),
	}
	aa.op = append(aa.op, id, cost, flags, notBefore, len(scopes))
	for _, s := range scopes {
		keys = append(keys, s.keys.admitKeys()...)
		p := s.policy
		if p == nil {
			p = noPolicy
		}
		ref := -1
		for i, ep := range aa.policies {
			if ep.key.p == p {
				ref = i
			}
		}
		if ref < 0 {
			aa.policies = append(aa.policies, encodePolicyArgs(p, l.estimatedNow))
			ref = len(aa.policies) - 1
		}
		aa.refs = append(aa.refs, len(aa.op))
		aa.op = append(aa.op, ref+1)
		if cost != 1 {
			for _, r := range p.Rates {
				inc, _, _ := rateArgs(r, cost)
				aa.op = append(aa.op, inc)
			}
		}
	}
	return keys, aa
}

// decode reads admit.lua's reply for a single op: {op, now}.
func (l *Limiter) decode(res any, scopes []scope) (Decision, error) {
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 {
		return Decision{}, fmt.Errorf("admit.lua: unexpected reply %T %v", res, res)
	}
	v, err := int64s(arr[0], 7)
	if err != nil {
		return Decision{}, fmt.Errorf("admit.lua: %w", err)
	}
	nowUs, ok := arr[1].(int64)
	if !ok {
		return Decision{}, fmt.Errorf("admit.lua: unexpected time %T %v", arr[1], arr[1])
	}
	if l.clock == nil {
		l.offset.Store(nowUs - time.Now().UnixMicro())
	}
	rule, ridx, rscope := v[2]>>16, (v[2]>>8)&0xff, v[2]&0xff
	d := Decision{
		Allowed:    v[0]&1 == 1,
		RetryAfter: time.Duration(v[1]) * time.Microsecond,
		Rule:       ruleName(rule, ridx),
		Remaining:  v[3],
		ResetAfter: time.Duration(v[4]) * time.Microsecond,
		InFlight:   v[5],
		Now:        time.UnixMicro(nowUs),
		charged:    v[0] >> 1,
	}
	if v[4] < 0 {
		d.ResetAfter = -1
	}
	if rscope > 0 && int(rscope) <= len(scopes) {
		d.Policy = scopes[rscope-1].name
	}
	if v[6] > 0 {
		d.Reserved, d.Slot = true, time.UnixMicro(v[6])
	}
	if d.Allowed {
		d.RetryAfter = -1
	}
	return d, nil
}

// int64s checks that a script reply is an array of n integers.
func int64s(reply any, n int) ([]int64, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) != n {
		return nil, fmt.Errorf("unexpected reply %T %v, want %d integers", reply, reply, n)
	}
	out := make([]int64, n)
	for i, x := range arr {
		v, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("unexpected reply element %d: %T %v", i, x, x)
		}
		out[i] = v
	}
	return out, nil
}

// Release gives back job id's concurrency slots (tenant and @global). It is
// safe to call for a job that holds none, and safe to call twice; without a
// concurrency rule it costs nothing. The job stays in its tenant's backlog:
// use Finish for a job that is done for good.
func (l *Limiter) Release(ctx context.Context, tenant, id string) error {
	_, err := l.release(ctx, tenant, id, false)
	return err
}

// Finish is Release for a job that will not run again (it succeeded, was
// archived or dropped): it also leaves its tenant's backlog.
func (l *Limiter) Finish(ctx context.Context, tenant, id string) error {
	_, err := l.release(ctx, tenant, id, tenant != "")
	return err
}

func (l *Limiter) release(ctx context.Context, tenant, id string, finish bool) (int64, error) {
	if tenant != "" {
		if err := ValidateTenant(tenant); err != nil {
			return 0, err
		}
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return 0, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
	}
	// Only scopes whose policy has a concurrency rule hold slots. A slot
	// taken under a policy that has since lost its rule is not stranded: it
	// is no longer renewed, so it frees itself when its lease runs out.
	var groups [][]string
	var tenantKeys, globalKeys []string
	if tenant != "" && r.tenant != nil && r.tenant.Concurrency != nil {
		tenantKeys = []string{keysFor(l.cfg.Prefix, tenant).state}
	}
	if r.global != nil && r.global.Concurrency != nil {
		globalKeys = []string{keysFor(l.cfg.Prefix, GlobalPolicy).state}
	}
	backlog := finish && tenant != "" && r.tenant != nil && r.tenant.Backlog > 0
	if l.cluster {
		if tenantKeys != nil || backlog {
			groups = append(groups, tenantKeys)
		}
		if globalKeys != nil {
			groups = append(groups, globalKeys)
		}
	} else if keys := append(tenantKeys, globalKeys...); len(keys) > 0 || backlog {
		groups = append(groups, keys)
	}
	var released int64
	for i, keys := range groups {
		args := []any{l.clockArg(), 1, id, len(keys), 0}
		if backlog && i == 0 {
			// the tenant's group comes first and shares its slot with the backlog
			keys = append(keys, keysFor(l.cfg.Prefix, tenant).backlog)
			args[4] = 1
		}
		res, err := l.batch.run(ctx, lua.Release, keys, args)
		if err != nil {
			return released, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
		}
		arr, ok := res.([]any)
		if !ok || len(arr) != 1 {
			return released, fmt.Errorf("release.lua: unexpected reply %v", res)
		}
		n, _ := arr[0].(int64)
		released += n
	}
	return released, nil
}

// AddBacklog counts jobs ids of tenant in its backlog, in order, until the
// backlog holds limit jobs (limit 0: no cap). It returns how many of the ids
// were taken (the first n; an id already counted is taken again without
// counting twice) and the backlog's size afterwards. The queue package calls
// it before enqueueing and RemoveBacklog when an enqueue fails.
func (l *Limiter) AddBacklog(ctx context.Context, tenant string, limit int64, ids ...string) (int, int64, error) {
	if err := ValidateTenant(tenant); err != nil {
		return 0, 0, err
	}
	if limit < 0 {
		return 0, 0, fmt.Errorf("backlog of tenant %q: cap %d must not be negative", tenant, limit)
	}
	if len(ids) == 0 {
		return 0, 0, nil
	}
	args := make([]any, 0, len(ids)+1)
	args = append(args, limit)
	for _, id := range ids {
		args = append(args, id)
	}
	res, err := l.batch.run(ctx, lua.Backlog, []string{keysFor(l.cfg.Prefix, tenant).backlog}, args)
	if err != nil {
		return 0, 0, fmt.Errorf("backlog of tenant %q: %w", tenant, err)
	}
	v, err := int64s(res, 2)
	if err != nil {
		return 0, 0, fmt.Errorf("backlog.lua: %w", err)
	}
	return int(v[0]), v[1], nil
}

// RemoveBacklog takes jobs out of tenant's backlog.
func (l *Limiter) RemoveBacklog(ctx context.Context, tenant string, ids ...string) error {
	if err := ValidateTenant(tenant); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	if err := l.client.ZRem(ctx, keysFor(l.cfg.Prefix, tenant).backlog, members...).Err(); err != nil {
		return fmt.Errorf("backlog of tenant %q: %w", tenant, err)
	}
	return nil
}

// Renew extends the leases of job id's concurrency slots. It returns false
// when a slot was lost (the lease ran out before the renewal, so another job
// may hold it now); the job keeps running but no longer counts.
func (l *Limiter) Renew(ctx context.Context, tenant, id string) (bool, error) {
	if tenant != "" {
		if err := ValidateTenant(tenant); err != nil {
			return false, err
		}
	}
	scopes, err := l.scopes(ctx, tenant)
	if err != nil {
		return false, fmt.Errorf("renew tenant %q job %q: %w", tenant, id, err)
	}
	var held []scope
	for _, s := range scopes {
		if s.policy != nil && s.policy.Concurrency != nil {
			held = append(held, s)
		}
	}
	if len(held) == 0 {
		return true, nil
	}
	groups := [][]scope{held}
	if l.cluster {
		groups = nil
		for _, s := range held {
			groups = append(groups, []scope{s})
		}
	}
	ok := true
	for _, g := range groups {
		keys := make([]string, len(g))
		args := []any{l.clockArg(), 1, id, len(g)}
		for i, s := range g {
			keys[i] = s.keys.state
			args = append(args, micros(s.policy.Concurrency.lease()))
		}
		res, err := l.batch.run(ctx, lua.Renew, keys, args)
		if err != nil {
			return false, fmt.Errorf("renew tenant %q job %q: %w", tenant, id, err)
		}
		arr, isArr := res.([]any)
		if !isArr || len(arr) != 1 {
			return false, fmt.Errorf("renew.lua: unexpected reply %v", res)
		}
		if v, _ := arr[0].(int64); v != 1 {
			ok = false
		}
	}
	return ok, nil
}

// Cooldown pauses tenant for d: no job of it starts until then, and jobs
// holding reservations inside the pause get new slots after it. A longer
// cooldown already in place is kept. Use GlobalPolicy to pause everything.
// It returns when the cooldown ends.
func (l *Limiter) Cooldown(ctx context.Context, tenant string, d time.Duration) (time.Time, error) {
	if tenant != GlobalPolicy {
		if err := ValidateTenant(tenant); err != nil {
			return time.Time{}, err
		}
	}
	if d <= 0 {
		return time.Time{}, fmt.Errorf("cooldown tenant %q: duration %s must be positive", tenant, d)
	}
	keys := []string{keysFor(l.cfg.Prefix, tenant).state}
	res, err := l.batch.run(ctx, lua.Cooldown, keys, []any{l.clockArg(), micros(d)})
	if err != nil {
		return time.Time{}, fmt.Errorf("cooldown tenant %q: %w", tenant, err)
	}
	v, err := int64s(res, 2)
	if err != nil {
		return time.Time{}, fmt.Errorf("cooldown.lua: %w", err)
	}
	return time.UnixMicro(v[0]), nil
}

// Reset deletes every piece of throttle state of tenant (meters, window
// entries, reservations, slots, cooldown). Its policy is kept.
func (l *Limiter) Reset(ctx context.Context, tenant string) error {
	if tenant != GlobalPolicy {
		if err := ValidateTenant(tenant); err != nil {
			return err
		}
	}
	k := keysFor(l.cfg.Prefix, tenant)
	if err := l.client.Del(ctx, k.state, k.planned, k.started).Err(); err != nil {
		return fmt.Errorf("reset tenant %q: %w", tenant, err)
	}
	return nil
}
