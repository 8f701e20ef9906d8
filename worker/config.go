package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// Defaults of GateConfig and Config.
const (
	// InProcessWaitDefault is how long a denied job may wait in the worker
	// for its slot before it is handed back to asynq. It covers the lead
	// plus the second by which asynq's whole-second schedule may bring a
	// deferred job back early.
	InProcessWaitDefault = 1500 * time.Millisecond
	// LeadDefault is taskspec.LeadDefault: how long before its slot a deferred
	// job is due in asynq, at the least.
	LeadDefault = taskspec.LeadDefault
	// BackoffMinDefault and BackoffMaxDefault bound the delay of jobs
	// deferred because the gate could not decide (Redis unreachable).
	BackoffMinDefault = time.Second
	BackoffMaxDefault = 30 * time.Second
	// CallTimeoutDefault bounds each of the gate's calls to Redis.
	CallTimeoutDefault = 5 * time.Second
	// ShutdownWaitDefault bounds how long Shutdown waits, after asynq has
	// stopped, for handlers still running to return and release their slots.
	ShutdownWaitDefault = 10 * time.Second

	// ConcurrencyDefault is the asynq Concurrency of a Server. Jobs waiting
	// in-process for their slot hold an asynq worker goroutine, so a worker
	// needs room for the jobs that run at once plus, for each throttled
	// tenant, about its rate × InProcessWait (100/s × 1.5 s = 150).
	ConcurrencyDefault = 100
	// DelayedTaskCheckIntervalDefault is how often due scheduled and
	// deferred jobs move to the pending list (asynq's own default, 5 s,
	// would bring deferred jobs back seconds late); it is below the lead.
	// In a fleet of Servers one process does it for the fleet (the holder
	// of the recoverer's lock), and each Server's own asynq forwarder keeps
	// asynq's default unless Asynq.DelayedTaskCheckInterval says otherwise,
	// so that idle workers cost Redis what stock asynq servers do. An asynq
	// server set up with Configure gets it as its DelayedTaskCheckInterval.
	DelayedTaskCheckIntervalDefault = 200 * time.Millisecond
	// TaskCheckIntervalDefault is about how long an idle asynq worker
	// sleeps between polls (asynq sleeps half to one and a half times it;
	// asynq's default is 1 s). It bounds how long a job handed to an idle
	// queue waits for a worker: a straight or promoted job, or the job a
	// finished one handed its concurrency slot to. Measured (BenchmarkIdle,
	// BenchmarkWake; BENCHMARKS.md): enqueue to handler p50/p99 6.8/15.5 ms
	// at 10 ms, 37/59 ms at 50 ms, 55/147 ms at 100 ms; an idle worker of
	// a fleet of 32 then makes Redis process about 283, 61 and 32 commands
	// a second (a stock asynq server: 280, 60, 30). A fleet of more than a
	// few hundred workers raises it to 50–100 ms.
	TaskCheckIntervalDefault = 10 * time.Millisecond
)

// TenantFunc returns the tenant of a task; "" means the job follows
// @global only.
type TenantFunc func(ctx context.Context, task *asynq.Task) string

// GateConfig configures a Gate. The zero value is ready to use.
type GateConfig struct {
	// TenantFunc, when set, replaces the tenant header (taskspec.TenantHeader).
	TenantFunc TenantFunc
	// InProcessWait is how long a denied job may wait in the worker for
	// its slot, in all, before it is deferred (overflow=defer) or dropped
	// (overflow=drop); overflow=wait waits up to the larger of this and
	// the policy's max_wait. It must be at least Lead + 1s, or jobs that
	// asynq's whole-second schedule brings back early would be deferred
	// again. InProcessWaitDefault when zero.
	InProcessWait time.Duration
	// Lead is how long before its slot a deferred job is due in asynq at
	// the least; it must exceed asynq's DelayedTaskCheckInterval. (The
	// waiting room's own lead, for jobs leaving their lines, is the
	// limiter's throttle.Config.PromoteLead.) LeadDefault when zero.
	Lead time.Duration
	// BackoffMin and BackoffMax bound the delay of jobs deferred because
	// the gate could not reach Redis: twice the time since the errors
	// began, jittered, so a job deferred again and again waits about twice
	// as long each time. A job whose cost no rule can admit is deferred by
	// about BackoffMax. BackoffMinDefault and BackoffMaxDefault when zero.
	BackoffMin, BackoffMax time.Duration
	// CallTimeout bounds each call to Redis. CallTimeoutDefault when zero.
	CallTimeout time.Duration
	// Logger receives the gate's logs; slog.Default() when nil.
	Logger *slog.Logger
	// Registerer receives the gate's metrics; a private registry (see
	// Gate.Gatherer) when nil.
	Registerer prometheus.Registerer
	// TenantLabels adds a tenant label to the per-job metrics. Off by
	// default: every tenant becomes a time series.
	TenantLabels bool
	// RefundFailed settles a job whose handler fails (returns an error or
	// panics) without reporting its cost (SettleCost) to 0: its charges are
	// given back, as for a call the downstream never counted. Off by
	// default: a failed call that the downstream did count keeps its
	// estimate.
	RefundFailed bool
	// NoBlocks decides every job one by one. By default a tenant far from
	// its limits (rate and concurrency rules, half its burst and half its
	// concurrency free) is served from blocks: the process takes many of
	// its starts and slots in one call and starts its jobs from them with
	// no call of their own (docs/operations.md says what a block can cost
	// when a limit is lowered or a process dies). A block's unused slots
	// count as in flight in the tenant's stats.
	NoBlocks bool
}

func (c GateConfig) withDefaults() GateConfig {
	c.InProcessWait = cmp.Or(c.InProcessWait, InProcessWaitDefault)
	c.Lead = cmp.Or(c.Lead, LeadDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, BackoffMaxDefault)
	c.CallTimeout = cmp.Or(c.CallTimeout, CallTimeoutDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c GateConfig) validate() error {
	switch {
	case c.Lead <= 0 || c.Lead > time.Minute:
		return fmt.Errorf("worker config: Lead %s: must be between 1ns and 1m", c.Lead)
	case c.InProcessWait < c.Lead+time.Second:
		return fmt.Errorf("worker config: InProcessWait %s: must be at least Lead + 1s (%s): asynq schedules in whole seconds, so deferred jobs come back up to Lead + 1s early", c.InProcessWait, c.Lead+time.Second)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("worker config: backoff %s..%s: BackoffMin must be positive and at most BackoffMax", c.BackoffMin, c.BackoffMax)
	case c.CallTimeout < 10*time.Millisecond:
		return fmt.Errorf("worker config: CallTimeout %s: must be at least 10ms", c.CallTimeout)
	}
	return nil
}

// Config configures a Server. The zero value is ready to use.
type Config struct {
	// Asynq configures the asynq server. Concurrency and
	// TaskCheckInterval get sluice's defaults when zero;
	// DelayedTaskCheckInterval keeps asynq's (5 s), since one process of
	// the fleet moves due deferred jobs back every
	// DelayedTaskCheckIntervalDefault for all of them; IsFailure,
	// RetryDelayFunc and ErrorHandler are wrapped (see Gate.Configure), so
	// set your own there as usual.
	Asynq asynq.Config
	// Gate configures the gate every job passes.
	Gate GateConfig
	// Limiter makes the decisions. When nil, New makes one over the client
	// with Prefix, and Shutdown closes it.
	Limiter *throttle.Limiter
	// Prefix of sluice's keys for the limiter New makes; give it or Limiter.
	Prefix string
	// AsynqRedis is the Redis client of asynq's queues when they live apart
	// from sluice's keys; nil means the client given to New.
	AsynqRedis redis.UniversalClient
	// ShutdownWait bounds how long Shutdown waits for handlers that outlive
	// asynq's ShutdownTimeout to return. ShutdownWaitDefault when zero.
	ShutdownWait time.Duration
	// RecoverLease is how long this worker process may go without renewing
	// its registration in the fleet's registry (it renews it every
	// RecoverLease/3) before the fleet takes it for dead and gives the
	// asynq tasks it was running back to their queues, to run again at
	// once (see "Worker crashes" in docs/operations.md). What it trades: a
	// shorter lease finds a dead worker sooner, but a worker paused longer
	// than it (a long GC pause, a frozen VM, Redis unreachable from it)
	// has its jobs run a second time, and beats cost Redis more
	// (one script per process per RecoverLease/3). Between 1s and 10m;
	// RecoverLeaseDefault (15 s) when zero. asynq's own recoverer, which
	// takes 1–2 minutes, remains the fallback.
	RecoverLease time.Duration
	// RetryUnknownTypes makes asynq retry, as it does by default, a job
	// of a type no handler of the server is registered for: for fleets
	// whose workers share a queue but handle different types. Otherwise
	// such a job (a typo in its type, most likely) is archived at once with
	// a NoHandlerError naming the type. Either way its type is logged once
	// and counted (sluice_worker_unknown_types_total).
	RetryUnknownTypes bool
	// Admin is the HOST:PORT at which the rest of the fleet reaches this
	// process's metrics (its /metrics), recorded with its registration so
	// that sluice dashboard finds every worker without being told their
	// addresses; "" records none.
	Admin string
}

func (c Config) withDefaults() Config {
	c.Asynq.Concurrency = cmp.Or(c.Asynq.Concurrency, ConcurrencyDefault)
	c.Asynq.TaskCheckInterval = cmp.Or(c.Asynq.TaskCheckInterval, TaskCheckIntervalDefault)
	c.ShutdownWait = cmp.Or(c.ShutdownWait, ShutdownWaitDefault)
	c.RecoverLease = cmp.Or(c.RecoverLease, RecoverLeaseDefault)
	c.Gate = c.Gate.withDefaults()
	return c
}

func (c Config) validate() error {
	if err := c.Gate.validate(); err != nil {
		return err
	}
	switch {
	case c.Limiter != nil && c.Prefix != "":
		return fmt.Errorf("worker config: Prefix %q is given with a Limiter, which has its own prefix; give one or the other", c.Prefix)
	case c.Asynq.Concurrency < 1:
		return fmt.Errorf("worker config: Asynq.Concurrency %d: must be at least 1", c.Asynq.Concurrency)
	case c.Asynq.DelayedTaskCheckInterval != 0 && c.Asynq.DelayedTaskCheckInterval >= c.Gate.Lead:
		return fmt.Errorf("worker config: Asynq.DelayedTaskCheckInterval %s must be below Gate.Lead %s, or deferred jobs come back after their slot", c.Asynq.DelayedTaskCheckInterval, c.Gate.Lead)
	case c.Gate.Lead <= DelayedTaskCheckIntervalDefault:
		return fmt.Errorf("worker config: Gate.Lead %s must exceed %s, how often the fleet moves due deferred jobs back (DelayedTaskCheckIntervalDefault), or they come back after their slot", c.Gate.Lead, DelayedTaskCheckIntervalDefault)
	case c.RecoverLease < time.Second || c.RecoverLease > 10*time.Minute:
		return fmt.Errorf("worker config: RecoverLease %s: must be between 1s and 10m (a shorter lease finds a dead worker sooner; a worker paused longer than it has its jobs run twice)", c.RecoverLease)
	case c.ShutdownWait < 0:
		return fmt.Errorf("worker config: ShutdownWait %s must not be negative", c.ShutdownWait)
	}
	if c.Admin != "" {
		host, _, err := net.SplitHostPort(c.Admin)
		if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
			return fmt.Errorf("worker config: Admin %q: want the HOST:PORT at which other machines reach this worker's metrics, such as 10.0.3.7:9464 (not an unspecified address such as 0.0.0.0)", c.Admin)
		}
	}
	return nil
}
