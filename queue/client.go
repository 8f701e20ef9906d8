package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// Defaults of Config.
const (
	BatchConcurrencyDefault = 16
	// CleanupTimeoutDefault bounds the clean-up after a failed enqueue
	// (taking the job out of the backlog again), which runs even when the
	// caller's context has ended.
	CleanupTimeoutDefault = 5 * time.Second
)

// Config configures a Client. The zero value is ready to use.
type Config struct {
	// Limiter counts backlogs and takes shaping reservations. When nil, New
	// makes one over the client with Prefix, and Close closes it.
	Limiter *throttle.Limiter
	// Prefix of sluice's keys for the limiter New makes; the limiter's own
	// prefix applies when Limiter is set, so give one or the other.
	Prefix string
	// AsynqRedis is the Redis client of asynq's queues when they live apart from
	// sluice's keys; nil means the client given to New.
	AsynqRedis redis.UniversalClient
	// Lead is how long before its slot a shaped job is due in asynq at the
	// least (see taskspec.ScheduleFor); taskspec.LeadDefault when zero. Use the workers' lead.
	Lead time.Duration
	// BatchConcurrency is how many jobs EnqueueBatch sends at once;
	// BatchConcurrencyDefault when zero.
	BatchConcurrency int
}

func (c Config) withDefaults() Config {
	c.Lead = cmp.Or(c.Lead, taskspec.LeadDefault)
	c.BatchConcurrency = cmp.Or(c.BatchConcurrency, BatchConcurrencyDefault)
	return c
}

func (c Config) validate() error {
	switch {
	case c.Limiter != nil && c.Prefix != "":
		return fmt.Errorf("queue config: Prefix %q is given with a Limiter, which has its own prefix; give one or the other", c.Prefix)
	case c.Lead < 0 || c.Lead > time.Minute:
		return fmt.Errorf("queue config: Lead %s: must be between 0 and 1m (it should match the workers' lead, %s by default)", c.Lead, taskspec.LeadDefault)
	case c.BatchConcurrency < 1 || c.BatchConcurrency > 1024:
		return fmt.Errorf("queue config: BatchConcurrency %d: must be between 1 and 1024", c.BatchConcurrency)
	}
	return nil
}

// Client enqueues jobs for tenants: it wraps an asynq.Client, sets the
// tenant and cost headers the workers' gate reads, counts the tenant's
// backlog when its policy caps it (backlog=K), and with shape=true takes the
// job's slot at enqueue time and schedules the job for it, so that a large
// burst waits in asynq's schedule rather than in the pending list in front
// of other tenants' jobs.
//
// A Client is safe for concurrent use. Close it when done.
type Client struct {
	cfg        Config
	lim        *throttle.Limiter
	ownLimiter bool
	asynq      *asynq.Client
	inspector  *asynq.Inspector
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
	ac := c.AsynqRedis
	if ac == nil {
		ac = client
	}
	q.asynq = asynq.NewClientFromRedisClient(ac)
	q.inspector = asynq.NewInspectorFromRedisClient(ac)
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

// job is one job checked and ready to send.
type job struct {
	tenant  string
	typ     string
	payload []byte
	headers map[string]string
	opts    options
	id      string
	counted bool // in the tenant's backlog
}

// plan is what a tenant's policies ask of its producers.
type plan struct {
	backlog int64 // cap; 0 when the backlog is not counted
	shape   bool
	err     error

	policy *throttle.Policy // the tenant's own or the default
	name   string           // the name policy is stored under
	global *throttle.Policy
}

// Enqueue enqueues task for tenant. opts are asynq's options (Queue,
// MaxRetry, TaskID, ProcessAt, ProcessIn, Timeout, Deadline, Retention,
// Unique) and Cost. Options given to asynq.NewTask cannot be read back from
// the task, so a task carrying them is refused: pass them here instead.
//
// It returns an *InvalidError (ErrInvalid) for bad input and a
// *throttle.CostError for a cost the tenant's policy can never admit, both
// before anything is written; a *throttle.BacklogError (ErrBacklogFull) when
// the tenant's backlog is full; and asynq's errors (asynq.ErrTaskIDConflict,
// asynq.ErrDuplicateTask) wrapped with the task's type and tenant.
func (c *Client) Enqueue(ctx context.Context, tenant string, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	j, err := c.prepare(tenant, task, opts, time.Now())
	if err != nil {
		return nil, err
	}
	p := c.plan(ctx, tenant)
	if p.err != nil {
		return nil, p.err
	}
	if err := p.checkCost(tenant, j.opts.cost); err != nil {
		return nil, err
	}
	if p.backlog > 0 {
		n, count, err := c.lim.AddBacklog(ctx, tenant, p.backlog, j.id)
		if err != nil {
			return nil, fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, tenant, err)
		}
		if n == 0 {
			return nil, &throttle.BacklogError{Tenant: tenant, Backlog: count, Limit: p.backlog}
		}
		j.counted = true
	}
	return c.send(ctx, j, p)
}

// prepare checks a job and builds its headers; it does no I/O.
func (c *Client) prepare(tenant string, task *asynq.Task, opts []asynq.Option, now time.Time) (*job, error) {
	if err := throttle.ValidateTenant(tenant); err != nil {
		return nil, &InvalidError{Field: "tenant", Reason: err.Error(), Err: err}
	}
	if task == nil {
		return nil, &InvalidError{Field: "task", Reason: "is nil; make one with asynq.NewTask"}
	}
	if task.Type() == "" {
		return nil, &InvalidError{Field: "task", Reason: "has an empty type; asynq routes tasks to handlers by type"}
	}
	if taskHasOptions(task) {
		return nil, &InvalidError{Field: "task", Value: strconv.Quote(task.Type()), Reason: "carries options given to asynq.NewTask, which sluice cannot read back (asynq keeps them private); pass them to Enqueue instead"}
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
	for _, h := range []string{taskspec.IDHeader, taskspec.GenHeader, taskspec.BacklogHeader, taskspec.CostHeader} {
		delete(headers, h)
	}
	headers[taskspec.TenantHeader] = tenant
	if o.cost != 1 {
		headers[taskspec.CostHeader] = strconv.FormatInt(o.cost, 10)
	}
	id := o.taskID
	if id == "" {
		id = uuid.NewString()
		o.pass = append(o.pass, asynq.TaskID(id))
	}
	return &job{tenant: tenant, typ: task.Type(), payload: task.Payload(), headers: headers, opts: o, id: id}, nil
}

// plan reads what the tenant's policy (or the default) and @global ask of
// producers, from the policy cache.
func (c *Client) plan(ctx context.Context, tenant string) plan {
	r, err := c.lim.Policies().Resolve(ctx, tenant)
	pol, name, global := r.Policy, r.Name, r.Global
	if err != nil {
		return plan{err: fmt.Errorf("enqueue for tenant %q: %w", tenant, err)}
	}
	p := plan{policy: pol, name: name, global: global}
	if pol != nil {
		p.backlog, p.shape = pol.Backlog, pol.Shape
	}
	if global != nil && global.Shape {
		p.shape = true
	}
	return p
}

// checkCost refuses a job no rule of its policies could ever admit.
func (p plan) checkCost(tenant string, cost int64) error {
	for _, s := range []struct {
		name string
		p    *throttle.Policy
	}{{p.name, p.policy}, {throttle.GlobalPolicy, p.global}} {
		if max, rule := s.p.MaxCost(); max >= 0 && cost > max {
			return &throttle.CostError{Tenant: tenant, Cost: cost, Max: max, Rule: s.name + " " + rule}
		}
	}
	return nil
}

// send shapes the job if its policy asks for it and enqueues it; on failure
// it takes the job out of the backlog again.
func (c *Client) send(ctx context.Context, j *job, p plan) (*asynq.TaskInfo, error) {
	opts := j.opts.pass
	if p.shape && !j.opts.processAt.After(time.Now()) {
		d, err := c.lim.Reserve(ctx, throttle.Request{Tenant: j.tenant, ID: j.id, Cost: j.opts.cost})
		if err != nil {
			return nil, c.fail(ctx, j, fmt.Errorf("enqueue %s task for tenant %q: shaping: %w", j.typ, j.tenant, err))
		}
		if !d.Allowed {
			// RetryAfter is measured on Redis's clock; adding it to ours
			// converts the slot to local time.
			at := time.Now().Add(d.RetryAfter)
			if d.Reserved {
				at = taskspec.ScheduleFor(at, c.cfg.Lead)
			}
			opts = append(opts[:len(opts):len(opts)], asynq.ProcessAt(at))
		}
	}
	headers := j.headers
	if j.counted {
		headers = maps.Clone(headers)
		headers[taskspec.BacklogHeader] = "1"
	}
	info, err := c.asynq.EnqueueContext(ctx, asynq.NewTaskWithHeaders(j.typ, j.payload, headers), opts...)
	if err != nil {
		return nil, c.fail(ctx, j, fmt.Errorf("enqueue %s task for tenant %q: %w", j.typ, j.tenant, err))
	}
	return info, nil
}

// fail undoes the backlog count of a job that was not enqueued and returns
// err. A task id that is already taken belongs to a job that keeps its
// count while it is queued or running.
func (c *Client) fail(ctx context.Context, j *job, err error) error {
	if !j.counted {
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeoutDefault)
	defer cancel()
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		info, ierr := c.inspector.GetTaskInfo(j.opts.queue, j.id)
		if ierr == nil && info.State != asynq.TaskStateCompleted && info.State != asynq.TaskStateArchived {
			return err
		}
	}
	if rerr := c.lim.RemoveBacklog(cctx, j.tenant, j.id); rerr != nil {
		return fmt.Errorf("%w (and taking it out of the backlog again failed: %v)", err, rerr)
	}
	return err
}
