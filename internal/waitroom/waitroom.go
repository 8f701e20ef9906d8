// Package waitroom is the waiting room's face inside sluice: the types the
// queue and worker packages (and sluice's commands) exchange with the
// room, and Room, what they call. The room itself is the throttle
// package's (throttle.Limiter.Room): it decides with the limiter's engine,
// in the same script runs. Applications never use this package: they
// enqueue with queue and run jobs with worker, which drive the room.
//
// The room keeps the tenants' lines of jobs that may not start yet,
// promotes a line's head when it may, and keeps the index of which lines
// are due when. sluice owns the waiting; the queue engine (asynq) owns the
// execution: the queue package brings jobs in (Arrive, Join), the worker
// package runs the pump (Pump) and hands a finished job's slot to the next
// in line (Release). docs/architecture.md walks a job through it.
package waitroom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

// Room is the waiting room. A job waiting in a line is charged nothing, so
// a policy change reaches it at once. When it is promoted it takes its
// slot (or a decision it starts on, Promoted.Ticket) and its concurrency
// slot, and the worker's gate starts it on them. On Redis Cluster the room
// decides on the tenant's rules alone: @global lives in another slot, and
// the gate applies it when the job starts. A Room is safe for concurrent
// use.
type Room interface {
	// Arrive decides whether a new job goes straight to the queue engine:
	// when its tenant's line is empty, a.MayGo and every rule lets it
	// start now. A job that does not goes to the engine parked (scheduled
	// far ahead) and then joins its line (JoinArrived); Arrive records its
	// intent meanwhile, so that the pumps' sweep finds it should its
	// producer die before it joins. A tenant whose line holds its backlog
	// cap already gets a *throttle.BacklogError (throttle.ErrBacklogFull),
	// and a cost no rule can ever admit a *throttle.CostError, with
	// nothing written.
	Arrive(ctx context.Context, a Arrival) (Arrived, error)
	// Park is Arrive, park and JoinArrived at once for a new job that is
	// to wait in its line whatever its rules say (the fleet has no room
	// for it, or its tenant's line holds jobs already): its task goes to
	// the queue engine's schedule and the job to its line in one script
	// run, with no moment at which the task is parked in no line. For a
	// job that arrived and is to wait it is park and JoinArrived at once:
	// a job in its line has no intent. It returns ErrApart, having written nothing, where the
	// engine's keys are not on the room's server (a Cluster, another
	// client); Parked.Conflict when a task of the job's id exists (the
	// caller takes the three steps, which say what it is); a
	// *throttle.BacklogError when the line holds its cap.
	Park(ctx context.Context, p Parking) (Parked, error)
	// TakeBack gives back what a straight arrival took (its task could
	// not be enqueued).
	TakeBack(ctx context.Context, d Arrived) error
	// Join puts jobs of one queue in tenant's line of that queue, in
	// order, once their tasks are in the queue engine (parked). When the
	// line holds backlog jobs (0: no cap) the rest do not join: joined
	// counts those that did; a caller takes the others out of the engine
	// again. A line that begins here makes its tenant due in the queue's
	// index at once. On an error the first joined jobs are in the line.
	Join(ctx context.Context, tenant string, backlog int64, jobs ...Waiter) (joined int, waiting int64, err error)
	// JoinArrived is Join for jobs that arrived to wait (Arrive): it also
	// takes their intents back.
	JoinArrived(ctx context.Context, tenant string, backlog int64, jobs ...Waiter) (joined int, waiting int64, err error)
	// Rejoin puts jobs an earlier arrival left parked in no line
	// (Arrived.Earlier) in their line, whatever its cap, unless they are
	// in it already.
	Rejoin(ctx context.Context, tenant string, jobs ...Waiter) (joined int, err error)
	// Forget drops the intents of jobs that will not join a line (their
	// tasks could not be parked).
	Forget(ctx context.Context, tenant string, jobs ...Waiter) error
	// Waiting is how many jobs of tenant wait in its lines, and when the
	// oldest joined.
	Waiting(ctx context.Context, tenant string) (int64, time.Time, error)
	// Lines reads the lines of queues of the tenants in the queues' due
	// indexes (at most 10,000 of them). Empty lines are left out.
	Lines(ctx context.Context, queues ...string) ([]Line, error)
	// WaitingIDs lists the first n jobs of each of tenant's lines, in the
	// order they leave it.
	WaitingIDs(ctx context.Context, tenant string, n int64) ([]Waiter, error)
	// Prioritize moves job id, waiting in tenant's line of queue, to
	// priority p: it goes to the end of that level's jobs. It reports
	// whether the job was waiting there (false: it is not, nothing
	// changed).
	Prioritize(ctx context.Context, tenant, queue, id string, p int) (bool, error)
	// Pump runs the waiting room's pump until ctx ends (see PumpConfig).
	Pump(ctx context.Context, cfg *PumpConfig) error
	// Release gives back the concurrency slots job id of tenant holds
	// under claim and, in the same script run, hands the freed slot to the
	// next job in the tenant's line of queue when it is the tenant's turn
	// (spare; nil: the fleet's room is not known and the slot is handed
	// on). With h nil (a worker shutting down) nothing is handed on. It
	// returns throttle.ErrClaimLost as throttle.Limiter.Release does.
	// The slots the job holds in its key's scope and the shared pools it
	// names (sc) are given back too.
	Release(ctx context.Context, tenant, queue, id string, claim uint64, sc Scopes, h Handover, spare Spare) error
	// ReleaseAll is Release for several jobs at once, in as few round
	// trips as it takes (a worker's releases that came together), and
	// returns each job's error, in order.
	ReleaseAll(ctx context.Context, jobs []Releasing, h Handover, spare Spare) []error
	// Shares reports whether the queue engine's client engine reaches the
	// room's own keys: one server and database, not a Cluster. A
	// hand-over on such a client may confirm a job in its handing set
	// (Promoted.Handing) in the same call.
	Shares(engine any) bool
}

// Releasing is a job whose concurrency slots go back (Room.ReleaseAll):
// Release's arguments.
type Releasing struct {
	Tenant, Queue, ID string
	Claim             uint64
	Scopes            Scopes
}

// Scopes are the scopes a job draws from besides its tenant and @global:
// its key below the tenant (throttle.Request.Key) and the shared pools it
// names (throttle.Request.Pools).
type Scopes struct {
	Key   string
	Pools []string
}

// Defaults of the waiting room.
const (
	// RepairDefault is how long a promoted job may go unconfirmed by the
	// queue engine before its hand-over is tried again (a pump or worker
	// died in between).
	RepairDefault = 5 * time.Second
	// HoldDefault is how long a pump holds the tenants it takes from the
	// due index: no other pump serves them meanwhile, and if it dies they
	// are due again after it.
	HoldDefault = 5 * time.Second
)

// DefaultQueue is asynq's default queue, written as "" in line entries.
const DefaultQueue = "default"

// Arrival is a new job at the waiting room: it goes straight to the queue
// engine or waits in its tenant's line.
type Arrival struct {
	Tenant string
	// ID is the job's asynq task id.
	ID string
	// Queue is the job's queue ("" for asynq's default).
	Queue string
	// Cost is what the job weighs on rate, window and quota rules; 0 means 1.
	Cost int64
	// Priority is the job's level in its tenant's line: 1 high, 0 normal,
	// -1 low (taskspec.Priority). A line's jobs of high priority leave it
	// first, then those of normal, then of low priority, each level first
	// in, first out.
	Priority int
	// Key is the job's key below its tenant ("" for none): its policy
	// decides the job with the tenant's, in the line's turn too.
	Key string
	// MayGo reports that the fleet has room for the job now: without it
	// the job waits in its line even if its rules allow it, so that a
	// saturated fleet serves tenants in turn.
	MayGo bool
	// Policies, when set, are the job's policies as
	// jobpath.Engine.Resolve returned them (a *jobpath.Policies); nil: the
	// room resolves them.
	Policies any
}

// Arrived is what the room made of an arrival.
type Arrived struct {
	// Straight reports that the job may start now: it took its slot (and
	// its concurrency slot, under Claim) and goes straight to the queue
	// engine's pending list. Otherwise it is to wait in its tenant's line
	// (Join).
	Straight bool
	Slot     time.Time
	Claim    uint64
	// Ticket is the decision to carry with a straight job
	// (taskspec.DecidedHeader): the worker's gate starts the job on it
	// (jobpath.Engine.Redeem) without deciding again. Empty when the
	// gate must decide (on a Cluster with @global rules, which the room
	// does not see).
	Ticket string
	// Waiting is how many jobs of the tenant wait in its line.
	Waiting int64
	// Backlog is the cap of the tenant's line (its policy's backlog=); 0
	// when there is none.
	Backlog int64
	// Earlier reports, for a job to wait, that an earlier arrival of the
	// same job (its task id) left its intent, which joining its line takes
	// back: its task may be parked in no line (its producer died before
	// joining it), and Rejoin puts it there.
	Earlier bool

	// Undo is the room's own record of what a straight arrival took
	// (TakeBack gives it back); callers pass it along untouched.
	Undo any
}

// Parking is a new job for Room.Park: the job in its tenant's line, and
// its task as the queue engine keeps it.
type Parking struct {
	Tenant string
	Job    Waiter
	// Policies are the job's policies, as in Arrival.
	Policies any
	// Fallback is the least time the task stays parked; longer when its
	// line is long (twice the time the line needs at its tenant's and
	// @global's pace, jobpath.Policies.Pace), up to MaxPark.
	Fallback, MaxPark time.Duration
	// Task is the engine's side (internal/asynqroom makes it).
	Task EngineTask
	// Engine is the Redis client of the engine's keys: Park runs only
	// where it is the room's own.
	Engine any
}

// EngineTask is a task to write into the queue engine's schedule: its
// keys (its hash, the schedule, the set of queue names), its queue's name
// and its encoded message.
type EngineTask struct {
	TaskKey, ScheduleKey, QueuesKey string
	Queue, ID                       string
	Msg                             []byte
}

// Parked is what Room.Park did.
type Parked struct {
	// Conflict reports a task of the job's id in the engine already:
	// nothing was written.
	Conflict bool
	// Waiting is how many jobs wait in the line, the job included.
	Waiting int64
	// At is when the task comes out of the engine's schedule, should no
	// pump promote it first.
	At time.Time
}

// ErrApart says that Room.Park cannot run: the queue engine's keys are not
// on the room's server.
var ErrApart = errors.New("sluice: the queue engine's keys are apart from the waiting room's")

// Waiter is a job to put in its tenant's line.
type Waiter struct {
	ID       string
	Queue    string // "" for asynq's default
	Cost     int64  // 0 means 1
	Priority int    // 1 high, 0 normal, -1 low (see Arrival.Priority)
	Key      string // the job's key below its tenant ("" for none)
}

// Promoted is a job the room promoted from its line: it took its slot and
// its concurrency slot (under Claim), and is to be handed to the queue
// engine.
type Promoted struct {
	Tenant string
	Queue  string
	ID     string
	Key    string // the job's key below its tenant ("" for none)
	Cost   int64
	Slot   time.Time
	Claim  uint64
	Lined  time.Time // when it joined the line
	// Retry reports a promotion made earlier whose hand-over was not
	// confirmed: the engine may have it already.
	Retry bool
	// Ticket is the decision the job is to carry (see Arrived.Ticket);
	// empty for a retry, or when the gate must decide.
	Ticket string

	// Entry is the job's line entry, and Undo the room's record of what
	// its promotion took (to take it back when the engine does not have
	// the job); callers pass them along untouched.
	Entry string
	Undo  any
	// Handing is the key of the set that holds Entry until the engine has
	// the job ("" on a Cluster): a hand-over whose client Room.Shares may
	// take Entry out of it itself, and answer Confirmed.
	Handing string
	// InRun reports a job its turn handed over to the queue engine in its
	// own script run (PumpConfig.Engine): the engine has it, and it is in
	// no handing set.
	InRun bool
	// Gone, with InRun, stands for a job a release's turn found gone from
	// the queue engine and dropped from its line in its run, charged
	// nothing (Turn.Gone; only Tenant and Queue are set): there is nothing
	// to hand over, and a Handover answers Gone, so that it is counted as
	// the pump's turns count theirs (PumpConfig.OnTurn).
	Gone bool
}

// Turn is what one turn of a tenant's line did.
type Turn struct {
	// Promoted are the jobs to hand over, in line order, then the earlier
	// promotions to hand over again (Retry).
	Promoted []Promoted
	// Due is when the tenant's line may next be promoted; zero when it is
	// empty and nothing is being handed over.
	Due time.Time
	// Waiting is how many jobs wait in the line after the turn, and Oldest
	// when the one at its head joined it (zero when none waits).
	Waiting int64
	Oldest  time.Time
	// Skipped counts line entries dropped because their job runs already.
	Skipped int
	// Gone counts jobs that left the line charged nothing because the
	// turn, handing its jobs over in its run (PumpConfig.Engine), found
	// their tasks gone.
	Gone int
	// Released and Lost are, for Release, how many scopes gave back the
	// job's slot and how many held none under its claim.
	Released, Lost int
	// MidTurn: the budget (the fleet's room) ended the turn while the
	// tenant's deficit still covered its head: its turn goes on next time,
	// ahead of the tenants behind it.
	MidTurn bool
}

// Line is one tenant's line of one queue: how many jobs wait in it and
// when the one at its head joined it.
type Line struct {
	Tenant  string
	Queue   string
	Waiting int64
	Oldest  time.Time
}

// HandoverResult is what the queue engine made of one promoted job.
type HandoverResult int

const (
	// Handed: the engine has the job to run now (or had it already,
	// pending or running).
	Handed HandoverResult = iota
	// Gone: the engine has no such job, or holds it in a state it does
	// not run from (archived, completed): the job leaves the room and
	// what its promotion took is given back.
	Gone
	// Failed: the engine could not be asked; the hand-over is tried again
	// later.
	Failed
	// Confirmed: Handed, and the job's entry left its handing set
	// (Promoted.Handing) in the same call: the room need not confirm it.
	Confirmed
)

// A Handover gives promoted jobs to the queue engine and reports, for each
// in order, what became of it.
type Handover func(ctx context.Context, jobs []Promoted) []HandoverResult

// Of returns the waiting room of a *throttle.Limiter. Package throttle,
// which imports this one, sets it; sluice's queue, worker and command
// packages reach the room through it, so that the room is no part of
// throttle's public API.
var Of func(limiter any) Room

// Spare tells how many more jobs of queue the fleet can take now, counting
// the one it is asked for, which it takes (internal/asynqroom's
// Gauge.Spare): 1 is the last place.
type Spare func(ctx context.Context, queue string) int

// A Repark pushes the fallback of the queue engine's parked tasks of queue
// that come due within within, for tenants with a line there (inLine), to
// by from now; it returns how many it pushed (internal/asynqroom.Repark).
type Repark func(ctx context.Context, queue string, within, by time.Duration, inLine func(tenant string) bool) (int, error)

// The sweep's push of parked tasks (PumpConfig.Repark): every sweep (every
// half minute, one pump of the fleet) pushes the tasks parked for waiting
// jobs that come due within ReparkWithin to ReparkBy from now. Should no
// sluice process run, a parked job reaches a worker by asynq's own
// forwarder at most ReparkBy after the last sweep.
const (
	// 40 sweeps of up to asynqroom.ReparkMax tasks a queue before a
	// task comes due: parked tasks of a burst of 200,000 jobs, all with
	// one fallback, are pushed in time
	ReparkWithin = 20 * time.Minute
	ReparkBy     = time.Hour
)

// TaskState is what the queue engine holds of a job whose intent the
// pumps' sweep found (its producer died between parking its task and
// joining its line).
type TaskState int

const (
	// TaskParked: the job's task waits in the engine's schedule, as its
	// producer parked it: the job joins its line.
	TaskParked TaskState = iota
	// TaskElsewhere: the engine holds the task otherwise (ready, running,
	// done, or another tenant's): the intent goes.
	TaskElsewhere
	// TaskMissing: the engine has no such task: the intent goes once it is
	// old enough that its producer cannot be about to park it.
	TaskMissing
)

// A TaskLookup tells, for each job in order, what the queue engine holds
// of its task.
type TaskLookup func(ctx context.Context, tenant string, jobs []Waiter) ([]TaskState, error)

// Defaults of PumpConfig.
const (
	PumpIntervalDefault = 20 * time.Millisecond
	// KickGap is the least time between two of a pump's rounds that
	// ended jobs call for (PumpConfig.Kick): the jobs that end meanwhile
	// are served together. With PumpConfig.Drain the gap is a quarter of
	// the time the pending list's jobs last, when that is longer (at most
	// Interval).
	KickGap            = 2 * time.Millisecond
	PumpIdleDefault    = time.Second
	PumpTenantsDefault = 256
)

// PumpConfig configures a pump.
type PumpConfig struct {
	// Queues are the queues whose lines the pump serves (those of the
	// workers it runs with). Required.
	Queues []string
	// Handover gives promoted jobs to the queue engine. Required.
	Handover Handover
	// Engine, when set, lays out the queue engine's keys on the room's
	// own server (the engine's client Room.Shares): a turn then hands its
	// jobs over in its own script run, one round trip fewer per round and
	// no handing set, and a job whose task is gone leaves its line
	// charged nothing. Jobs it cannot hand over so (a tenant with key
	// policies, earlier promotions handed over again) go through Handover.
	Engine *EngineLayout
	// Free is how many more jobs of queue the fleet can take now: the room
	// in the queue engine's pending list, so that it stays short and a
	// tenant arriving later is not served after everything already
	// admitted. Required.
	Free func(ctx context.Context, queue string) (int, error)
	// Interval is how often the pump looks again while the fleet has no
	// room for the lines that are due. PumpIntervalDefault when zero.
	Interval time.Duration
	// Kick, when set, says that a job of the pump's worker ended: while
	// the fleet had no room, the pump looks again then (at most every
	// KickGap) rather than after Interval, so that the slot the job left
	// is filled from the lines before the pending list runs dry.
	Kick <-chan struct{}
	// Drain, when set, is how long queue's pending list, holding what the
	// room lets it hold, lasts at the fleet's pace (0: not known). A
	// kicked pump waits a quarter of it (at least KickGap, at most
	// Interval) before its round, so that a round refills several slots'
	// worth rather than one, while the list still holds three quarters.
	Drain func(queue string) time.Duration
	// Idle is the longest the pump sleeps while no line is due: it wakes
	// for the next due line, and at once when a line begins or a release
	// makes one due sooner (the index's wake channel), so Idle only bounds
	// what a lost wake-up costs. PumpIdleDefault when zero.
	Idle time.Duration
	// Quiet, when set, says whether another pump of the fleet polls the
	// index every Idle (the worker holding the fleet's lock runs that
	// one): while it says so, this pump sleeps up to QuietIdleFactor
	// times Idle, woken by the wake channel and its own due times as
	// before, so that idle workers' pumps cost Redis next to nothing.
	Quiet func() bool
	// Tenants is the most tenants served in one round. PumpTenantsDefault
	// when zero.
	Tenants int
	// OnTurn, when set, is told of every tenant's turn: the turn, how many
	// of its jobs were handed over and how many were gone.
	OnTurn func(tenant string, t Turn, handed, gone int)
	// OnError, when set, is told of errors the pump goes on after.
	OnError func(err error)
	// Tasks, when set, tells the sweep what the queue engine holds of the
	// tasks of jobs that arrived to wait and joined no line (their
	// producer died between parking them and joining them): those parked
	// join their lines. Without it such a job waits for its fallback.
	Tasks TaskLookup
	// Repark, when set, is how the sweep keeps waiting jobs' parked tasks
	// from reaching their fallback while the pumps run: those coming due
	// within ReparkWithin are pushed to ReparkBy from now. Without it a
	// line that outlives its fallback comes out of the queue engine's
	// schedule at that time.
	Repark Repark
}

// EngineLayout is where the queue engine keeps a queue's jobs, for a
// hand-over in a turn's own script run (internal/asynqroom.Engine; the
// layout handover.lua writes): Prefix(queue) followed by "pending" is
// the queue's pending list, by "t:" and a job's ID its task's hash, by
// "scheduled" or "retry" the sets a parked or deferred task waits in;
// Header names the task header a decision travels in.
type EngineLayout struct {
	Prefix func(queue string) string
	Header string
}

// QuietIdleFactor is how many Idles a quiet pump (PumpConfig.Quiet) sleeps
// at the most while no line it knows of is due.
const QuietIdleFactor = 10

// WithDefaults is c with its zero durations and counts set to their
// defaults.
func (c PumpConfig) WithDefaults() PumpConfig {
	c.Interval = cmp.Or(c.Interval, PumpIntervalDefault)
	c.Idle = cmp.Or(c.Idle, PumpIdleDefault)
	c.Tenants = cmp.Or(c.Tenants, PumpTenantsDefault)
	return c
}

// Validate says what is missing or out of range in c.
func (c PumpConfig) Validate() error {
	switch {
	case len(c.Queues) == 0:
		return errors.New("pump config: Queues is required")
	case c.Handover == nil:
		return errors.New("pump config: Handover is required")
	case c.Free == nil:
		return errors.New("pump config: Free is required")
	case c.Interval < time.Millisecond:
		return fmt.Errorf("pump config: Interval %s: must be at least 1ms", c.Interval)
	case c.Idle < c.Interval:
		return fmt.Errorf("pump config: Idle %s: must be at least Interval %s", c.Idle, c.Interval)
	case c.Tenants < 1:
		return fmt.Errorf("pump config: Tenants %d: must be at least 1", c.Tenants)
	case c.Engine != nil && (c.Engine.Prefix == nil || c.Engine.Header == ""):
		return errors.New("pump config: Engine needs its Prefix and its Header")
	}
	return nil
}
