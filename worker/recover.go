package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/asynqroom"
	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/throttle"
)

// The recoverer gives the asynq tasks nobody runs any more back to their
// queues within about a lease, where asynq's own recoverer takes one to
// two minutes (a 30 s lease, swept every minute) and counts a retry.
//
// Each Server registers its process in Redis (internal/fleet, through throttle.Limiter.Fleet) with a lease
// (Config.RecoverLease) it renews every lease/3, and records the asynq
// task ids it runs (and their queues) as jobs enter and leave the gate.
// One process of the fleet at a time, the holder of a lock in Redis,
// checks every second:
//
//   - for processes whose lease ran out (a SIGKILL, a crash, a frozen VM):
//     their recorded tasks that are still active in asynq, and that no
//     live process has recorded since, go back to their pending lists at
//     once (internal/asynqroom.Recover), and the process is forgotten;
//   - every other second, for orphans: tasks in asynq's active list that no
//     registered process has recorded and whose asynq lease nobody has
//     extended for orphanAfter (asynq's workers extend theirs every 5 s).
//     A Redis restart leaves them: a job that ended while Redis was down,
//     whose completion asynq could not write, or a dequeue whose reply was
//     lost. They go back the same way, if their lease is still the one seen.
//
// A task given back is not charged a retry (see lua/recover.lua; at most
// asynqroom.RecoverMax times per task, then asynq's recoverer has it). It
// runs again at least once: a job whose worker was only paused longer than
// the lease (GC, a frozen VM) runs twice. Its concurrency slot is held by
// the job's identity, so its new admission keeps the same slot under a new
// claim; the paused worker's claim is then fenced off.
//
// Redis commands: a beat (one script) per process every lease/3; per job,
// its start and end recorded in one pipeline shared by every job that
// started or ended meanwhile, at most every recordEvery (a job that starts
// and ends between two flushes costs nothing); for the fleet, one check
// script a second by the lock holder, and every other second a read of
// each queue's asynq lease set (ZRANGE, as large as the jobs running). A graceful shutdown leaves
// the registry (one script).

// RecoverLeaseDefault is Config.RecoverLease's default.
const RecoverLeaseDefault = 15 * time.Second

const (
	// checkEvery is how often the lock holder checks for lapsed processes.
	checkEvery = time.Second
	// orphanAfter is how long a task's asynq lease must stay unchanged
	// before a task nobody recorded counts as an orphan: two missed asynq
	// heartbeats (5 s each).
	orphanAfter = 10 * time.Second
	// lapsedPerCheck bounds the lapsed processes one check returns.
	lapsedPerCheck = 16
	// recordEvery is the least time between two writes of a process's
	// records: the jobs that started or ended meanwhile share one
	// pipeline, and a job that starts and ends within it is never written.
	// A worker killed before its job's start was written leaves that job
	// to the orphan check (orphanAfter), as one killed before the write
	// came back always did.
	recordEvery = 50 * time.Millisecond
)

const errRecover = "recover"

// recoverer is one process's part: its registration, its records, and,
// while it holds the lock, the fleet's recovery. Its methods are safe on
// a nil recoverer (a gate used without Server records nothing).
type recoverer struct {
	g      *Gate
	fleet  *fleet.Registry
	asynq  redis.UniversalClient
	id     string
	lease  time.Duration
	queues []string
	// admin is the HOST:PORT of the process's admin endpoints, recorded
	// with its beats for sluice dashboard (Config.Admin)
	admin string

	recovered *prometheus.CounterVec
	declared  prometheus.Counter

	on        atomic.Bool // started and not stopped: jobs are recorded
	leader    atomic.Bool
	mu        sync.Mutex
	running   map[string]string   // what this process runs now: task id -> queue
	dirty     map[string]struct{} // task ids whose record may differ from running
	written   map[string]bool     // task ids recorded in Redis (the flusher's view)
	epoch     int                 // bumped when the records in Redis were dropped
	wake      chan struct{}
	stop      context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	stopOnce  sync.Once

	// the lock holder's view of the asynq leases (queue -> task -> seen)
	seen map[string]map[string]leaseSeen
	// the queues the fleet serves, for the lock holder's forwarder and
	// line samples
	fq fleetQueues

	// contact is when this process last reached Redis (a beat or a check);
	// grace is until when it takes no process for dead: after it could not
	// reach Redis for a while, neither could the others, most likely, and
	// their leases lapsed with no fault of theirs.
	cmu     sync.Mutex
	contact time.Time
	grace   time.Time
}

type leaseSeen struct {
	score string
	since time.Time
	left  bool // given back too often: left to asynq's recoverer
}

func newRecoverer(g *Gate, lim *throttle.Limiter, asynqRedis redis.UniversalClient, lease time.Duration, admin string, reg prometheus.Registerer) (*recoverer, error) {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	r := &recoverer{
		g:       g,
		fleet:   fleet.Of(lim),
		asynq:   asynqRedis,
		id:      fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		lease:   lease,
		admin:   admin,
		running: map[string]string{},
		dirty:   map[string]struct{}{},
		written: map[string]bool{},
		wake:    make(chan struct{}, 1),
		seen:    map[string]map[string]leaseSeen{},
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_recovered_total",
			Help: "asynq tasks this worker gave back to their queues while it held the recoverer's lock, by reason (dead_worker: their process's lease ran out; orphan: active in asynq, run by nobody, e.g. after a Redis restart; too_often: given back too often already, left to asynq's recoverer).",
		}, []string{"reason"}),
		declared: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_worker_taken_for_dead_total",
			Help: "Times this worker found itself taken for dead (it went a whole RecoverLease without a beat): the jobs it ran may have been given back and run a second time.",
		}),
	}
	for _, c := range []prometheus.Collector{r.recovered, r.declared} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, reason := range []string{"dead_worker", "orphan", "too_often"} {
		r.recovered.WithLabelValues(reason)
	}
	return r, nil
}

// follower reports whether another process of the fleet holds the
// recoverer's lock, and with it the fleet's polling (the pump's index
// reads, the lines' samples, the forwarder): false without a recoverer.
func (r *recoverer) follower() bool {
	return r != nil && r.on.Load() && !r.leader.Load()
}

// lockTTL is the life of the recoverer's lock: the holder renews it every
// check; when it dies, another process takes it at its next beat, before
// the dead holder's own lease runs out.
func (r *recoverer) lockTTL() time.Duration { return max(3*checkEvery, r.lease/3) }

// started records the job of ctx as run by this process until the
// returned function is called (its handler returned).
func (r *recoverer) started(ctx context.Context) func() {
	if r == nil || !r.on.Load() {
		return func() {}
	}
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	if id == "" {
		return func() {}
	}
	r.mu.Lock()
	r.running[id] = queue
	r.dirty[id] = struct{}{}
	r.mu.Unlock()
	r.signal()
	return func() {
		r.mu.Lock()
		delete(r.running, id)
		r.dirty[id] = struct{}{}
		r.mu.Unlock()
		r.signal()
	}
}

func (r *recoverer) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// start registers the process (its first beat, made before it takes
// jobs) and runs its beats, its records, the lock holder's checks and its
// forwarder until stop.
func (r *recoverer) start(queues []string) {
	if r == nil {
		return
	}
	r.startOnce.Do(func() {
		r.queues = queues
		ctx, cancel := context.WithCancel(context.Background())
		r.stop = cancel
		r.beat(ctx, true)
		r.on.Store(true)
		r.wg.Add(4)
		go func() { defer r.wg.Done(); r.beats(ctx) }()
		go func() { defer r.wg.Done(); r.records(ctx) }()
		go func() { defer r.wg.Done(); r.checks(ctx) }()
		go func() { defer r.wg.Done(); r.forwards(ctx, DelayedTaskCheckIntervalDefault) }()
	})
}

// leave stops the recoverer and takes the process out of the registry:
// call it once asynq has stopped and the handlers have returned (or been
// given up on: asynq has put their jobs back in the queue).
func (r *recoverer) leave() {
	if r == nil || r.stop == nil {
		return
	}
	r.stopOnce.Do(func() {
		r.on.Store(false)
		r.stop()
		r.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), r.g.cfg.CallTimeout)
		defer cancel()
		if err := r.fleet.Leave(ctx, r.id); err != nil {
			r.g.m.err(errRecover)
			r.g.log.Warn("cannot leave fleet registry", "worker", r.id, "err", err)
		}
	})
}

func (r *recoverer) beats(ctx context.Context) {
	every(ctx, r.lease/3, func() { r.beat(ctx, false) })
}

// beat renews the process's lease. A process found unregistered after its
// first beat was taken for dead: its records may be gone, so it records
// what it runs again, and says so.
func (r *recoverer) beat(ctx context.Context, first bool) {
	cctx, cancel := context.WithTimeout(ctx, min(r.g.cfg.CallTimeout, r.lease/3))
	rejoined, leader, err := r.fleet.Beat(cctx, r.id, r.admin, r.lease, r.lockTTL(), r.queues)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.g.m.err(errRecover)
			r.g.warn(errRecover, "cannot renew worker lease in fleet registry", "worker", r.id, "lease", r.lease, "err", err)
		}
		return
	}
	r.reached()
	r.leader.Store(leader)
	if rejoined && !first {
		r.declared.Inc()
		r.g.log.Warn("worker was taken for dead; its jobs may run twice", "worker", r.id, "lease", r.lease)
		r.mu.Lock()
		clear(r.written)
		r.epoch++
		for id := range r.running {
			r.dirty[id] = struct{}{}
		}
		r.mu.Unlock()
		r.signal()
	}
}

// reached notes a call to Redis that went through. One after a silence
// longer than a beat's interval (Redis down or frozen, this process
// paused: the others' beats may have failed as long, and their leases
// lapsed through no fault of theirs) opens a grace of a beat's interval
// and two checks, in which no process is taken for dead: the others beat
// again within it.
func (r *recoverer) reached() {
	now := time.Now()
	r.cmu.Lock()
	defer r.cmu.Unlock()
	if !r.contact.IsZero() && now.Sub(r.contact) > max(r.lease/3, checkEvery)+500*time.Millisecond {
		r.grace = now.Add(r.lease/3 + 2*checkEvery)
	}
	r.contact = now
}

// inGrace reports whether the grace reached opened still runs.
func (r *recoverer) inGrace() bool {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	return time.Now().Before(r.grace)
}

// records writes what the process runs, one pipeline per round and at
// most every recordEvery, until ctx ends; then once more, so that a
// graceful shutdown leaves nothing behind.
func (r *recoverer) records(ctx context.Context) {
	final := func() {
		fctx, cancel := context.WithTimeout(context.Background(), r.g.cfg.CallTimeout)
		r.flush(fctx)
		cancel()
	}
	backoff := 100 * time.Millisecond
	gap := time.NewTimer(0)
	defer gap.Stop()
	for {
		select {
		case <-ctx.Done():
			final()
			return
		case <-r.wake:
		}
		// the jobs that start or end before the gap is over go with these
		select {
		case <-ctx.Done():
			final()
			return
		case <-gap.C:
		}
		gap.Reset(recordEvery)
		if err := r.flush(ctx); err != nil && ctx.Err() == nil {
			r.g.m.err(errRecover)
			r.g.warn(errRecover, "cannot record running jobs", "worker", r.id, "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			backoff = min(2*backoff, time.Second)
			r.signal()
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// flush makes the records in Redis what the process runs: a job that
// started is recorded, one that ended is forgotten, and one that started
// and ended since the last flush costs nothing. What fails is tried again.
func (r *recoverer) flush(ctx context.Context) error {
	r.mu.Lock()
	run := map[string]string{}
	var done []string
	batch, epoch := r.dirty, r.epoch
	r.dirty = map[string]struct{}{}
	for id := range batch {
		q, ok := r.running[id]
		switch {
		case ok && !r.written[id]:
			run[id] = q
		case !ok && r.written[id]:
			done = append(done, id)
		}
	}
	r.mu.Unlock()
	if len(run) == 0 && len(done) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.g.cfg.CallTimeout)
	err := r.fleet.Record(cctx, r.id, run, done)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		for id := range batch {
			r.dirty[id] = struct{}{}
		}
		return err
	}
	if epoch != r.epoch {
		return nil // dropped meanwhile: every running job is dirty again
	}
	for id := range run {
		r.written[id] = true
	}
	for _, id := range done {
		delete(r.written, id)
	}
	return nil
}

// checks runs the lock holder's checks every checkEvery, while this
// process holds the lock (its beats say when it took it).
func (r *recoverer) checks(ctx context.Context) {
	n := 0
	every(ctx, checkEvery, func() {
		n++
		if !r.leader.Load() {
			clear(r.seen)
			return
		}
		if err := r.check(ctx, n%2 == 1); err != nil && ctx.Err() == nil {
			r.g.m.err(errRecover)
			r.g.warn(errRecover, "recoverer error; retrying", "worker", r.id, "err", err)
		}
	})
}

// check gives back the tasks of lapsed processes and, with orphans, the
// orphans.
func (r *recoverer) check(ctx context.Context, orphans bool) error {
	cctx, cancel := context.WithTimeout(ctx, r.g.cfg.CallTimeout)
	defer cancel()
	leader, lapsed, err := r.fleet.Check(cctx, r.id, r.lockTTL(), lapsedPerCheck)
	if err != nil {
		return err
	}
	r.reached()
	if !leader {
		r.leader.Store(false)
		clear(r.seen)
		return nil
	}
	// Giving tasks back writes asynq's keys: not before the layout is
	// known to be the one lua/recover.lua writes.
	if ok, err := r.g.layout.Checked(); !ok || err != nil {
		return nil
	}
	// This process's own lease may lapse when its beats fail; it is alive,
	// and its next beat registers it again.
	lapsed = slices.DeleteFunc(lapsed, func(p string) bool { return p == r.id })
	if len(lapsed) > 0 && !r.inGrace() {
		if err := r.recoverDead(cctx, lapsed); err != nil {
			return err
		}
	}
	if orphans && !r.inGrace() {
		return r.recoverOrphans(cctx)
	}
	return nil
}

// recoverDead gives back the recorded tasks of the lapsed processes that
// no live process has recorded since (asynq may have given one back and
// another worker run it), then forgets the lapsed processes.
func (r *recoverer) recoverDead(ctx context.Context, lapsed []string) error {
	members, err := r.fleet.Members(ctx)
	if err != nil {
		return err
	}
	live := slices.DeleteFunc(members, func(p string) bool { return slices.Contains(lapsed, p) })
	for _, dead := range lapsed {
		jobs, err := r.fleet.Jobs(ctx, dead)
		if err != nil {
			return err
		}
		ids := make([]string, 0, len(jobs))
		for id := range jobs {
			ids = append(ids, id)
		}
		held, err := r.fleet.Held(ctx, live, ids)
		if err != nil {
			return err
		}
		byQueue := map[string][]asynqroom.Orphan{}
		for id, q := range jobs {
			if !held[id] {
				byQueue[q] = append(byQueue[q], asynqroom.Orphan{ID: id})
			}
		}
		given, err := r.giveBack(ctx, byQueue, "dead_worker")
		if err != nil {
			return err
		}
		if _, err := r.fleet.Drop(ctx, r.id, dead); err != nil {
			return err
		}
		r.g.log.Info("dead worker's jobs given back", "dead", dead, "lease", r.lease, "recorded", len(jobs), "given_back", given)
	}
	return nil
}

// recoverOrphans reads the asynq leases of the fleet's queues, and gives
// back the tasks whose lease stayed unchanged for orphanAfter and that no
// registered process has recorded.
func (r *recoverer) recoverOrphans(ctx context.Context) error {
	queues, err := r.fleet.Queues(ctx)
	if err != nil {
		return err
	}
	for _, q := range r.queues {
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	now := time.Now()
	candidates := map[string][]asynqroom.Orphan{}
	var ids []string
	for _, q := range queues {
		leases, err := asynqroom.Leases(ctx, r.asynq, q)
		if err != nil {
			return err
		}
		seen := r.seen[q]
		if seen == nil {
			seen = map[string]leaseSeen{}
			r.seen[q] = seen
		}
		for id := range seen {
			if _, ok := leases[id]; !ok {
				delete(seen, id)
			}
		}
		for id, score := range leases {
			s, ok := seen[id]
			if !ok || s.score != score {
				seen[id] = leaseSeen{score: score, since: now}
				continue
			}
			if !s.left && now.Sub(s.since) >= orphanAfter {
				candidates[q] = append(candidates[q], asynqroom.Orphan{ID: id, Lease: score})
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return nil
	}
	members, err := r.fleet.Members(ctx)
	if err != nil {
		return err
	}
	held, err := r.fleet.Held(ctx, members, ids)
	if err != nil {
		return err
	}
	for q, tasks := range candidates {
		candidates[q] = slices.DeleteFunc(tasks, func(o asynqroom.Orphan) bool { return held[o.ID] })
	}
	given, err := r.giveBack(ctx, candidates, "orphan")
	if given > 0 {
		r.g.log.Info("orphaned active tasks given back", "given_back", given, "unextended_for", orphanAfter)
	}
	return err
}

// giveBack gives the tasks back, queue by queue, and counts them under
// reason; it returns how many went back.
func (r *recoverer) giveBack(ctx context.Context, byQueue map[string][]asynqroom.Orphan, reason string) (int, error) {
	given := 0
	for q, tasks := range byQueue {
		if len(tasks) == 0 {
			continue
		}
		res, err := asynqroom.Recover(ctx, r.asynq, q, tasks)
		for i, v := range res {
			switch v {
			case asynqroom.GivenBack:
				given++
				r.recovered.WithLabelValues(reason).Inc()
				delete(r.seen[q], tasks[i].ID)
			case asynqroom.TooOften:
				r.recovered.WithLabelValues("too_often").Inc()
				if s, ok := r.seen[q][tasks[i].ID]; ok {
					s.left = true
					r.seen[q][tasks[i].ID] = s
				}
			}
		}
		if err != nil {
			return given, err
		}
	}
	return given, nil
}
