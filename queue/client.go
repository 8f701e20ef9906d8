package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/waitroom"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/asynqroom"
	"github.com/sluicehq/sluice/internal/crashpoint"
	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// Defaults of Config.
const (
	BatchConcurrencyDefault = 16
	// CleanupTimeoutDefault bounds the clean-up after a failed enqueue
	// (giving back a slot a job took, or taking a parked task out of asynq
	// again), which runs even when the caller's context has ended.
	CleanupTimeoutDefault = 5 * time.Second
	// FallbackDefault is how long a job waiting in its tenant's line stays
	// parked in asynq's schedule, at the least, before asynq itself brings
	// it to a worker should no sluice process promote it.
	FallbackDefault = time.Hour
)

// Config configures a Client. The zero value is ready to use.
type Config struct {
	// Limiter makes the waiting room's decisions. When nil, New makes one
	// over the client with Prefix, and Close closes it.
	Limiter *throttle.Limiter
	// Prefix of sluice's keys for the limiter New makes; the limiter's own
	// prefix applies when Limiter is set, so give one or the other.
	Prefix string
	// AsynqRedis is the Redis client of asynq's queues when they live apart from
	// sluice's keys; nil means the client given to New.
	AsynqRedis redis.UniversalClient
	// Fallback is how long a waiting job stays parked in asynq's schedule
	// at the least (longer when its line is long: twice the time its line
	// needs at its tenant's rate). Workers promote it as soon as it may
	// start; the fallback only matters when none does. FallbackDefault
	// when zero.
	Fallback time.Duration
	// BatchConcurrency is how many jobs EnqueueBatch sends at once;
	// BatchConcurrencyDefault when zero.
	BatchConcurrency int
}

func (c Config) withDefaults() Config {
	c.Fallback = cmp.Or(c.Fallback, FallbackDefault)
	c.BatchConcurrency = cmp.Or(c.BatchConcurrency, BatchConcurrencyDefault)
	return c
}

func (c Config) validate() error {
	switch {
	case c.Limiter != nil && c.Prefix != "":
		return fmt.Errorf("queue config: Prefix %q is given with a Limiter, which has its own prefix; give one or the other", c.Prefix)
	case c.Fallback < time.Second:
		return fmt.Errorf("queue config: Fallback %s: must be at least 1s (asynq schedules in whole seconds)", c.Fallback)
	case c.BatchConcurrency < 1 || c.BatchConcurrency > 1024:
		return fmt.Errorf("queue config: BatchConcurrency %d: must be between 1 and 1024", c.BatchConcurrency)
	}
	return nil
}

// Client enqueues jobs for tenants: it wraps an asynq.Client and sets the
// tenant and cost headers the workers' gate reads, and it brings every job
// to the waiting room (waitroom.Room). A job its tenant may start now, when
// the fleet has room for it, goes straight to asynq's pending list, having
// taken its slot; any other waits in its tenant's line in Redis, parked in
// asynq's schedule, until a worker promotes it: at its slot, or when a
// concurrency slot frees. A tenant's burst so never stands in asynq's
// pending list in front of other tenants' jobs, and a policy change reaches
// the jobs still waiting.
//
// A Client is safe for concurrent use. Close it when done.
type Client struct {
	cfg        Config
	lim        *throttle.Limiter
	ownLimiter bool
	room       waitroom.Room
	path       engine
	gauge      *asynqroom.Gauge
	asynq      *asynq.Client
	asynqRedis redis.UniversalClient
	inspector  *asynq.Inspector
	layout     *asynqroom.Layout
	layoutLog  sync.Once
	lines      lineMemory
}

// New returns a client over the caller's Redis client, which holds sluice's
// keys and, unless Config.AsynqRedis says otherwise, asynq's queues. The client
// is not closed by Close.
func New(client redis.UniversalClient, cfg *Config) (*Client, error) {
	if client == nil {
		return nil, errors.New("queue: New needs a Redis client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	q := &Client{cfg: c, lim: c.Limiter}
	if q.lim == nil {
		lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: c.Prefix})
		if err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		q.lim, q.ownLimiter = lim, true
	}
	q.room = waitroom.Of(q.lim)
	q.path = jobpath.Of(q.lim).(engine)
	ac := c.AsynqRedis
	if ac == nil {
		ac = client
	}
	q.asynq, q.asynqRedis = asynq.NewClientFromRedisClient(ac), ac
	q.inspector = asynq.NewInspectorFromRedisClient(ac)
	q.gauge = asynqroom.NewGauge(ac)
	q.layout = asynqroom.NewLayout(ac)
	return q, nil
}

// Limiter returns the limiter the client uses.
func (c *Client) Limiter() *throttle.Limiter { return c.lim }

// Close releases what New made (the limiter, unless it was given). It does
// not close the Redis clients.
func (c *Client) Close() error {
	if c.ownLimiter {
		return c.lim.Close()
	}
	return nil
}

// policies are a job's policies, resolved once (engine.Resolve):
// everything the job meets on its way in follows them.
type policies = jobpath.Policies[throttle.Policy, throttle.LearnedLimit, throttle.AdaptiveLimit]

// engine is the limiter's calls beyond throttle's public API
// (jobpath.Of).
type engine = jobpath.Engine[throttle.Request, throttle.Decision, *policies]

// job is one job checked and ready to send.
type job struct {
	tenant   string
	typ      string
	payload  []byte
	headers  map[string]string
	opts     options
	id       string
	policies *policies // resolved once per job
	arrived  waitroom.Arrived
	skipRoom bool // the room is off (see Client.roomOn)
}

// Enqueue enqueues task for tenant. opts are asynq's options (Queue,
// MaxRetry, TaskID, ProcessAt, ProcessIn, Timeout, Deadline, Retention,
// Unique), Cost and Priority. Options given to asynq.NewTask are not carried: asynq
// keeps them private and Client builds a new task to add its headers, so
// they are lost (a MaxRetry(0) given there leaves asynq's default of 25).
// Pass them here instead.
//
// A job that may start now goes to asynq's pending list (TaskInfo.State
// pending); any other waits in its tenant's line and shows in asynq as
// scheduled, at its fallback time (Config.Fallback): a worker promotes it
// when it may start. A job of a tenant whose line this client put a job
// in within the last 50 ms waits too (behind the jobs it finds there, or,
// should the line have emptied, for the next turn of its tenant, due at
// once). A job given ProcessAt or ProcessIn is scheduled by asynq as
// asked and passes the workers' gate when it is due.
//
// It returns an *InvalidError (ErrInvalid) for bad input and a
// *throttle.CostError for a cost the tenant's policy can never admit, both
// before anything is written; a *throttle.BacklogError (ErrBacklogFull) when
// the tenant's line holds its policy's backlog=K jobs; and asynq's errors
// (asynq.ErrTaskIDConflict, asynq.ErrDuplicateTask) wrapped with the
// task's type and tenant.
func (c *Client) Enqueue(ctx context.Context, tenant string, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	j, err := c.prepare(tenant, task, opts, time.Now())
	if err != nil {
		return nil, err
	}
	if err := c.resolve(ctx, j); err != nil {
		return nil, err
	}
	j.skipRoom = !c.roomOn(ctx)
	if j.later() {
		return c.sendLater(ctx, j)
	}
	mayGo := c.gauge.Take(ctx, j.opts.queue)
	if !mayGo || c.lines.waiting(j.tenant, j.opts.queue) {
		// it waits in its line whatever its rules say: no decision
		if info, ok, err := c.parkAtOnce(ctx, j, false); ok {
			return info, err
		}
	}
	if err := c.arrive(ctx, j, mayGo); err != nil {
		return nil, err
	}
	if j.arrived.Straight {
		return c.sendStraight(ctx, j)
	}
	if info, ok, err := c.parkAtOnce(ctx, j, true); ok {
		return info, err
	}
	info, err := c.park(ctx, j)
	if err != nil {
		return nil, err
	}
	crashpoint.Hit("queue.parked")
	joined, _, err := c.room.JoinArrived(ctx, j.tenant, j.arrived.Backlog, j.waiter())
	if err != nil || joined == 0 {
		return nil, c.unpark(ctx, j, err)
	}
	return info, nil
}

// prepare checks a job and builds its headers; it does no I/O.
func (c *Client) prepare(tenant string, task *asynq.Task, opts []asynq.Option, now time.Time) (*job, error) {
	if err := names.Tenant(tenant); err != nil {
		return nil, &InvalidError{Field: "tenant", Reason: err.Error(), Err: err}
	}
	if task == nil {
		return nil, &InvalidError{Field: "task", Reason: "is nil; make one with asynq.NewTask"}
	}
	if task.Type() == "" {
		return nil, &InvalidError{Field: "task", Reason: "has an empty type; asynq routes tasks to handlers by type"}
	}
	o, err := parseOptions(opts, now)
	if err != nil {
		return nil, err
	}
	headers := maps.Clone(task.Headers())
	if headers == nil {
		headers = map[string]string{}
	}
	// sluice's own headers describe one job's identity; a task built from
	// another job's (a handler fanning out) starts a new job.
	for _, h := range []string{taskspec.IDHeader, taskspec.GenHeader, taskspec.CostHeader, taskspec.DecidedHeader, taskspec.ParkedHeader, taskspec.PriorityHeader, taskspec.PoolsHeader, taskspec.KeyHeader} {
		delete(headers, h)
	}
	headers[taskspec.TenantHeader] = tenant
	if o.cost != 1 {
		headers[taskspec.CostHeader] = strconv.FormatInt(o.cost, 10)
	}
	if o.key != "" {
		headers[taskspec.KeyHeader] = o.key
	}
	if len(o.pools) > 0 {
		headers[taskspec.PoolsHeader] = strings.Join(o.pools, ",")
	}
	if o.priority != taskspec.PriorityNormal {
		headers[taskspec.PriorityHeader] = o.priority.String()
	}
	id := o.taskID
	if id == "" {
		id = uuid.NewString()
		o.pass = append(o.pass, asynq.TaskID(id))
	}
	return &job{tenant: tenant, typ: task.Type(), payload: task.Payload(), headers: headers, opts: o, id: id}, nil
}

// roomOn reports whether jobs may go through the waiting room: the asynq
// this program is built with, and the layout of its keys, are the ones the
// room writes (asynqroom.Layout, checked once, by a probe). When they are
// not, the room is off, said once in the log: every job goes straight to
// asynq and the workers' gate decides on it, as on jobs from asynq's own
// client. A check that could not be made (Redis) is made again with the
// next job; this one skips the room.
func (c *Client) roomOn(ctx context.Context) bool {
	err := c.layout.Check(ctx)
	var le *asynqroom.LayoutError
	if errors.As(err, &le) {
		c.layoutLog.Do(func() { slog.Error("waiting room is off", "err", le) })
	}
	return err == nil
}

// resolve reads the job's policies (from the policy cache): everything the
// job meets on its way in follows these.
func (c *Client) resolve(ctx context.Context, j *job) error {
	r, err := c.path.Resolve(ctx, j.tenant)
	if err != nil {
		return fmt.Errorf("enqueue for tenant %q: %w", j.tenant, err)
	}
	j.policies = r
	return nil
}

// later reports a job that does not wait in the waiting room: one its
// producer scheduled for later (ProcessAt, ProcessIn), which asynq holds
// until then, one that names shared pools (Pools: a tenant's turn in the
// room does not see them, the gate decides over them all at once), one whose policy drops the jobs it cannot start at once
// (overflow=drop: work that is worthless late), and every job while the
// room is off. The gate decides on them.
func (j *job) later() bool {
	if j.skipRoom || j.opts.processAt.After(time.Now()) || len(j.opts.pools) > 0 {
		return true
	}
	p := j.policies.Policy
	return p != nil && p.Overflow == throttle.OverflowDrop
}

// sendLater enqueues a job that does not wait in the waiting room,
// refusing first a cost its policies (its tenant's, @global's, its pools')
// could never admit.
func (c *Client) sendLater(ctx context.Context, j *job) (*asynq.TaskInfo, error) {
	err := c.path.CheckCost(ctx, c.path.With(throttle.Request{Tenant: j.tenant, Cost: j.opts.cost, Pools: j.opts.pools, Key: j.opts.key}, j.policies))
	var ce *throttle.CostError
	if errors.As(err, &ce) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, err)
	}
	return c.enqueue(ctx, j, j.opts.pass)
}

// parkAtOnce parks a job that is to wait in asynq's schedule and puts it
// in its line in one call (waitroom.Room.Park): a job the fleet has no
// room for, or whose tenant's line holds jobs already (the room would
// have it wait either way, undecided), or one that arrived (and its
// rules have it wait: its intent is taken back). It reports false, having
// written nothing, when the job is to take the steps (arrive, park,
// join) instead: asynq's keys are apart from sluice's (a Cluster, or
// another Redis), the task is one asynq's client writes otherwise
// (Unique), or a task of its id exists (the steps say what it is: a
// conflict, or an orphan to join to its line).
func (c *Client) parkAtOnce(ctx context.Context, j *job, arrived bool) (*asynq.TaskInfo, bool, error) {
	j.headers[taskspec.ParkedHeader] = "1"
	t, ok := asynqroom.Compose(j.id, j.opts.queue, j.typ, j.payload, j.headers, j.opts.pass)
	if !ok {
		delete(j.headers, taskspec.ParkedHeader)
		return nil, false, nil
	}
	p, err := c.room.Park(ctx, waitroom.Parking{
		Tenant: j.tenant, Job: j.waiter(), Policies: j.policies,
		Fallback: c.cfg.Fallback, MaxPark: maxFallback, Task: asynqroom.EngineTaskOf(t), Engine: c.asynqRedis,
	})
	if errors.Is(err, waitroom.ErrApart) || (err == nil && p.Conflict) {
		delete(j.headers, taskspec.ParkedHeader)
		return nil, false, nil
	}
	if err != nil {
		var be *throttle.BacklogError
		var ce *throttle.CostError
		if !errors.As(err, &be) && !errors.As(err, &ce) {
			err = fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, err)
		}
		if arrived {
			// the job will not wait: the sweep need not look for it
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeoutDefault)
			defer cancel()
			if ferr := c.room.Forget(cctx, j.tenant, j.waiter()); ferr != nil {
				return nil, true, fmt.Errorf("%w (and dropping its intent failed: %v)", err, ferr)
			}
		}
		return nil, true, err
	}
	c.lines.saw(j.tenant, j.opts.queue)
	crashpoint.Hit("queue.parked-at-once")
	return t.Info(p.At), true, nil
}

// arrive brings the job to the waiting room: straight through (when
// mayGo: the fleet has room for it), or to wait.
func (c *Client) arrive(ctx context.Context, j *job, mayGo bool) error {
	a, err := c.room.Arrive(ctx, waitroom.Arrival{
		Tenant: j.tenant, ID: j.id, Queue: j.opts.queue, Cost: j.opts.cost, Priority: int(j.opts.priority), Key: j.opts.key,
		MayGo: mayGo, Policies: j.policies,
	})
	if err != nil {
		var be *throttle.BacklogError
		var ce *throttle.CostError
		if errors.As(err, &be) && j.opts.taskID != "" {
			// the job given again while it waits (its id is in asynq
			// already): a conflict, as asynq would say, not a full line
			if _, ierr := c.inspector.GetTaskInfo(j.opts.queue, j.id); ierr == nil {
				return fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, asynq.ErrTaskIDConflict)
			}
		}
		if be != nil || errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, err)
	}
	j.arrived = a
	return nil
}

// sendStraight enqueues a job that took its slot; if asynq refuses it, the
// slot is given back.
func (c *Client) sendStraight(ctx context.Context, j *job) (*asynq.TaskInfo, error) {
	crashpoint.Hit("queue.straight")
	if j.arrived.Ticket != "" {
		j.headers[taskspec.DecidedHeader] = j.arrived.Ticket
	}
	info, err := c.enqueue(ctx, j, j.opts.pass)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeoutDefault)
		defer cancel()
		if terr := c.room.TakeBack(cctx, j.arrived); terr != nil {
			return nil, fmt.Errorf("%w (and giving back its slot failed: %v; it frees itself with its lease)", err, terr)
		}
		if info := c.orphan(ctx, j, err); info != nil {
			// a retry of a job parked in no line: it joins its line now
			n, rerr := c.room.Rejoin(ctx, j.tenant, j.waiter())
			if rerr != nil {
				return nil, fmt.Errorf("%w (and joining its parked task to its line failed: %v)", err, rerr)
			}
			if n == 1 {
				return info, nil
			}
		}
		return nil, err
	}
	return info, nil
}

// orphan returns the task asynq refused a job with, err, when it is the
// same job's task parked by an earlier Enqueue (a retry with its task id)
// and the job may be in no line: that Enqueue's producer died, or failed,
// between parking the task and joining the line. Otherwise it returns nil.
func (c *Client) orphan(ctx context.Context, j *job, err error) *asynq.TaskInfo {
	if j.opts.taskID == "" || !errors.Is(err, asynq.ErrTaskIDConflict) || ctx.Err() != nil {
		return nil
	}
	info, ierr := c.inspector.GetTaskInfo(j.opts.queue, j.id)
	if ierr != nil || info.State != asynq.TaskStateScheduled || info.Headers[taskspec.TenantHeader] != j.tenant {
		return nil
	}
	return info
}

// park enqueues a job that is to wait in its line, scheduled at its
// fallback time: asynq holds it until a worker promotes it.
func (c *Client) park(ctx context.Context, j *job) (*asynq.TaskInfo, error) {
	at := time.Now().Add(c.fallback(j))
	opts := append(j.opts.pass[:len(j.opts.pass):len(j.opts.pass)], asynq.ProcessAt(at))
	// the sweep pushes a parked task's fallback further out while its job
	// waits in its line
	j.headers[taskspec.ParkedHeader] = "1"
	info, err := c.enqueue(ctx, j, opts)
	if err == nil {
		return info, nil
	}
	if j.arrived.Earlier {
		// a retry of a job an earlier Enqueue parked: if it joined no
		// line, its intent is there still, and it joins now
		if info := c.orphan(ctx, j, err); info != nil {
			return info, nil
		}
	}
	// the job will not join its line: the sweep need not look for it
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeoutDefault)
	defer cancel()
	if ferr := c.room.Forget(cctx, j.tenant, j.waiter()); ferr != nil {
		return nil, fmt.Errorf("%w (and dropping its intent failed: %v)", err, ferr)
	}
	return nil, err
}

// fallback is how long the job stays parked at the least: Config.Fallback,
// or twice the time its line needs at its tenant's and @global's pace
// (jobpath.Policies.Pace) when that is longer, so that asynq does not bring a long
// line's tail in early.
func (c *Client) fallback(j *job) time.Duration {
	need := j.policies.Pace
	waiting := min(j.arrived.Waiting+1, int64(maxFallback/max(need, time.Nanosecond)))
	return min(max(c.cfg.Fallback, 2*time.Duration(waiting)*need*time.Duration(j.opts.cost)), maxFallback)
}

// maxFallback is the longest a waiting job's task is parked.
const maxFallback = 30 * 24 * time.Hour

// unpark takes out of asynq a parked job that did not join its line (the
// line was full, or Redis failed): its error is err, or the full line's.
func (c *Client) unpark(ctx context.Context, j *job, err error) error {
	if err == nil {
		err = &throttle.BacklogError{Tenant: j.tenant, Backlog: j.arrived.Backlog, Limit: j.arrived.Backlog}
	} else {
		err = fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, err)
	}
	if derr := c.inspector.DeleteTask(j.opts.queue, j.id); derr != nil {
		return fmt.Errorf("%w (and taking its task out of asynq again failed: %v; the pumps' sweep puts it in its line)", err, derr)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeoutDefault)
	defer cancel()
	if ferr := c.room.Forget(cctx, j.tenant, j.waiter()); ferr != nil {
		// harmless: the sweep drops the intent of a task that is gone
		return fmt.Errorf("%w (and dropping its intent failed: %v)", err, ferr)
	}
	return err
}

func (j *job) waiter() waitroom.Waiter {
	return waitroom.Waiter{ID: j.id, Queue: j.opts.queue, Cost: j.opts.cost, Priority: int(j.opts.priority), Key: j.opts.key}
}

// enqueue hands the task to asynq with opts.
func (c *Client) enqueue(ctx context.Context, j *job, opts []asynq.Option) (*asynq.TaskInfo, error) {
	info, err := c.asynq.EnqueueContext(ctx, asynq.NewTaskWithHeaders(j.typ, j.payload, j.headers), opts...)
	if err != nil {
		return nil, fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, err)
	}
	return info, nil
}
