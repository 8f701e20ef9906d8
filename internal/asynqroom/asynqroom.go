// Package asynqroom is asynq's side of sluice's waiting room, shared by
// the queue and worker packages: how much room the fleet has for more
// jobs (its asynq servers' concurrency against their pending lists), the
// hand-over of promoted jobs to asynq's pending list, and the worker
// recoverer's give-back of tasks nobody runs (Recover).
//
// It reads and writes asynq's own keys, in the layout of asynq v0.26.
// Layout checks at start that the asynq a program runs with is that one
// (build info, and a probe); the room is off otherwise. The package's
// tests pin the layout too, so an asynq upgrade that changes it fails
// them.
package asynqroom

import (
	"context"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
	"github.com/sluicehq/sluice/taskspec"
)

// asynq v0.26's key layout: every key of a queue carries its name as hash
// tag, asynq:{QUEUE}:.
func queuePrefix(queue string) string { return "asynq:{" + queue + "}:" }

// PendingKey is the list of a queue's tasks ready to run.
func PendingKey(queue string) string { return queuePrefix(queue) + "pending" }

// activeKey is the list of a queue's tasks its servers run.
func activeKey(queue string) string { return queuePrefix(queue) + "active" }

// processedKey counts the queue's tasks asynq's servers ended, since ever
// (its total, not the day's).
func processedKey(queue string) string { return queuePrefix(queue) + "processed" }

// TaskKey is the hash of one task.
func TaskKey(queue, id string) string { return queuePrefix(queue) + "t:" + id }

// Defaults of a Gauge.
const (
	// CapacityEvery is how often the fleet's capacity is read from asynq's
	// server registry (asynq's servers write it every few seconds).
	CapacityEvery = 5 * time.Second
	// PendingEvery is how often a producer's gauge reads a pending list's
	// length again; in between it counts the jobs it sent itself.
	PendingEvery = 50 * time.Millisecond

	idleCapacityEvery = 250 * time.Millisecond

	// PendingWait is how long a job should wait in a pending list that
	// the fleet does not take from as fast as jobs come: the room keeps
	// such a list at what the fleet takes in that time, so that a job
	// the room decided starts on that decision. A decision holds a few ms
	// past its slot (the slack a rate affords it, at most 50 ms), and a job
	// that comes later is decided again; a list kept at the fleet's whole
	// capacity made a job wait a full turn of the fleet's slots. 5 ms
	// let the list run dry between a pump's refills: asynq's servers, which
	// find it empty, sleep half to one and a half TaskCheckInterval before
	// they look again (small end-to-end round, BENCHMARKS.md: 0.37-0.40x
	// plain asynq at 5 ms, 0.42-0.49x at 10 and 15 ms; at 20 and 30 ms
	// more jobs outwait their decision's slack and are decided again).
	// With the slack at most 50 ms, 20 ms did no better: 0.49x and 0.42x
	// (HTTP, no-op) against 0.54x and 0.46x at 10 ms, one run each.
	PendingWait = 10 * time.Millisecond
	// pendingFloor is the least a pending list may hold (the fleet's
	// capacity when that is smaller): what the fleet takes while a pump
	// refills it.
	pendingFloor = 8
	// rateEvery is the least span over which a gauge measures how fast
	// the fleet takes a queue's jobs.
	rateEvery = 100 * time.Millisecond
)

// Gauge tells how many more jobs the fleet can take from a queue now: what
// its pending list may hold, less the jobs waiting in it. The list may hold
// the concurrency of the workers that serve the queue (their
// registrations, see Register) while the fleet takes its jobs as fast as
// they come; while jobs queue in it, only what the fleet takes in
// PendingWait (pendingTarget). Keeping the pending lists that short is
// what lets the waiting room serve tenants in turn (a job admitted later
// is not queued behind everything admitted before) and its jobs start on
// the decisions it made for them.
//
// A Gauge is safe for concurrent use.
type Gauge struct {
	client    redis.UniversalClient
	inspector *asynq.Inspector

	mu       sync.Mutex
	capacity map[string]capacityRead
	queues   map[string]*queueRoom
	taken    map[string]*takeRate
}

// takeRate is how fast the fleet takes a queue's jobs from its pending
// list: the jobs it ended (asynq's count of them, processedKey) and the
// jobs it runs (the active list), read at two times rateEvery or more
// apart.
type takeRate struct {
	n    int64
	at   time.Time
	rate float64 // jobs per second
	room int     // what the list may hold (pendingTarget)
}

type queueRoom struct {
	at   time.Time
	free int
}

// NewGauge returns a gauge over the Redis client of asynq's queues.
func NewGauge(client redis.UniversalClient) *Gauge {
	return &Gauge{
		client:    client,
		inspector: asynq.NewInspectorFromRedisClient(client),
		capacity:  map[string]capacityRead{},
		queues:    map[string]*queueRoom{},
		taken:     map[string]*takeRate{},
	}
}

// capacityOf is how many jobs of queue the fleet runs at once: the
// registered workers' concurrency (Register), read at most every
// CapacityEvery (every idleCapacityEvery while none serves the queue, so
// that jobs start soon after the first worker does). With no worker
// registered (a fleet of asynq servers that sluice's workers do not run),
// it is read from asynq's server registry instead.
func (g *Gauge) capacityOf(ctx context.Context, queue string) (int, error) {
	g.mu.Lock()
	c, ok := g.capacity[queue]
	every := CapacityEvery
	if c.n == 0 {
		every = idleCapacityEvery
	}
	fresh := ok && time.Since(c.at) < every
	g.mu.Unlock()
	if fresh {
		return c.n, nil
	}
	n, err := registeredCapacity(ctx, g.client, queue)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		servers, err := g.inspector.Servers()
		if err != nil {
			return 0, fmt.Errorf("read asynq's servers: %w", err)
		}
		for _, s := range servers {
			if _, serves := s.Queues[queue]; serves && s.Status == "active" {
				n += s.Concurrency
			}
		}
	}
	g.mu.Lock()
	g.capacity[queue] = capacityRead{n: n, at: time.Now()}
	g.mu.Unlock()
	return n, nil
}

// Known is the fleet's capacity for queue as last read (capacityOf, which
// the pump's rounds call), without a read of its own: 0 when not read yet.
func (g *Gauge) Known(queue string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.capacity[queue].n
}

type capacityRead struct {
	n  int
	at time.Time
}

// Free is how many more jobs the fleet can take from the queues now, in
// all: for each queue, what its pending list is to hold less its length.
// It reads every queue's pending list, active list and count of ended jobs
// in one round trip.
func (g *Gauge) Free(ctx context.Context, queues []string) (int, error) {
	pipe := g.client.Pipeline()
	pending := make([]*redis.IntCmd, len(queues))
	active := make([]*redis.IntCmd, len(queues))
	ended := make([]*redis.StringCmd, len(queues))
	for i, q := range queues {
		pending[i] = pipe.LLen(ctx, PendingKey(q))
		active[i] = pipe.LLen(ctx, activeKey(q))
		ended[i] = pipe.Get(ctx, processedKey(q))
	}
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("read asynq's pending lists: %w", err)
	}
	now := time.Now()
	free := 0
	for i, q := range queues {
		c, err := g.capacityOf(ctx, q)
		if err != nil {
			return 0, err
		}
		n, err := ended[i].Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, fmt.Errorf("read asynq's count of ended jobs of queue %q: %w", q, err)
		}
		l := int(pending[i].Val())
		free += max(g.pendingTarget(q, c, int(active[i].Val()), l, n, now)-l, 0)
	}
	return free, nil
}

// pendingTarget is what queue's pending list is to hold (Gauge) for a
// fleet of capacity slots, active of them running, whose list holds
// pending jobs and that has ended n of its jobs by now.
//
// The fleet's pace is how fast it takes jobs from the list: how fast the
// jobs it ended and the jobs it runs grow together, measured over
// rateEvery or more (pendingFloor until known). The list starts at the
// fleet's capacity; it is cut to the pace's PendingWait of jobs whenever
// it holds more than that while half the slots or more are idle (its jobs
// wait longer than PendingWait for workers that have room: asynq's
// servers take them no faster), and doubles, up to the capacity, whenever
// it is found empty. While the slots are busy its jobs wait for slots,
// not for the servers: a list cut then leaves slots idle between a job's
// end and the pump's next round (a saturated fleet's flood got 792 jobs/s
// of 933 with the list cut whenever a slot was idle, 880 with it kept).
func (g *Gauge) pendingTarget(queue string, capacity, active, pending int, n int64, now time.Time) int {
	taken := n + int64(active)
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.taken[queue]
	if e == nil {
		e = &takeRate{n: taken, at: now, room: capacity}
		g.taken[queue] = e
	}
	if span := now.Sub(e.at); span >= rateEvery {
		e.rate = max(float64(taken-e.n), 0) / span.Seconds()
		e.n, e.at = taken, now
	}
	pace := max(int(math.Ceil(e.rate*PendingWait.Seconds())), pendingFloor)
	switch {
	case pending > pace && 2*active <= capacity:
		e.room = pace
	case pending == 0:
		e.room = max(2*e.room, pace)
	}
	e.room = min(e.room, capacity)
	return e.room
}

// Drain is how long queue's pending list, holding what it is to hold
// (pendingTarget), lasts at the pace the fleet took its jobs at, as
// measured by the last reads (Free); 0 while the pace is not known.
func (g *Gauge) Drain(queue string) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.taken[queue]
	if e == nil || e.rate <= 0 {
		return 0
	}
	return time.Duration(float64(e.room) / e.rate * float64(time.Second))
}

// Take reports whether one more job may go straight to queue's pending
// list, and counts it. The pending list's length is read at most every
// PendingEvery; in between the gauge counts what it let through. An error
// reading it says no: the job waits in its line, where a pump finds it.
func (g *Gauge) Take(ctx context.Context, queue string) bool {
	return g.Spare(ctx, queue) > 0
}

// Spare is how many more jobs queue's pending list has room for, counting
// the one asked for, which it takes when there is room (as Take does):
// 1 is the last place, 0 none.
func (g *Gauge) Spare(ctx context.Context, queue string) int {
	g.mu.Lock()
	q := g.queues[queue]
	if q == nil {
		q = &queueRoom{}
		g.queues[queue] = q
	}
	stale := time.Since(q.at) >= PendingEvery
	if stale {
		// one caller refreshes; the others count on the old figure
		q.at = time.Now()
	}
	g.mu.Unlock()
	if stale {
		free, err := g.Free(ctx, []string{queue})
		g.mu.Lock()
		if err != nil {
			q.free = 0
		} else {
			q.free = free
		}
		g.mu.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := q.free
	if n > 0 {
		q.free--
	}
	return max(n, 0)
}

// Engine is asynq's key layout for a waiting-room turn that hands its
// jobs over in its own script run (waitroom.PumpConfig.Engine), where
// asynq's keys and the room's share a server: the same keys and writes
// as Handover's (handover.lua), pinned alike by
// TestHandoverPinsAsynqLayout.
func Engine() *waitroom.EngineLayout {
	return &waitroom.EngineLayout{Prefix: queuePrefix, Header: taskspec.DecidedHeader}
}

// handoverChunk is the most tasks one handover.lua call moves.
const handoverChunk = 100

// Handover returns the waiting room's hand-over to asynq over its Redis
// client: each promoted job's task moves from asynq's schedule (where it
// was parked) or its retry set to the pending list of its queue, in one
// script call per queue and chunk. With confirm (the client reaches the
// room's keys: waitroom.Room.Shares), a job with a handing set
// (waitroom.Promoted.Handing) that asynq has leaves it in the same call,
// and is answered waitroom.Confirmed, as is a job its turn handed over
// in its own run (waitroom.Promoted.InRun), with no call (one its turn
// found gone, waitroom.Promoted.Gone, is answered waitroom.Gone).
func Handover(client redis.UniversalClient, confirm bool) waitroom.Handover {
	return func(ctx context.Context, jobs []waitroom.Promoted) []waitroom.HandoverResult {
		out := make([]waitroom.HandoverResult, len(jobs))
		byQueue := map[string][]int{}
		var order []string
		for i, j := range jobs {
			if j.InRun {
				// its turn handed it over in its run (Engine), or found
				// it gone
				out[i] = waitroom.Confirmed
				if j.Gone {
					out[i] = waitroom.Gone
				}
				continue
			}
			if _, ok := byQueue[j.Queue]; !ok {
				order = append(order, j.Queue)
			}
			byQueue[j.Queue] = append(byQueue[j.Queue], i)
		}
		now := strconv.FormatInt(time.Now().UnixNano(), 10)
		for _, q := range order {
			idx := byQueue[q]
			for start := 0; start < len(idx); start += handoverChunk {
				chunk := idx[start:min(start+handoverChunk, len(idx))]
				keys := make([]string, 0, 1+2*len(chunk))
				args := make([]any, 0, 4+3*len(chunk))
				keys = append(keys, PendingKey(q))
				args = append(args, queuePrefix(q), now, taskspec.DecidedHeader, len(chunk))
				var handing []string
				for _, i := range chunk {
					keys = append(keys, TaskKey(q, jobs[i].ID))
					args = append(args, jobs[i].ID, jobs[i].Ticket)
					if confirm && jobs[i].Handing != "" {
						// its handing set after every task's hash, its
						// entry after its decision
						handing = append(handing, jobs[i].Handing)
						args = append(args, jobs[i].Entry)
					} else {
						args = append(args, "")
					}
				}
				keys = append(keys, handing...)
				res, err := lua.Handover.Run(ctx, client, keys, args...).Result()
				arr, ok := res.([]any)
				if err != nil || !ok || len(arr) != len(chunk) {
					for _, i := range chunk {
						out[i] = waitroom.Failed
					}
					continue
				}
				for k, i := range chunk {
					switch v, _ := arr[k].(int64); v {
					case 1, 2:
						out[i] = waitroom.Handed
					case 11, 12:
						out[i] = waitroom.Confirmed
					case 0, 3:
						out[i] = waitroom.Gone
					default:
						out[i] = waitroom.Failed
					}
				}
			}
		}
		return out
	}
}

// Tasks returns the waiting room's lookup of the tasks of jobs that arrived
// to wait and joined no line (waitroom.TaskLookup), through asynq's
// Inspector: a task is parked when asynq's schedule holds it with the
// job's tenant in its header (as queue.Client parks it).
func Tasks(inspector *asynq.Inspector) waitroom.TaskLookup {
	return func(ctx context.Context, tenant string, jobs []waitroom.Waiter) ([]waitroom.TaskState, error) {
		out := make([]waitroom.TaskState, len(jobs))
		for i, j := range jobs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			info, err := inspector.GetTaskInfo(j.Queue, j.ID)
			switch {
			case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
				out[i] = waitroom.TaskMissing
			case err != nil:
				return nil, fmt.Errorf("look up task %q of queue %q: %w", j.ID, j.Queue, err)
			case info.State == asynq.TaskStateScheduled && info.Headers[taskspec.TenantHeader] == tenant:
				out[i] = waitroom.TaskParked
			default:
				out[i] = waitroom.TaskElsewhere
			}
		}
		return out, nil
	}
}

// Bounds of one Repark call.
const (
	reparkChunk = 500
	// ReparkMax is the most parked tasks of a queue one sweep looks at.
	ReparkMax = 5000
)

// Repark returns the waiting room's push of parked tasks' fallbacks
// (waitroom.Repark) over asynq's Redis client: of the tasks in queue's
// schedule that come due within within (Redis time), earliest first and at
// most ReparkMax of them, those queue.Client parked
// (taskspec.ParkedHeader) for a tenant that has a line (inLine) are
// scheduled again at by from now (lua/repark.lua). A task a producer
// scheduled itself, or one parked for a tenant without a line (its job is
// in no line: its fallback is what runs it), is left alone.
func Repark(client redis.UniversalClient) waitroom.Repark {
	return func(ctx context.Context, queue string, within, by time.Duration, inLine func(tenant string) bool) (int, error) {
		key := queuePrefix(queue) + "scheduled"
		now, err := client.Time(ctx).Result()
		if err != nil {
			return 0, fmt.Errorf("repark tasks of queue %q: %w", queue, err)
		}
		max := strconv.FormatInt(now.Add(within).Unix(), 10)
		pushed, skipped := 0, 0
		for examined := 0; examined < ReparkMax; {
			ids, err := client.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: max, Offset: int64(skipped), Count: reparkChunk}).Result()
			if err != nil {
				return pushed, fmt.Errorf("repark tasks of queue %q: %w", queue, err)
			}
			if len(ids) == 0 {
				break
			}
			examined += len(ids)
			keys := make([]string, 0, 1+len(ids))
			args := make([]any, 0, 4+len(ids))
			keys = append(keys, key)
			args = append(args, "read", int64(within/time.Second), taskspec.TenantHeader, taskspec.ParkedHeader)
			for _, id := range ids {
				keys = append(keys, TaskKey(queue, id))
				args = append(args, id)
			}
			res, err := lua.Repark.Run(ctx, client, keys, args...).StringSlice()
			if err != nil || len(res) != len(ids) {
				return pushed, fmt.Errorf("repark tasks of queue %q: read: unexpected reply %v (%v)", queue, res, err)
			}
			pkeys := []string{key}
			pargs := []any{"push", int64(within / time.Second), int64(by / time.Second)}
			for i, tenant := range res {
				if tenant != "" && inLine(tenant) {
					pkeys = append(pkeys, TaskKey(queue, ids[i]))
					pargs = append(pargs, ids[i])
				} else {
					skipped++
				}
			}
			if len(pkeys) > 1 {
				n, err := lua.Repark.Run(ctx, client, pkeys, pargs...).Int()
				if err != nil {
					return pushed, fmt.Errorf("repark tasks of queue %q: push: %w", queue, err)
				}
				pushed += n
				// a task not pushed (run or promoted meanwhile) left the
				// range, or is examined again: either way, on
			}
		}
		return pushed, nil
	}
}
