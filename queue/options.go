package queue

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/taskspec"
)

// ErrInvalid is matched (errors.Is) by every error about a job that cannot
// be enqueued as given. Such errors are returned before anything is written.
var ErrInvalid = errors.New("invalid job")

// InvalidError describes a job that cannot be enqueued as given: Field names
// what is wrong (tenant, cost, task, option), Value the value given and
// Reason what to do instead. It matches ErrInvalid, and wraps
// throttle.ErrInvalidTenant for a bad tenant.
type InvalidError struct {
	Field  string
	Value  string
	Reason string
	Err    error
}

func (e *InvalidError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("queue: %s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("queue: %s %s: %s", e.Field, e.Value, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) match.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the underlying error, if any.
func (e *InvalidError) Unwrap() error { return e.Err }

// costOptType is the asynq.OptionType of Cost; asynq ignores options it
// does not know, so the value only has to differ from asynq's own.
const costOptType asynq.OptionType = 1 << 16

type costOption int64

// Cost is an option of Client.Enqueue: the job weighs n on its tenant's
// rate, window and quota rules (a batch call that counts as n requests).
// The default is 1. A cost must fit each of those rules (at most a rate's
// burst, a window's or a quota's limit): under rate=2/s, whose burst is 1,
// a job of cost 3 could never start, and Enqueue refuses it with a
// *throttle.CostError. Client removes the option before the task reaches
// asynq; given to asynq.Client directly it has no effect.
func Cost(n int64) asynq.Option { return costOption(n) }

func (n costOption) String() string         { return fmt.Sprintf("Cost(%d)", int64(n)) }
func (n costOption) Type() asynq.OptionType { return costOptType }
func (n costOption) Value() any             { return int64(n) }

// priorityOptType is the asynq.OptionType of Priority.
const priorityOptType asynq.OptionType = 1<<16 + 1

type priorityOption taskspec.Priority

// The priority levels of a job in its tenant's line (Priority).
const (
	High   = taskspec.PriorityHigh
	Normal = taskspec.PriorityNormal
	Low    = taskspec.PriorityLow
)

// Priority is an option of Client.Enqueue: the job's level in its tenant's
// line of the waiting room, High, Normal (the default) or Low. While the
// tenant's jobs wait, those of high priority start first, then normal,
// then low, each level in the order they came; a job that may start at
// once starts at once whatever its level. It orders one tenant's jobs
// only: the fleet's fair share across tenants is the same whatever their
// jobs' priorities. A waiting job's priority can be changed
// (sluice jobs prioritize). Client removes the option before the task
// reaches asynq (the job carries taskspec.PriorityHeader instead); given
// to asynq.Client directly it has no effect.
func Priority(p taskspec.Priority) asynq.Option { return priorityOption(p) }

func (p priorityOption) String() string {
	return fmt.Sprintf("Priority(%s)", taskspec.Priority(p))
}
func (p priorityOption) Type() asynq.OptionType { return priorityOptType }
func (p priorityOption) Value() any             { return taskspec.Priority(p) }

// poolsOptType is the asynq.OptionType of Pools.
const poolsOptType asynq.OptionType = 1<<16 + 2

type poolsOption []string

// Pools is an option of Client.Enqueue: the shared pools the job draws
// from ("@openai", "@smtp"), named limits that jobs of many tenants share
// (sluice policy set @openai 'rate=60/s concurrency=20'). Every rule of
// every pool applies with the tenant's and @global's, all or nothing: a
// job one of them holds back is charged in none. A job that names pools
// goes to asynq at once and the workers' gate decides when it starts (it
// waits in no line of the waiting room, whose turns are per tenant).
// Client removes the option before the task reaches asynq (the job carries
// taskspec.PoolsHeader instead); given to asynq.Client directly it has no
// effect.
func Pools(names ...string) asynq.Option { return poolsOption(names) }

func (p poolsOption) String() string         { return fmt.Sprintf("Pools(%s)", strings.Join(p, ", ")) }
func (p poolsOption) Type() asynq.OptionType { return poolsOptType }
func (p poolsOption) Value() any             { return []string(p) }

// keyOptType is the asynq.OptionType of Key.
const keyOptType asynq.OptionType = 1<<16 + 3

type keyOption string

// Key is an option of Client.Enqueue: the job's key below its tenant
// ("user-42" of tenant acme), for limits per user, project or other part
// of a tenant. The key's policy (sluice policy set acme/user-42 …, else
// acme/* for every key of acme, else */* for every key of every tenant)
// applies with the tenant's, all or nothing; the tenant's own policy then
// limits the sum of its keys, and in the waiting room the job waits in
// its tenant's line (fair share is counted per tenant, so splitting work
// over many keys wins no extra share), where a key held back by its own
// limits does not hold back its tenant's other keys. Client removes the
// option before the task reaches asynq (the job carries
// taskspec.KeyHeader instead); given to asynq.Client directly it has no
// effect.
func Key(key string) asynq.Option { return keyOption(key) }

func (k keyOption) String() string         { return fmt.Sprintf("Key(%q)", string(k)) }
func (k keyOption) Type() asynq.OptionType { return keyOptType }
func (k keyOption) Value() any             { return string(k) }

// options is what Enqueue needs to know of the options given.
type options struct {
	key       string
	pools     []string
	priority  taskspec.Priority
	cost      int64
	queue     string
	taskID    string
	processAt time.Time // zero when none given
	pass      []asynq.Option
}

var asynqPkg = reflect.TypeOf(asynq.MaxRetry(0)).PkgPath()

// parseOptions checks every option the way asynq would, and the ones asynq
// would silently ignore, so that nothing is written for a job asynq would
// refuse or that would not do what its producer asked.
func parseOptions(opts []asynq.Option, now time.Time) (options, error) {
	o := options{cost: 1, queue: "default"}
	for i, opt := range opts {
		if opt == nil {
			return o, &InvalidError{Field: "option", Value: fmt.Sprintf("#%d", i+1), Reason: "is nil"}
		}
		if c, ok := opt.(costOption); ok {
			if c < 1 {
				return o, &InvalidError{Field: "cost", Value: fmt.Sprint(int64(c)), Reason: "must be at least 1 (1 is the default)"}
			}
			o.cost = int64(c)
			continue
		}
		if ps, ok := opt.(poolsOption); ok {
			for _, p := range ps {
				if err := names.Pool(p); err != nil {
					return o, &InvalidError{Field: "pool", Value: p, Reason: err.Error(), Err: err}
				}
				if !slices.Contains(o.pools, p) {
					o.pools = append(o.pools, p)
				}
			}
			continue
		}
		if k, ok := opt.(keyOption); ok {
			if err := names.Key(string(k)); err != nil {
				return o, &InvalidError{Field: "key", Value: string(k), Reason: err.Error(), Err: err}
			}
			o.key = string(k)
			continue
		}
		if p, ok := opt.(priorityOption); ok {
			if !taskspec.Priority(p).Valid() {
				return o, &InvalidError{Field: "priority", Value: fmt.Sprint(int(p)), Reason: "must be queue.High, queue.Normal or queue.Low"}
			}
			o.priority = taskspec.Priority(p)
			continue
		}
		if reflect.TypeOf(opt).PkgPath() != asynqPkg {
			return o, &InvalidError{Field: "option", Value: fmt.Sprintf("%T", opt), Reason: "unknown option: asynq would ignore it; use asynq's options (asynq.Queue, asynq.MaxRetry, …), queue.Cost, queue.Priority, queue.Key or queue.Pools"}
		}
		switch opt.Type() {
		case asynq.QueueOpt:
			name, _ := opt.Value().(string)
			if strings.TrimSpace(name) == "" {
				return o, &InvalidError{Field: "option", Value: opt.String(), Reason: "the queue name is empty; give a name such as \"default\""}
			}
			o.queue = name
		case asynq.TaskIDOpt:
			id, _ := opt.Value().(string)
			if strings.TrimSpace(id) == "" {
				return o, &InvalidError{Field: "option", Value: opt.String(), Reason: "the task id is empty; give a non-blank id or leave TaskID out"}
			}
			o.taskID = id
		case asynq.UniqueOpt:
			if ttl, _ := opt.Value().(time.Duration); ttl < time.Second {
				return o, &InvalidError{Field: "option", Value: opt.String(), Reason: "asynq needs a Unique TTL of at least 1s"}
			}
		case asynq.ProcessAtOpt:
			o.processAt, _ = opt.Value().(time.Time)
		case asynq.ProcessInOpt:
			d, _ := opt.Value().(time.Duration)
			o.processAt = now.Add(d)
		case asynq.GroupOpt:
			return o, &InvalidError{Field: "option", Value: opt.String(), Reason: "grouped tasks are aggregated into a new task that does not carry the tenant, so sluice cannot throttle them; enqueue them with asynq.Client"}
		case asynq.MaxRetryOpt, asynq.TimeoutOpt, asynq.DeadlineOpt, asynq.RetentionOpt:
		default:
			return o, &InvalidError{Field: "option", Value: opt.String(), Reason: "unknown asynq option type; this version of sluice supports asynq v0.26's options"}
		}
		o.pass = append(o.pass, opt)
	}
	return o, nil
}
