package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of Config.
const (
	HorizonDefault          = time.Hour
	GraceDefault            = time.Minute
	ToleranceDefault        = 2 * time.Millisecond
	ConcurrencyRetryDefault = 200 * time.Millisecond
	MaxBatchDefault         = 128
	PipelinesDefault        = 4
	PromoteLeadDefault      = 50 * time.Millisecond
)

// Config configures a Limiter. The zero value is ready to use.
type Config struct {
	// Prefix of every key sluice writes; PrefixDefault ("sluice") when empty.
	Prefix string
	// Policies, when set, is another limiter's store (its Policies) for
	// this one to share, with its cache; its prefix must be Prefix. Nil:
	// the limiter makes one over the same client and prefix, and closes it
	// on Close.
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
	// PromoteLead is how long before its slot a job may leave its line in
	// the waiting room (Room), so that it is in a worker when the slot
	// comes; the worker's gate holds it until then. PromoteLeadDefault when
	// zero.
	PromoteLead time.Duration
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
	c.PromoteLead = cmp.Or(c.PromoteLead, PromoteLeadDefault)
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
	case c.PromoteLead < 0 || c.PromoteLead > 10*time.Second:
		return fmt.Errorf("throttle config: PromoteLead %s: must be between 0 and 10s", c.PromoteLead)
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
	// blockID, when set, names new blocks (tests: the same names on every
	// limiter compared)
	blockID func() string
	// general makes admit.lua decide with its general engine only (tests
	// compare it with the quick path).
	general bool

	rclock redisClock // Redis time against local time, as replies tell; for quota windows and tickets
	// masters are a Cluster's masters' own bounds (clockFor); masterOf
	// names the master that holds a key, with a client of it ("": not
	// known). Tests set masterOf to stand for masters whose clocks differ.
	masters  masterClocks
	masterOf func(ctx context.Context, key string) (*redis.Client, string)

	// splitLocks serialise a process's two-step admissions of one tenant
	// (split.go), so that they never take back each other's charges.
	splitLocks [splitStripes]chan struct{}

	shadows shadower // shadow decisions on their way (shadow.go)

	// due is the process's view of the waiting room's due index shards
	// (due.go), which its pumps and releases share.
	due dueView

	// registered holds the queue engine's queues this process's parks
	// have registered (park.lua): once per queue, as asynq's own client
	// does
	registered sync.Map

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
		s, err := newPolicyStore(client, &storeConfig{Prefix: c.Prefix})
		if err != nil {
			return nil, err
		}
		l.policies, l.ownStore = s, true
	} else if l.policies.prefix != c.Prefix {
		return nil, fmt.Errorf("throttle config: the policy store's prefix %q differs from the limiter's %q", l.policies.prefix, c.Prefix)
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		l.cluster, l.masterOf = true, clusterMasterOf(cc)
	}
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
	l.shadows.close()
	l.batch.close()
	if l.ownStore {
		return l.policies.close()
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
	// Wait, when positive, is how long the caller will wait for the job's
	// start: a job that a rate rule lets start within Wait (its started
	// meter a little ahead) is allowed at that time, Decision.Slot, and
	// charged then, instead of being denied; the caller waits until Slot.
	Wait time.Duration
	// Ticket is the decision the waiting room made for the job ahead of
	// time (Decision.Ticket), when it no longer holds (the job comes late
	// for its slot): where the job's charge on a rate's started meter is
	// still the last, it is taken back, so that the job is charged once,
	// now.
	Ticket string
	// Pools are the shared pools the job draws from ("@openai", "@smtp"):
	// every rule of every pool's policy applies with the tenant's and
	// @global's, all or nothing (a job one of them denies is charged in
	// none). A pool's limits are fleet-wide and shared by every tenant
	// whose jobs name it; a pool without a policy limits nothing.
	Pools []string
	// Key is the job's key below its tenant ("user-42": tenant acme's
	// user), "" for none. The key's policy (acme/user-42, else acme/*,
	// else */*) applies with the tenant's, all or nothing: the tenant's
	// own policy then limits the sum of its keys. A key's scope lives in
	// its tenant's Redis slot.
	Key string

	// policies, when set, are the policies to decide by, as sluice's
	// worker or producer resolved them for the job
	// (jobpath.Engine.With): it decides by the same ones everywhere. Nil:
	// the limiter resolves them.
	policies *jobPolicies
}

// Admit decides whether job id of tenant may start now, taking a
// concurrency slot if the tenant's policy has one. A denied job is charged
// nothing. Admit is shorthand for Do(ctx, Request{Tenant: tenant, ID: id}).
func (l *Limiter) Admit(ctx context.Context, tenant, id string) (Decision, error) {
	return l.Do(ctx, Request{Tenant: tenant, ID: id})
}

// Do makes the admission described by req: Admit with options (a cost, a
// reservation of the job's own future slot when it is denied, a dry run).
//
// When ctx ends before Redis answers, Do returns ctx's error at once; the
// decision may still land, and then the slot it took is released under its
// own claim a moment later, and an unused reservation expires.
func (l *Limiter) Do(ctx context.Context, req Request) (Decision, error) {
	flags := flagHold
	if req.Reserve {
		flags |= flagReserve
	}
	return l.do(ctx, req, flags)
}

// Reserve takes job req.ID's slot without starting the job, for shaping at
// enqueue: the job should be scheduled for Decision.Slot, and when it is
// processed Admit finds the reservation and does not charge it again.
// Allowed reports that the slot is due now. A job whose slot would be beyond
// the horizon gets no reservation (Reserved is false; RetryAfter is the
// horizon). req.Reserve is implied; req.DryRun is honoured.
func (l *Limiter) Reserve(ctx context.Context, req Request) (Decision, error) {
	req.Reserve = true
	return l.do(ctx, req, flagReserve|flagPlan)
}
