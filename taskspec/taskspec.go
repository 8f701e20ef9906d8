// Package taskspec is the contract between sluice's producers (package
// queue) and its workers (package worker): the asynq task headers a job
// carries, and when a job scheduled for a slot is due in asynq. It holds no
// code that runs anything; both sides, and applications that enqueue with
// asynq's own client, read it.
//
// An application that enqueues with asynq directly tags its jobs with
// TenantHeader (and CostHeader for a job weighing more than 1):
//
//	task := asynq.NewTaskWithHeaders("email:send", payload,
//		map[string]string{taskspec.TenantHeader: "acme"})
package taskspec

import (
	"fmt"
	"strings"
	"time"
)

// Task headers sluice reads and writes. Producers set TenantHeader and
// CostHeader (queue.Client does); the other headers are sluice's own and are
// removed from tasks given to queue.Client.Enqueue.
const (
	// TenantHeader carries the job's tenant: the key its limits apply to.
	TenantHeader = "sluice-tenant"
	// CostHeader carries the job's cost when it is more than 1.
	CostHeader = "sluice-cost"
	// IDHeader carries the job's identity when it differs from the asynq
	// task id: a copy the worker enqueues for a job at its retry limit keeps
	// the original's identity, and with it its reservation and its
	// concurrency slot.
	IDHeader = "sluice-id"
	// GenHeader numbers those copies, so that each copy's task id can be
	// derived from the job's identity without growing.
	GenHeader = "sluice-gen"
	// DecidedHeader carries the decision the waiting room made for the job
	// when it let it start (a straight arrival, or a promotion from its
	// line): the worker's gate starts the job on it, at its slot, without
	// deciding again (internal/jobpath's Redeem). The room's hand-over adds
	// it to a promoted job's task.
	DecidedHeader = "sluice-decided"
	// ParkedHeader is "1" on the task of a job queue.Client parked in
	// asynq's schedule at its fallback time while the job waits in its
	// tenant's line: the pumps' sweep pushes the fallback of such tasks
	// further out while they wait (a task a producer scheduled itself has
	// no such header, and runs at its time).
	ParkedHeader = "sluice-parked"
	// PoolsHeader carries the shared pools the job draws from, comma
	// separated ("@openai,@smtp"): their limits apply to it with its
	// tenant's (throttle.Request.Pools). queue.Client sets it (queue.Pools).
	PoolsHeader = "sluice-pools"
	// KeyHeader carries the job's key below its tenant ("user-42"): the
	// key's policy (acme/user-42, acme/* or */*) applies with the tenant's
	// (throttle.Request.Key). queue.Client sets it (queue.Key).
	KeyHeader = "sluice-key"
	// PriorityHeader carries the job's priority in its tenant's line when
	// it is not normal: "high" or "low" (Priority.String). queue.Client
	// sets it at enqueue, and the job joins its line at that level. asynq
	// cannot edit a task's headers, so it keeps the enqueue-time level
	// when sluice jobs prioritize moves the job: the line is the truth,
	// and what sluice jobs and jobs explain show.
	PriorityHeader = "sluice-priority"
	// BacklogHeader was "1" on a job counted in its tenant's backlog by
	// versions before the waiting room.
	//
	// Deprecated: nothing sets or reads it since the waiting room; a
	// policy's backlog= caps the tenant's line instead.
	BacklogHeader = "sluice-backlog"
)

// LeadDefault is how long before its slot a job scheduled for a slot is due
// in asynq, at the least. asynq forwards a scheduled job to the pending list
// at its first check (Config.DelayedTaskCheckInterval) in the whole second
// of its score, so the job arrives between the lead and the lead plus one
// second early, and the worker's gate holds it in-process until its slot.
// The lead must exceed the workers' DelayedTaskCheckInterval. The workers'
// gate uses it for the jobs it defers to their slots (worker.GateConfig.Lead).
const LeadDefault = 300 * time.Millisecond

// ScheduleFor returns the time to give asynq.ProcessAt so that a job whose
// slot (on the local clock) is slot is back in the pending list before it:
// in the whole second that contains slot-lead. It returns a time in the
// middle of that second, so that the few microseconds between this call and
// asynq's own reading of the clock cannot move the job to the next second.
func ScheduleFor(slot time.Time, lead time.Duration) time.Time {
	return slot.Add(-lead).Truncate(time.Second).Add(time.Second / 2)
}

// Priority is a job's level in its tenant's line of the waiting room: the
// line's jobs of high priority leave it first, then those of normal, then
// those of low priority, each level first in, first out. It orders one
// tenant's jobs only: fair share across tenants does not look at it, so a
// tenant gains no share by raising its jobs' priority.
type Priority int

// The priority levels.
const (
	PriorityLow    Priority = -1
	PriorityNormal Priority = 0
	PriorityHigh   Priority = 1
)

// String names the level: "high", "normal" or "low".
func (p Priority) String() string {
	switch p {
	case PriorityHigh:
		return "high"
	case PriorityNormal:
		return "normal"
	case PriorityLow:
		return "low"
	}
	return fmt.Sprintf("Priority(%d)", int(p))
}

// Valid reports whether p is one of the levels.
func (p Priority) Valid() bool { return p >= PriorityLow && p <= PriorityHigh }

// ParsePriority reads a level by its name ("high", "normal", "low"; "" is
// normal), as PriorityHeader and the command line give it.
func ParsePriority(s string) (Priority, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "high":
		return PriorityHigh, nil
	case "normal", "":
		return PriorityNormal, nil
	case "low":
		return PriorityLow, nil
	}
	return PriorityNormal, fmt.Errorf("priority %q: must be high, normal or low", s)
}

// ParsePools reads PoolsHeader: the pools' names in order, empty names
// left out.
func ParsePools(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
