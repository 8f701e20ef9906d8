package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
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

	// splitLocks serialise a process's two-step admissions of one tenant
	// (split.go), so that they never take back each other's charges.
	splitLocks [splitStripes]chan struct{}

	late      sync.WaitGroup // releaseLate's goroutines
	closing   chan struct{}
	closeOnce sync.Once
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
	l.closing = make(chan struct{})
	for i := range l.splitLocks {
		l.splitLocks[i] = make(chan struct{}, 1)
	}
	return l, nil
}

// Policies returns the store the limiter reads policies from.
func (l *Limiter) Policies() *PolicyStore { return l.policies }

// Close stops the limiter's background work. It does not close the client.
func (l *Limiter) Close() error {
	l.closeOnce.Do(func() { close(l.closing) })
	l.late.Wait()
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
	holds := lease > 0 && flags&flagHold != 0 && flags&flagPlan == 0 && flags&flagDry == 0
	op := &admitOp{id: req.ID, cost: cost, flags: flags}
	if holds {
		op.claim = newClaim()
	}
	for _, s := range scopes {
		op.scopes = append(op.scopes, opScope{scope: s})
	}
	var d Decision
	if l.cluster && len(scopes) > 1 {
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
	return d, nil
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
	if clock < 0 {
		clock = l.clockArg()
	}
	for attempt := 0; ; attempt++ {
		now := l.estimatedNow()
		if clock >= 0 {
			now = time.UnixMicro(clock)
		}
		keys, aa := l.encode(op, clock, now)
		res, err := l.batch.runAdmit(ctx, lua.Admit, keys, aa)
		if err != nil {
			if attempt == 0 && clock < 0 && isClockError(err) {
				if err := l.syncClock(ctx); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		}
		r, err := decodeAdmit(res)
		if err != nil {
			return nil, err
		}
		if l.clock == nil {
			l.offset.Store(r.now - time.Now().UnixMicro())
		}
		return r, nil
	}
}

// errClockPrefix starts the script error for a time outside the quota
// windows sent (see admit.lua's header).
const errClockPrefix = "ERR sluice: clock"

func isClockError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), errClockPrefix)
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

// ErrClaimLost is returned by Release and Renew when a job's concurrency
// slot is no longer held under the claim given: its lease ran out before a
// renewal (another job may have the slot now) or a later admission of the
// same job took the slot over. Nothing held by another claim is changed.
var ErrClaimLost = errors.New("concurrency claim lost")

// Release gives back the concurrency slots (tenant and @global) that job id
// holds under claim (Decision.Claim); claim 0 releases them whichever
// admission holds them. A job that holds none costs nothing, and a second
// Release of the same claim returns ErrClaimLost without changing anything.
// The job stays in its tenant's backlog: use Finish for a job that is done
// for good.
func (l *Limiter) Release(ctx context.Context, tenant, id string, claim uint64) error {
	return l.release(ctx, tenant, id, claim, false)
}

// Finish is Release for a job that will not run again (it succeeded, was
// archived or dropped): it also leaves its tenant's backlog.
func (l *Limiter) Finish(ctx context.Context, tenant, id string, claim uint64) error {
	return l.release(ctx, tenant, id, claim, tenant != "")
}

func (l *Limiter) release(ctx context.Context, tenant, id string, claim uint64, finish bool) error {
	if tenant != "" {
		if err := ValidateTenant(tenant); err != nil {
			return err
		}
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return fmt.Errorf("release tenant %q job %q: %w", tenant, id, err)
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
	lost := false
	var firstErr error
	for i, keys := range groups {
		noTTL := 0
		if l.noExpire {
			noTTL = 1
		}
		args := []any{l.clockArg(), 1, noTTL, id, claim, len(keys), 0}
		if backlog && i == 0 {
			// the tenant's group comes first and shares its slot with the backlog
			keys = append(keys, keysFor(l.cfg.Prefix, tenant).backlog)
			args[6] = 1
		}
		// every group is tried: a scope that cannot be reached keeps its
		// slot until the lease runs out, the others are given back now
		res, err := l.batch.run(ctx, lua.Release, keys, args)
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("release tenant %q job %q: %w", tenant, id, err))
			continue
		}
		arr, ok := res.([]any)
		if !ok || len(arr) != 1 {
			return fmt.Errorf("release.lua: unexpected reply %v", res)
		}
		v, err := int64s(arr[0], 2)
		if err != nil {
			return fmt.Errorf("release.lua: %w", err)
		}
		if v[1] > 0 {
			lost = true
		}
	}
	if firstErr != nil {
		return firstErr
	}
	if lost && claim != 0 {
		return fmt.Errorf("release tenant %q job %q: %w", tenant, id, ErrClaimLost)
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
		_ = l.release(ctx, tenant, id, claim, false)
	}()
}

// lateRelease is how long releaseLate waits for an abandoned admission to land.
const lateRelease = 2 * time.Second

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

// Renew extends the leases of the concurrency slots job id holds under
// claim (Decision.Claim; 0: whichever admission holds them). It returns
// ErrClaimLost when a slot is no longer held under the claim: the lease ran
// out before the renewal, or a later admission of the job took the slot
// over. The job may keep running but no longer counts; a slot another claim
// holds is left alone.
func (l *Limiter) Renew(ctx context.Context, tenant, id string, claim uint64) error {
	if tenant != "" {
		if err := ValidateTenant(tenant); err != nil {
			return err
		}
	}
	scopes, err := l.scopes(ctx, tenant)
	if err != nil {
		return fmt.Errorf("renew tenant %q job %q: %w", tenant, id, err)
	}
	var held []scope
	for _, s := range scopes {
		if s.policy != nil && s.policy.Concurrency != nil {
			held = append(held, s)
		}
	}
	if len(held) == 0 {
		return nil
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
		args := []any{l.clockArg(), 1, id, claim, len(g)}
		for i, s := range g {
			keys[i] = s.keys.state
			args = append(args, micros(s.policy.Concurrency.lease()))
		}
		res, err := l.batch.run(ctx, lua.Renew, keys, args)
		if err != nil {
			return fmt.Errorf("renew tenant %q job %q: %w", tenant, id, err)
		}
		arr, isArr := res.([]any)
		if !isArr || len(arr) != 1 {
			return fmt.Errorf("renew.lua: unexpected reply %v", res)
		}
		if v, _ := arr[0].(int64); v != 1 {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("renew tenant %q job %q: %w", tenant, id, ErrClaimLost)
	}
	return nil
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
