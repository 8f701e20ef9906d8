package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/asynqroom"
	"github.com/sluicehq/sluice/internal/blocks"
	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// maxIDLen bounds the identity a job may claim in its IDHeader.
const maxIDLen = 1024

// waitSlack lets a job whose in-process budget is almost spent still wait
// the few milliseconds the started-jobs meter asks for, rather than go
// round asynq's schedule again and come back late.
const waitSlack = 100 * time.Millisecond

// Gate admits every job through the throttle before its handler runs. Use
// it through Server, or in an existing asynq application through
// Middleware and Configure.
//
// For each job the gate asks the limiter (one round trip, shared with
// concurrent jobs) with a reservation. An admitted job runs with its
// concurrency lease renewed every Lease/3 and released when the handler
// returns, fails or panics. A denied job whose slot is near waits for it
// in-process (InProcessWait; overflow=wait extends it to max_wait);
// otherwise it is deferred to its slot (overflow=defer, the default: not a
// failure, no retry used, never archived) or archived with the reason
// "throttled" (overflow=drop).
//
// A Gate is safe for concurrent use.
type Gate struct {
	lim       *throttle.Limiter
	cfg       GateConfig
	log       *slog.Logger
	m         *metrics
	rm        *roomMetrics
	down      *downstream
	gatherer  prometheus.Gatherer
	asynq     *asynq.Client
	inspector *asynq.Inspector
	room      waitroom.Room
	path      engine
	handover  waitroom.Handover
	// engine lays out asynq's keys for the pump's turns to hand their
	// jobs over in their own runs; nil unless asynq's keys share the
	// room's server
	engine *waitroom.EngineLayout
	gauge  *asynqroom.Gauge
	// asynqRedis is the client of asynq's queues; registration counts the
	// worker in the fleet's capacity while its pump runs
	asynqRedis   redis.UniversalClient
	registration *asynqroom.Registration

	renewals renewer      // the running jobs' leases
	blocks   *blocks.Pool // nil with NoBlocks
	// blockSlots is how many concurrency slots a block asks for: the
	// Server's concurrency
	blockSlots atomic.Int64
	kick       chan struct{} // a job ended (the pump's PumpConfig.Kick)
	rec        *recoverer    // Server's; nil for a gate used alone
	layout     *asynqroom.Layout
	roomOff    atomic.Bool // asynq's layout is not the one the room writes

	rel      releases      // releases on their way (releaseSoon)
	linger   time.Duration // releaseLinger (tests set another)
	stopping chan struct{}
	stopOnce sync.Once
	pumpOnce sync.Once
	pumpWG   sync.WaitGroup
	stopPump context.CancelFunc
	active   tracker
	outage   atomic.Int64 // when the gate's Redis errors began (unix ns); 0 when healthy
	// usageLogged: a response's unreadable usage was logged (once)
	usageLogged atomic.Bool
	logLimit    logLimiter
}

// blockSlotsDefault is how many concurrency slots a block asks for when
// the gate does not know its process's concurrency (Configure tells it).
const blockSlotsDefault = 16

// NewGate returns a gate over lim. asynqRedis is the Redis client of asynq's
// queues: the gate enqueues there the copy of a job deferred at its retry
// limit.
func NewGate(lim *throttle.Limiter, asynqRedis redis.UniversalClient, cfg *GateConfig) (*Gate, error) {
	if lim == nil {
		return nil, errors.New("worker: NewGate needs a limiter (throttle.NewLimiter)")
	}
	if asynqRedis == nil {
		return nil, errors.New("worker: NewGate needs the Redis client of asynq's queues")
	}
	var c GateConfig
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	shares := waitroom.Of(lim).Shares(asynqRedis)
	g := &Gate{
		lim:        lim,
		cfg:        c,
		log:        c.Logger,
		asynq:      asynq.NewClientFromRedisClient(asynqRedis),
		inspector:  asynq.NewInspectorFromRedisClient(asynqRedis),
		room:       waitroom.Of(lim),
		path:       jobpath.Of(lim).(engine),
		handover:   asynqroom.Handover(asynqRedis, shares),
		gauge:      asynqroom.NewGauge(asynqRedis),
		layout:     asynqroom.NewLayout(asynqRedis),
		stopping:   make(chan struct{}),
		kick:       make(chan struct{}, 1),
		asynqRedis: asynqRedis,
		linger:     releaseLinger,
	}
	if shares {
		g.engine = asynqroom.Engine()
	}
	reg := c.Registerer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, g.gatherer = r, r
	} else if ga, ok := reg.(prometheus.Gatherer); ok {
		g.gatherer = ga
	}
	m, err := newMetrics(reg, c.TenantLabels)
	if err != nil {
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	g.m = m
	g.blockSlots.Store(blockSlotsDefault)
	if !c.NoBlocks {
		g.blocks = blocks.NewPool(blocks.Of(lim), &blocks.Config{
			Slots:       func() int { return int(g.blockSlots.Load()) },
			CallTimeout: c.CallTimeout,
			OnError: func(op string, err error) {
				g.m.err(errBlock)
				g.warn(errBlock, "block of starts failed; deciding jobs one by one", "op", op, "err", err)
			},
		})
	}
	if g.rm, err = newRoomMetrics(reg, c.TenantLabels); err != nil {
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	if g.down, err = newDownstream(reg, c.TenantLabels); err != nil {
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	return g, nil
}

// Gatherer returns the registry holding the gate's metrics (the private
// one, or GateConfig.Registerer when it is also a Gatherer); nil otherwise.
func (g *Gate) Gatherer() prometheus.Gatherer { return g.gatherer }

// Middleware returns the gate as asynq middleware: mux.Use(gate.Middleware()).
// Register it first, so that it runs before any other middleware, and set
// the asynq.Config hooks with Configure.
func (g *Gate) Middleware() asynq.MiddlewareFunc { return g.wrap }

// wrap returns h behind the gate.
func (g *Gate) wrap(h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		g.active.add()
		defer g.active.done()
		defer g.rec.started(ctx)()
		// the job's end may leave the fleet room: the pump looks
		defer g.kickPump()
		return g.process(ctx, g.identify(ctx, task), h)
	})
}

// kickPump tells the worker's pump that a job ended.
func (g *Gate) kickPump() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Stop ends every in-process wait at once, handing the waiting jobs back to
// asynq (deferred to their slots); jobs that arrive later are handed back
// too. It also stops the waiting room's pump (Configure started it). Call
// it when the worker begins shutting down, before asynq's own Shutdown.
// Running handlers are not interrupted.
func (g *Gate) Stop() {
	g.stopOnce.Do(func() {
		close(g.stopping)
		g.releaseLingering()
		g.pumpOnce.Do(func() {}) // no pump starts after Stop
		if g.stopPump != nil {
			g.stopPump()
		}
		g.pumpWG.Wait()
		g.down.stopAdapting()
		if g.blocks != nil {
			g.blocks.Close()
		}
		if g.registration != nil {
			ctx, cancel := context.WithTimeout(context.Background(), g.cfg.CallTimeout)
			if err := g.registration.Close(ctx); err != nil {
				g.m.err(errRoom)
				g.warn(errRoom, "cannot leave fleet capacity", "err", err)
			}
			cancel()
		}
	})
}

// giveBack releases the concurrency slot a job holds whichever admission
// took it (the waiting room's promotion, for a job sent to asynq with its
// slot), handing it to the next in line, for a job that does not reach
// the gate (no handler takes its type). A tenant without a concurrency
// rule costs no round trip.
func (g *Gate) giveBack(ctx context.Context, task *asynq.Task) {
	j := g.identify(ctx, task)
	if j.tenant == "" {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
	defer cancel()
	if err := g.room.Release(cctx, j.tenant, j.queue, j.id, 0, j.scopes(), g.handing(), g.gauge.Spare); err != nil {
		g.m.err(errRelease)
		g.warn(errRelease, "cannot release slot; it frees at lease end", "task", j.taskID, "tenant", j.tenant, "err", err)
	}
}

// stopped reports whether Stop was called.
func (g *Gate) stopped() bool {
	select {
	case <-g.stopping:
		return true
	default:
		return false
	}
}

// Wait blocks until no job is inside the gate (every handler has returned
// and released its slots) or ctx ends.
func (g *Gate) Wait(ctx context.Context) error { return g.active.wait(ctx) }

// policies are a job's policies, resolved once per delivery
// (engine.Resolve): its overflow mode and every decision follow them.
type policies = jobpath.Policies[throttle.Policy, throttle.LearnedLimit, throttle.AdaptiveLimit]

// engine is the limiter's calls beyond throttle's public API
// (jobpath.Of).
type engine = jobpath.Engine[throttle.Request, throttle.Decision, *policies]

// request is the admission of the job, decided by its policies.
func (j *job) request(path engine) throttle.Request {
	return path.With(throttle.Request{Tenant: j.tenant, ID: j.id, Cost: j.cost, Pools: j.pools, Key: j.key}, j.policies)
}

// job is what the gate knows of one delivery of a task.
type job struct {
	task     *asynq.Task
	tenant   string // "" when the job follows @global only
	id       string // identity: holds reservations and concurrency slots
	taskID   string
	cost     int64
	queue    string
	retried  int
	maxRetry int
	gen      int // copies made so far at the retry limit
	// policies are the job's, resolved once per delivery; nil until then
	policies *policies
	// ticket is the decision the job carried when it no longer holds
	ticket string
	// pools are the shared pools the job draws from (taskspec.PoolsHeader)
	pools []string
	// key is the job's key below its tenant (taskspec.KeyHeader)
	key string
}

// scopes are what the job draws from besides its tenant and @global.
func (j *job) scopes() waitroom.Scopes { return waitroom.Scopes{Key: j.key, Pools: j.pools} }

// identify reads the job's tenant, identity and cost. A header that cannot
// be used is logged and counted, and the job runs under what is left
// (@global only for a bad tenant, cost 1 for a bad cost): nothing is lost.
func (g *Gate) identify(ctx context.Context, task *asynq.Task) *job {
	h := task.Headers()
	j := &job{task: task, cost: 1}
	j.taskID, _ = asynq.GetTaskID(ctx)
	j.queue, _ = asynq.GetQueueName(ctx)
	j.retried, _ = asynq.GetRetryCount(ctx)
	j.maxRetry, _ = asynq.GetMaxRetry(ctx)
	if g.cfg.TenantFunc != nil {
		j.tenant = g.cfg.TenantFunc(ctx, task)
	} else if j.tenant = h[taskspec.TenantHeader]; j.tenant == "" {
		// Most likely a producer that bypassed queue.Client; a worker whose
		// jobs follow @global only by design says so with a TenantFunc.
		g.m.err(errNoTenant)
		g.warn(errNoTenant, "job without tenant header runs under @global", "task", j.taskID, "type", task.Type(), "header", taskspec.TenantHeader)
	}
	if j.tenant != "" {
		if err := names.Tenant(j.tenant); err != nil {
			g.m.err(errTenant)
			g.warn(errTenant, "job with unusable tenant runs under @global", "task", j.taskID, "type", task.Type(), "err", err)
			j.tenant = ""
		}
	}
	j.id = j.taskID
	if id, ok := h[taskspec.IDHeader]; ok {
		if id == "" || len(id) > maxIDLen {
			g.m.err(errIDHeader)
			g.warn(errIDHeader, "unusable identity header; task id used", "task", j.taskID, "header", taskspec.IDHeader, "length", len(id))
		} else {
			j.id = id
		}
	}
	if s, ok := h[taskspec.CostHeader]; ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			g.m.err(errCostHeader)
			g.warn(errCostHeader, "unusable cost header; cost 1 used", "task", j.taskID, "header", taskspec.CostHeader, "value", s)
		} else {
			j.cost = n
		}
	}
	if v, ok := h[taskspec.PoolsHeader]; ok {
		for _, p := range taskspec.ParsePools(v) {
			if err := names.Pool(p); err != nil {
				g.m.err(errPoolsHeader)
				g.warn(errPoolsHeader, "unusable pool in pools header; pool left out", "task", j.taskID, "header", taskspec.PoolsHeader, "err", err)
				continue
			}
			j.pools = append(j.pools, p)
		}
	}
	if k, ok := h[taskspec.KeyHeader]; ok && j.tenant != "" {
		if err := names.Key(k); err != nil {
			g.m.err(errKeyHeader)
			g.warn(errKeyHeader, "unusable key header; job runs without its key", "task", j.taskID, "header", taskspec.KeyHeader, "err", err)
		} else {
			j.key = k
		}
	}
	j.gen, _ = strconv.Atoi(h[taskspec.GenHeader])
	return j
}

// overflow returns the job's overflow mode and how long it may wait
// in-process in all, under its policies (the tenant's, or @global's for a
// job without a tenant; no policy: defer).
func (g *Gate) overflow(j *job) (throttle.Overflow, time.Duration) {
	pol := j.policies.Policy
	if j.tenant == "" {
		pol = j.policies.Global
	}
	if pol == nil || pol.Overflow == "" {
		return throttle.OverflowDefer, g.cfg.InProcessWait
	}
	if pol.Overflow == throttle.OverflowWait {
		return pol.Overflow, max(g.cfg.InProcessWait, cmp.Or(pol.MaxWait, throttle.MaxWaitDefault))
	}
	return pol.Overflow, g.cfg.InProcessWait
}

func (g *Gate) process(ctx context.Context, j *job, next asynq.Handler) error {
	start := time.Now()
	// The job's policies are resolved once (from the limiter's cache,
	// normally): its overflow mode and every decision follow the same ones.
	cctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	r, err := g.path.Resolve(cctx, j.tenant)
	cancel()
	if err != nil {
		return g.gateError(ctx, j, err, next, start)
	}
	j.policies = r
	mode, budget := g.overflow(j)
	ticket := j.task.Headers()[taskspec.DecidedHeader]
	if ticket == "" && g.blocks != nil && j.tenant != "" && j.key == "" && len(j.pools) == 0 && !g.stopped() {
		// a tenant far from its limits: started from its block
		if s, ok := g.blocks.Take(ctx, j.tenant, j.policies, j.cost, j.policies.Policy != nil && j.policies.Policy.Concurrency != nil); ok {
			return g.fromBlock(ctx, j, s, start, next)
		}
	}
	if t := ticket; t != "" && j.tenant != "" {
		// decided once, ahead: started on that decision, at its slot
		if err := g.redeem(ctx, j, t, budget, start, next); err != errAskAgain {
			return err
		}
		j.ticket = t
	}
	return g.oneByOne(ctx, j, mode, budget, start, next)
}

// fromBlock runs a job on a start (and a slot) of its tenant's block,
// giving the slot back to the block when the job ends.
func (g *Gate) fromBlock(ctx context.Context, j *job, s *blocks.Start, start time.Time, next asynq.Handler) error {
	defer s.Done()
	d, _ := s.Decision.(throttle.Decision)
	d.Now = s.Now
	g.m.blocks.Inc()
	g.m.decision(j.tenant, verdictAllowed, "", "")
	waited := time.Since(start)
	g.m.wait.Observe(waited.Seconds())
	return g.run(ctx, j, &Admission{Tenant: j.tenant, ID: j.id, Cost: j.cost, Decision: d, Waited: waited}, next)
}

// oneByOne decides the job alone, as often as its in-process budget lets
// it wait, and runs, defers or drops it. (process's own paths, a block's
// start and a ticket, stay small: their goroutine's stack grows less.)
func (g *Gate) oneByOne(ctx context.Context, j *job, mode throttle.Overflow, budget time.Duration, start time.Time, next asynq.Handler) error {
	// A job that may be dropped takes a reservation only once its slot is
	// known to be near: a reservation it then does not use is capacity lost.
	reserve := mode != throttle.OverflowDrop
	for {
		select {
		case <-g.stopping:
			return g.handBack(ctx, j, 0, false, start)
		default:
		}
		d, err := g.decide(ctx, j, reserve, budget-time.Since(start))
		decided := time.Now()
		if err != nil {
			return g.gateError(ctx, j, err, next, start)
		}
		if g.outage.Load() != 0 {
			g.outage.Store(0)
		}
		if d.Allowed && d.Ticket != "" {
			// allowed at its slot, a few ms ahead: started there, on the
			// decision, unless the wait overruns
			if err := g.redeem(ctx, j, d.Ticket, budget, start, next); err != errAskAgain {
				return err
			}
			j.ticket = d.Ticket
			continue
		}
		if d.Allowed {
			g.m.decision(j.tenant, verdictAllowed, "", "")
			waited := time.Since(start)
			g.m.wait.Observe(waited.Seconds())
			return g.run(ctx, j, &Admission{Tenant: j.tenant, ID: j.id, Cost: j.cost, Decision: d, Waited: waited}, next)
		}
		g.m.decision(j.tenant, verdictDenied, d.Rule, d.Policy)
		left := budget - time.Since(start)
		if d.RetryAfter <= left+waitSlack && g.canWait(ctx, d.RetryAfter) {
			if !reserve && d.Rule != "concurrency" {
				reserve = true
				continue
			}
			if !g.sleep(ctx, d.RetryAfter) {
				return g.handBack(ctx, j, d.RetryAfter-time.Since(decided), d.Reserved, start)
			}
			continue
		}
		g.m.wait.Observe(time.Since(start).Seconds())
		if mode == throttle.OverflowDrop {
			return g.drop(ctx, j, d)
		}
		return g.deferJob(ctx, j, &DeferError{
			Reason: ReasonThrottled, Rule: d.Rule, Policy: d.Policy,
			RetryAfter: d.RetryAfter, At: g.retryAt(d.RetryAfter, d.Reserved),
		})
	}
}

// errAskAgain says that a job's carried decision does not hold: the gate
// decides it anew.
var errAskAgain = errors.New("sluice: decide the job anew")

// redeem starts a job on the decision the waiting room made for it (its
// ticket, taskspec.DecidedHeader): at its slot, waiting in-process when it
// is early, without asking Redis again. It returns errAskAgain, having run
// nothing, when the ticket does not hold (the job comes late for its slot,
// as a retried or deferred job does, or its concurrency slot is gone).
func (g *Gate) redeem(ctx context.Context, j *job, ticket string, budget time.Duration, start time.Time, next asynq.Handler) error {
	cctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	d, ok, err := g.path.Redeem(cctx, j.request(g.path), ticket)
	cancel()
	if err == nil && !ok && d.Reserved {
		// it holds a reservation for its slot: asked there, not before
		g.m.tickets.WithLabelValues(ticketReserved).Inc()
		if d.RetryAfter > 0 && d.RetryAfter <= budget {
			g.sleep(ctx, d.RetryAfter)
		}
		return errAskAgain
	}
	if err != nil || !ok {
		if err == nil {
			g.m.tickets.WithLabelValues(ticketAsked).Inc()
		}
		return errAskAgain
	}
	if wait := d.Slot.Sub(d.Now); wait > 0 {
		if wait > budget || !g.sleepUntil(ctx, wait) {
			// too early to hold, or shutting down: the slot stays taken;
			// the job is deferred to it and decided anew when it comes
			g.m.tickets.WithLabelValues(ticketAsked).Inc()
			return errAskAgain
		}
		// a sleep may overrun (a stalled process): is it still in time?
		if d, ok, err = g.path.Redeem(ctx, j.request(g.path), ticket); err != nil || !ok {
			g.m.tickets.WithLabelValues(ticketAsked).Inc()
			return errAskAgain
		}
		if d.Now.Before(d.Slot) {
			d.Now = d.Slot // admitted at its slot
		}
	}
	g.m.tickets.WithLabelValues(ticketRedeemed).Inc()
	g.m.decision(j.tenant, verdictAllowed, "", "")
	waited := time.Since(start)
	g.m.wait.Observe(waited.Seconds())
	return g.run(ctx, j, &Admission{Tenant: j.tenant, ID: j.id, Cost: j.cost, Decision: d, Waited: waited}, next)
}

// decide asks the limiter whether the job may start, waiting at most
// CallTimeout. An answer that comes after the gate gave up is undone by the
// limiter as far as it matters: the slot an admitted job took is released
// under that admission's claim, never a later admission's.
func (g *Gate) decide(ctx context.Context, j *job, reserve bool, wait time.Duration) (throttle.Decision, error) {
	cctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	start := time.Now()
	if !reserve || !g.canWait(ctx, wait) {
		wait = 0
	}
	req := j.request(g.path)
	req.Reserve, req.Wait, req.Ticket = reserve, max(wait, 0), j.ticket
	d, err := g.lim.Do(cctx, req)
	if err == nil || cctx.Err() == nil {
		return d, err
	}
	return throttle.Decision{}, fmt.Errorf("admit job %s of tenant %q: no answer within %s: %w", j.id, j.tenant, time.Since(start).Round(time.Millisecond), cctx.Err())
}

// Admission describes how the gate admitted the job a handler runs; get it
// with AdmissionFrom.
type Admission struct {
	// Tenant is the tenant the job was admitted for; "" when it follows
	// @global only (a tenant header that could not be used included).
	Tenant string
	// ID is the job's identity, which holds its reservation and slots.
	ID string
	// Cost is what the job weighed on its rules.
	Cost int64
	// Decision is the limiter's decision; its Now is the Redis time of
	// the admission. Zero when FailOpen.
	Decision throttle.Decision
	// Waited is how long this delivery of the job waited in the worker.
	Waited time.Duration
	// FailOpen reports that Redis could not be reached and the job's
	// policy let it run unthrottled.
	FailOpen bool
}

type admissionKey struct{}

// AdmissionFrom returns how the gate admitted the job whose handler got
// ctx; false outside the gate.
func AdmissionFrom(ctx context.Context) (Admission, bool) {
	a, ok := ctx.Value(admissionKey{}).(*Admission)
	if !ok {
		return Admission{}, false
	}
	return *a, true
}

// canWait reports whether the job's own deadline leaves room to wait d and
// still run.
func (g *Gate) canWait(ctx context.Context, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > d+time.Second
}

// sleep waits d; it returns false when the wait was cut short by the
// job's context or by Stop.
// timerLate is how late the runtime's timers may wake a goroutine in a
// process with nothing else to do: about a millisecond (see wakeAt).
const timerLate = 1500 * time.Microsecond

// sleepUntil waits for a job's slot, d from now, on time: by a timer up to
// timerLate before it, then to the slot on the thread (wakeAt). A ticket's
// window after its slot is the tolerance, 2 ms, which a timer's
// millisecond alone would use up half of. False when ctx ends or the
// worker stops first.
func (g *Gate) sleepUntil(ctx context.Context, d time.Duration) bool {
	end := time.Now().Add(d)
	if d > timerLate && !g.sleep(ctx, d-timerLate) {
		return false
	}
	if left := time.Until(end); left > 0 {
		wakeAt(left)
	}
	return true
}

func (g *Gate) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-g.stopping:
		return false
	}
}

// retryAt is when asynq should bring back a job that may start after d:
// a reserved slot is aimed at with the lead, on asynq's whole-second grid.
func (g *Gate) retryAt(d time.Duration, reserved bool) time.Time {
	at := time.Now().Add(d)
	if reserved {
		return taskspec.ScheduleFor(at, g.cfg.Lead)
	}
	return at
}

// handBack defers a job whose wait was cut short by shutdown or by its
// context, to when it may start (left from now); a reservation it holds
// is kept for it.
func (g *Gate) handBack(ctx context.Context, j *job, left time.Duration, reserved bool, start time.Time) error {
	g.m.wait.Observe(time.Since(start).Seconds())
	left = max(0, left)
	return g.deferJob(ctx, j, &DeferError{Reason: ReasonShutdown, RetryAfter: left, At: g.retryAt(left, reserved)})
}

// deferJob hands the job back to asynq until e.At; a job at its retry limit
// goes on as a copy (see copyJob).
func (g *Gate) deferJob(ctx context.Context, j *job, e *DeferError) error {
	e.Tenant = j.tenant
	g.m.deferral(j.tenant, e.Reason)
	if j.retried >= j.maxRetry {
		return g.copyJob(ctx, j, e)
	}
	return e
}

// drop archives a denied job whose policy says overflow=drop.
func (g *Gate) drop(ctx context.Context, j *job, d throttle.Decision) error {
	g.m.drop(j.tenant)
	return &DropError{Tenant: j.tenant, Rule: d.Rule, Policy: d.Policy, RetryAfter: d.RetryAfter}
}

// gateError handles a failed admission. A cost no rule can admit, or a
// stored policy that cannot be read, is a configuration problem: the job is
// deferred with backoff (a policy change fixes it) and it is logged.
// Anything else means Redis could not be used: the job runs unthrottled
// only when its policy (as last cached) says fail_open=true.
func (g *Gate) gateError(ctx context.Context, j *job, err error, next asynq.Handler, start time.Time) error {
	var ce *throttle.CostError
	if errors.As(err, &ce) {
		g.m.err(errCost)
		g.log.Error("job cost exceeds policy; deferred until it changes", "task", j.taskID, "tenant", j.tenant, "err", err)
		delay := g.cfg.BackoffMax/2 + rand.N(g.cfg.BackoffMax/2+1)
		return g.deferJob(ctx, j, &DeferError{Reason: ReasonCost, RetryAfter: delay, At: time.Now().Add(delay), Err: err})
	}
	if ctx.Err() != nil {
		return g.handBack(ctx, j, 0, false, start)
	}
	var spe *throttle.StoredPolicyError
	if errors.As(err, &spe) {
		// Redis answers, but a stored policy is not valid. Like a cost no
		// rule admits, it takes a policy change to fix.
		g.m.err(errPolicy)
		delay := g.cfg.BackoffMax/2 + rand.N(g.cfg.BackoffMax/2+1)
		g.warn(errPolicy, "policy unreadable; job deferred", "task", j.taskID, "tenant", j.tenant, "retry_in", delay, "err", err)
		return g.deferJob(ctx, j, &DeferError{Reason: ReasonPolicy, RetryAfter: delay, At: time.Now().Add(delay), Err: err})
	}
	g.m.err(errRedis)
	// the job's policies as last cached: unknown when even they could not
	// be read (fail closed)
	var pol *throttle.Policy
	if j.policies != nil {
		pol = j.policies.Policy
		if j.tenant == "" {
			pol = j.policies.Global
		}
	}
	if pol != nil && pol.FailOpen {
		g.m.decision(j.tenant, verdictFailOpen, "", "")
		g.warn(errRedis, "Redis unreachable; job runs unthrottled (fail_open)", "task", j.taskID, "tenant", j.tenant, "err", err)
		return g.run(ctx, j, &Admission{Tenant: j.tenant, ID: j.id, Cost: j.cost, FailOpen: true, Waited: time.Since(start)}, next)
	}
	delay := g.backoff()
	g.warn(errRedis, "Redis unreachable; job deferred", "task", j.taskID, "tenant", j.tenant, "retry_in", delay, "err", err)
	return g.deferJob(ctx, j, &DeferError{Reason: ReasonUnavailable, RetryAfter: delay, At: time.Now().Add(delay), Err: err})
}

// backoff is the delay of a job the gate could not decide: twice the time
// since Redis errors began, between BackoffMin and BackoffMax, jittered
// down by up to half so the fleet's jobs do not come back together. A job
// deferred again and again during an outage so waits about twice as long
// each time.
func (g *Gate) backoff() time.Duration {
	now := time.Now().UnixNano()
	g.outage.CompareAndSwap(0, now)
	d := min(max(2*time.Duration(now-g.outage.Load()), g.cfg.BackoffMin), g.cfg.BackoffMax)
	return d/2 + rand.N(d/2+1)
}

// run calls the handler of an admitted job, renewing its lease while it
// runs, and releases what the job holds when it returns or panics.
func (g *Gate) run(ctx context.Context, j *job, a *Admission, next asynq.Handler) (err error) {
	lease := a.Decision.Lease
	ctx = context.WithValue(context.WithValue(ctx, admissionKey{}, a), gateKey{}, g)
	settled := &settlement{}
	ctx = context.WithValue(ctx, settleKey{}, settled)
	gauge := g.m.running(j.tenant)
	gauge.Inc()
	defer gauge.Dec()
	var stopRenew func()
	if lease > 0 {
		stopRenew = g.renew(j, lease, a.Decision.Claim)
	}
	if j.policies != nil && j.policies.Shadow != nil {
		// the start, decided by the tenant's shadow policy in the
		// background; nothing waits for it
		defer g.path.Shadow(g.path.With(throttle.Request{Tenant: j.tenant, ID: j.id, Cost: j.cost}, j.policies), a.Decision.Now, g.shadowCounted(j.tenant))()
	}
	returned := false
	var herr error
	defer func() {
		if stopRenew != nil {
			stopRenew()
		}
		if !returned {
			// The handler panicked; asynq recovers it and retries or archives.
			g.m.outcome(j.tenant, outcomePanic)
		}
		// settled before the slot is handed on: the next job is decided on
		// the settled meters
		g.settle(ctx, j, a, settled, !returned || herr != nil)
		g.releaseSoon(ctx, j, a.Decision.Claim)
	}()
	began := time.Now()
	herr = next.ProcessTask(ctx, j.task)
	returned = true
	g.down.record(g, j, herr, time.Since(began))
	return g.after(ctx, j, herr)
}

// shadowCounted counts a shadow decision of a job of tenant.
func (g *Gate) shadowCounted(tenant string) func(throttle.Decision, error) {
	return func(d throttle.Decision, err error) {
		switch {
		case err != nil:
			g.m.err(errShadow)
			g.warn(errShadow, "shadow decision failed; start not counted", "tenant", tenant, "err", err)
		case d.Allowed:
			g.m.shadows.WithLabelValues(tenant, verdictAllowed, "").Inc()
		default:
			g.m.shadows.WithLabelValues(tenant, verdictDenied, d.Rule).Inc()
		}
	}
}

// after classifies the handler's result: the error to give asynq.
func (g *Gate) after(ctx context.Context, j *job, err error) error {
	var ra *RetryAfterError
	switch {
	case err == nil:
		g.m.outcome(j.tenant, outcomeSuccess)
		return nil
	case errors.As(err, &ra):
		g.m.outcome(j.tenant, outcomeCooldown)
		d := max(ra.Delay, time.Millisecond)
		scope := j.tenant
		if scope == "" {
			scope = throttle.GlobalPolicy
		}
		if ra.guessed && j.adapts() {
			// the downstream named no delay: the adaptive rule's cut
			// answers it, not a pause of the whole tenant
			return g.deferJob(ctx, j, &DeferError{Reason: ReasonCooldown, RetryAfter: d, At: time.Now().Add(d), Err: err})
		}
		// The pause starts before the slot is released, so no other job of
		// the tenant starts in between.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
		if g.blocks != nil {
			g.blocks.Retire(scope)
		}
		_, cerr := g.lim.Cooldown(cctx, scope, d)
		cancel()
		if cerr != nil {
			g.m.err(errCooldown)
			g.warn(errCooldown, "cannot pause tenant", "tenant", scope, "err", cerr)
		}
		return g.deferJob(ctx, j, &DeferError{Reason: ReasonCooldown, RetryAfter: d, At: time.Now().Add(d), Err: err})
	case errors.Is(err, asynq.SkipRetry):
		g.m.outcome(j.tenant, outcomeSkip)
		return err
	case errors.Is(err, asynq.RevokeTask):
		g.m.outcome(j.tenant, outcomeRevoke)
		return err
	default:
		g.m.outcome(j.tenant, outcomeError)
		return err
	}
}

// releaseSoon releases the job's slots (release) after its handler
// returned, without holding asynq's slot for it: the releases of the
// gate's jobs that end while one round of them is on its way go together
// in the next (waitroom.Room.ReleaseAll), their small releases in one
// script run, and those of tenants far from their caps wait a little for
// company first (lingers). The job counts as inside the gate (Wait) until
// its slots are back. A job of no tenant, and any job while the gate
// stops or the room is off, releases at once.
func (g *Gate) releaseSoon(ctx context.Context, j *job, claim uint64) {
	if claim == 0 {
		return
	}
	if j.tenant == "" || g.stopped() || g.roomOff.Load() {
		g.release(ctx, j, claim)
		return
	}
	g.active.add()
	g.rel.mu.Lock()
	if g.lingers(j) && len(g.rel.later) < int(g.blockSlots.Load()) {
		// far from its cap: it waits a little for company
		g.rel.later = append(g.rel.later, pendingRelease{j: j, claim: claim})
		if g.rel.timer == nil {
			g.rel.timer = time.AfterFunc(g.linger, g.releaseLingering)
		}
		g.rel.mu.Unlock()
		return
	}
	g.rel.q = append(g.rel.q, pendingRelease{j: j, claim: claim})
	g.flushLocked()
}

// flushLocked starts the goroutine that sends the releases on their way
// unless it runs; g.rel.mu is held, and unlocked on return.
func (g *Gate) flushLocked() {
	if g.rel.flushing {
		g.rel.mu.Unlock()
		return
	}
	g.rel.flushing = true
	g.rel.mu.Unlock()
	go g.flushReleases()
}

// releaseLinger is how long the release of a job of a tenant far from its
// concurrency cap (lingers) waits for other jobs' to go with it: a
// release is a round trip of its own per job otherwise, in a busy fleet.
const releaseLinger = 20 * time.Millisecond

// lingerCapacities is how many times the fleet's slots a tenant's
// concurrency limit (and @global's, when it has one) must be for its
// releases to linger. A tenant's slots in a queue are held by its jobs
// running (at most the fleet's slots), those in asynq's pending list (the
// waiting room keeps it at most the fleet's slots), its blocks (at most a
// process's concurrency per process) and its lingering releases (as
// many): together at most four times the fleet's slots, so there the slots
// a linger holds back cannot make the cap bind.
const lingerCapacities = 4

// lingers reports whether the release of j may wait releaseLinger for
// company: its tenant and @global are far from their concurrency caps
// (lingerCapacities), as far as the fleet's capacity known to the pump
// tells (0 while unknown: no linger). A job with a key or pools releases
// at once. Holding a slot a little longer never lets a cap be exceeded;
// a crash loses a lingering release, whose slot frees itself when its
// lease ends, as a crashed job's does.
func (g *Gate) lingers(j *job) bool {
	if j.key != "" || len(j.pools) > 0 || j.policies == nil {
		return false
	}
	capacity := int64(g.gauge.Known(j.queue))
	if capacity <= 0 {
		return false
	}
	far := func(p *throttle.Policy) bool {
		return p == nil || p.Concurrency == nil || p.Concurrency.Limit >= lingerCapacities*capacity
	}
	return j.policies.Policy != nil && j.policies.Policy.Concurrency != nil && far(j.policies.Policy) && far(j.policies.Global)
}

// releaseLingering sends the lingering releases on their way (the
// linger's timer, and Stop).
func (g *Gate) releaseLingering() {
	g.rel.mu.Lock()
	if g.rel.timer != nil {
		g.rel.timer.Stop()
		g.rel.timer = nil
	}
	if len(g.rel.later) == 0 {
		g.rel.mu.Unlock()
		return
	}
	g.rel.q = append(g.rel.q, g.rel.later...)
	g.rel.later = nil
	g.flushLocked()
}

// releases are the gate's releases on their way (releaseSoon).
type releases struct {
	mu       sync.Mutex
	q        []pendingRelease
	flushing bool // a goroutine sends them; it ends when none is left
	// later are the releases that linger (lingers) until timer fires
	later []pendingRelease
	timer *time.Timer
}

type pendingRelease struct {
	j     *job
	claim uint64
}

// flushReleases sends the waiting releases, round after round, until none
// is left.
func (g *Gate) flushReleases() {
	for {
		g.rel.mu.Lock()
		batch := g.rel.q
		g.rel.q = nil
		if len(batch) == 0 {
			g.rel.flushing = false
			g.rel.mu.Unlock()
			return
		}
		g.rel.mu.Unlock()
		jobs := make([]waitroom.Releasing, len(batch))
		for i, p := range batch {
			jobs[i] = waitroom.Releasing{Tenant: p.j.tenant, Queue: p.j.queue, ID: p.j.id, Claim: p.claim, Scopes: p.j.scopes()}
		}
		// a gate that stops hands nothing on: the fleet's pumps serve the
		// lines
		h := waitroom.Handover(g.handOn)
		if g.stopped() || g.roomOff.Load() {
			h = nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.CallTimeout)
		errs := g.room.ReleaseAll(ctx, jobs, h, g.gauge.Spare)
		cancel()
		for i, err := range errs {
			g.released(batch[i].j, err)
			g.active.done()
		}
	}
}

// released counts how a job's release went.
func (g *Gate) released(j *job, err error) {
	if errors.Is(err, throttle.ErrClaimLost) {
		g.m.renewals.WithLabelValues(renewLost).Inc()
		return
	}
	if err != nil {
		g.m.err(errRelease)
		g.warn(errRelease, "cannot release slot; it frees at lease end", "task", j.taskID, "tenant", j.tenant, "err", err)
	}
}

// release gives back the concurrency slots the job holds under claim (0:
// none, and no round trip) and, in the same script run, hands the freed
// slot to the next job in its tenant's line, which goes to asynq at once;
// a worker shutting down hands nothing on: it releases its slots, and the
// fleet's pumps serve the line. A slot that passed to another admission of
// the job (its lease ran out first) is left to that admission.
func (g *Gate) release(ctx context.Context, j *job, claim uint64) {
	if claim == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
	defer cancel()
	var err error
	if j.tenant == "" && len(j.pools) == 0 {
		err = g.lim.Release(cctx, j.tenant, j.id, claim)
	} else if j.tenant == "" || g.stopped() || g.roomOff.Load() {
		err = g.room.Release(cctx, j.tenant, j.queue, j.id, claim, j.scopes(), nil, nil)
	} else {
		err = g.room.Release(cctx, j.tenant, j.queue, j.id, claim, j.scopes(), g.handOn, g.gauge.Spare)
	}
	g.released(j, err)
}

// logMsg is a log message that passes through a helper: only a constant
// converts to it implicitly, and internal/logstyle's test holds every
// explicit conversion to a constant too.
type logMsg string

// warn logs at most once a second per kind, so that a stream of bad jobs
// or a Redis outage does not flood the log; the metrics count every one.
func (g *Gate) warn(kind string, msg logMsg, args ...any) {
	if g.logLimit.allow(kind) {
		g.log.Warn(string(msg), args...)
	}
}

type logLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *logLimiter) allow(kind string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.last[kind]) < time.Second {
		return false
	}
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	l.last[kind] = now
	return true
}

// tracker counts the jobs inside the gate.
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{}
}

func (t *tracker) add() {
	t.mu.Lock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.idle)
	}
	t.mu.Unlock()
}

func (t *tracker) wait(ctx context.Context) error {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return nil
	}
	idle := t.idle
	t.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
