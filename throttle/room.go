package throttle

import (
	"context"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/crashpoint"
	"github.com/sluicehq/sluice/lua"
)

// room is the waiting room (docs/architecture.md, "The waiting room"),
// waitroom.Room: the tenants' lines of jobs that may not start yet, the
// promotion of a line's head when it may, and the index of which lines
// are due when. It decides with the limiter's engine, in admit.lua's
// arrive, promote and release ops.
type room struct {
	l *Limiter

	// alone remembers, for a short while (aloneFor), the tenants of a
	// queue that found no other tenant due when a job of theirs freed a
	// slot (turnOf): a tenant alone on a saturated fleet hands its slots
	// on without asking each time
	mu    sync.Mutex
	alone map[string]time.Time
	// queued remembers, for a short while (queuedFor), the tenants of a
	// queue whose release found jobs waiting in their line for its slot:
	// on one server the next releases of theirs go straight to the
	// hand-on, without the small release that would most likely say so
	// again, until queuedFor has passed (the line may no longer wait for
	// a slot by then) or a hand-on finds the line empty
	queued map[string]time.Time
	// crowds are, per queue, what the turns this process asked found
	// (turnOf)
	crowds map[string]*crowd
	// engine is the queue engine's layout a pump of this room was given
	// (PumpConfig.Engine): a release's hand-on hands its job over in its
	// run too
	engine atomic.Pointer[waitroom.EngineLayout]
}

// The limiter's waiting room is what sluice's queue and worker packages
// drive (an application enqueues and runs jobs with them, and never calls
// the room itself): they reach it through waitroom.Of.
func init() {
	waitroom.Of = func(l any) waitroom.Room { return l.(*Limiter).room() }
}

// room is the limiter's waiting room as its own type.
func (l *Limiter) room() *room { return &room{l: l} }

var _ waitroom.Room = (*room)(nil)

// aloneFor is how long a release trusts that no other tenant was due: a
// tenant that becomes due meanwhile waits at most that much longer for a
// slot.
const aloneFor = 50 * time.Millisecond

// queuedFor is how long a release trusts that its tenant's line still
// waits for its slots, unless a hand-on finds it empty first. Trusted
// wrongly (other processes emptied the line, or it no longer waits for a
// slot), it costs a release the hand-on's script runs rather than the
// small release's one, and the first release after it asks again.
const queuedFor = time.Second

// crowd is what the turns a process asked of a queue's index found: in a
// room where some other tenant is due before the releasing one nearly
// every time (many tenants wait in turn), a release gives its slot back
// and makes its tenant due, as a turn not its own does, without asking
// (turnOf). Every crowdAsk-th release of a crowd still asks, and a turn
// that finds no other tenant due ends the crowd at once; the answers of
// crowdSpan asks decide again whether the room is crowded, and a crowd
// lasts crowdFor at the most without them.
type crowd struct {
	asked, first int       // the turns asked since the last decision, and those that were the tenant's
	until        time.Time // crowded until then (zero: not crowded)
	n            int       // releases while crowded
	total        int       // turns asked, ever (tests)
}

const (
	// crowdSpan is how many turns asked decide whether a room is crowded:
	// it is when at most one in crowdShare was the releasing tenant's.
	crowdSpan  = 32
	crowdShare = 8
	// crowdAsk: a crowded room's releases ask one in crowdAsk turns.
	crowdAsk = 8
	// crowdFor is how long a room stays crowded without new answers.
	crowdFor = 250 * time.Millisecond
)

// crowded reports whether a release of queue is to give its slot back
// without asking whose turn it is (crowd).
func (r *room) crowded(queue string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.crowds[queue]
	if c == nil || !time.Now().Before(c.until) {
		return false
	}
	c.n++
	return c.n%crowdAsk != 0
}

// crowdAsked is how many turns of queue were asked since the last
// decision on its crowd, and how many were answered without asking: a
// count that changes with every turnOf that asked (tests).
func (r *room) crowdAsked(queue string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.crowds[queue]
	if c == nil {
		return 0
	}
	return c.total
}

// asked records what a turn of queue that a release asked found.
func (r *room) asked(queue string, first, others bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.crowds == nil {
		r.crowds = map[string]*crowd{}
	}
	c := r.crowds[queue]
	if c == nil {
		if len(r.crowds) >= 1024 {
			r.crowds = map[string]*crowd{}
		}
		c = &crowd{}
		r.crowds[queue] = c
	}
	c.total++
	if !others {
		// nobody else due: not a crowd, whatever the last answers said
		*c = crowd{total: c.total}
		return
	}
	c.asked++
	if first {
		c.first++
	}
	if c.asked >= crowdSpan {
		c.until = time.Time{}
		if c.first*crowdShare <= c.asked {
			c.until = time.Now().Add(crowdFor)
		}
		c.asked, c.first = 0, 0
	}
}

// lately reports whether *m, one of the room's memories, holds key until
// after now.
func (r *room) lately(m *map[string]time.Time, key string) bool {
	r.mu.Lock()
	until, ok := (*m)[key]
	r.mu.Unlock()
	return ok && time.Now().Before(until)
}

// remember sets key in the memory *m until d from now (forgets it when d
// is 0), keeping the memory small.
func (r *room) remember(m *map[string]time.Time, key string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d == 0 {
		delete(*m, key)
		return
	}
	if *m == nil || len(*m) >= 1024 {
		*m = map[string]time.Time{}
	}
	(*m)[key] = time.Now().Add(d)
}

// lineSep separates the fields of a line entry; a queue name may not hold it.
const lineSep = "\x1f"

// Arrive decides whether a new job goes straight to the queue engine: when
// its tenant's line is empty, a.MayGo and every rule lets it start now. A
// job that does not goes to the engine parked (scheduled far ahead) and
// then joins its line (JoinArrived); Arrive records its intent meanwhile,
// so that the pumps' sweep finds it should its producer die before it
// joins. A tenant whose line holds its backlog cap
// already gets a *BacklogError (ErrBacklogFull), and a cost no rule can
// ever admit a *CostError, with nothing written.
func (r *room) Arrive(ctx context.Context, a waitroom.Arrival) (waitroom.Arrived, error) {
	if err := r.checkArrival(a); err != nil {
		return waitroom.Arrived{}, err
	}
	cost := max(a.Cost, 1)
	res, scopes, err := r.arrivalScopes(ctx, a, cost)
	if err != nil {
		return waitroom.Arrived{}, err
	}
	var backlog int64
	if res.Policy != nil {
		backlog = res.Policy.Backlog
	}
	once := r.decidesAll(*res)
	for _, s := range scopes {
		if s.policy != nil && (s.policy.Window != nil || s.policy.Quota != nil) {
			once = false
		}
	}
	flags := flagHold | flagArrive | r.l.noTTLFlag()
	if once {
		flags |= flagOnce
	}
	op := &admitOp{id: a.ID, cost: cost, flags: flags, claim: newClaim()}
	for _, s := range scopes {
		op.scopes = append(op.scopes, opScope{scope: s})
	}
	k := keysFor(r.l.cfg.Prefix, a.Tenant)
	q := queueOf(a.Queue)
	if !a.MayGo {
		return r.arriveToWait(ctx, a, k, q, cost, backlog)
	}
	op.roomKeys = []string{k.line(q), k.intentsAt(a.Priority), k.lineAt(q, priorityHigh), k.lineAt(q, priorityLow)}
	op.roomArgs = []any{boolInt(a.MayGo), backlog, micros(r.l.cfg.PromoteLead), lineTail(waitroom.Waiter{ID: a.ID, Queue: a.Queue, Cost: cost, Key: a.Key})}
	raw, err := r.l.runRaw(ctx, op, -1)
	if err != nil {
		return waitroom.Arrived{}, fmt.Errorf("arrival of tenant %q: %w", a.Tenant, err)
	}
	rep, err := decodeArrive(raw)
	if err != nil {
		return waitroom.Arrived{}, err
	}
	d := waitroom.Arrived{Waiting: rep.waiting, Backlog: backlog, Earlier: rep.earlier}
	switch rep.verdict {
	case arriveFull:
		return d, &BacklogError{Tenant: a.Tenant, Backlog: rep.waiting, Limit: backlog}
	case arriveStraight:
		d.Straight, d.Slot = true, time.UnixMicro(rep.slot)
		lease := leaseOf(scopes)
		if len(rep.undo) > 0 {
			// the charges to take back if the job never reaches the engine
			op.undo = rep.undo
			d.Undo = op
			if lease > 0 {
				d.Claim = op.claim
			}
		}
		if once || rep.late == lateReserved {
			d.Ticket = ticketFor(rep.slot, rep.late, rep.slack, rep.now, lease, d.Claim, printWith(res.fingerprint(), scopes))
		}
	}
	return d, nil
}

// checkArrival says what is wrong with a new job's tenant, queue or
// priority.
func (r *room) checkArrival(a waitroom.Arrival) error {
	if err := validateTenant(a.Tenant); err != nil {
		return err
	}
	if strings.Contains(a.Queue, lineSep) {
		return fmt.Errorf("arrival of tenant %q: queue %q holds the byte 0x1f, which sluice keeps for itself; rename the queue", a.Tenant, a.Queue)
	}
	if err := checkPriority(a.Priority); err != nil {
		return fmt.Errorf("arrival of tenant %q: %w", a.Tenant, err)
	}
	return nil
}

// arrivalScopes are the scopes a new job is decided in, under its
// policies (a.Policies, or resolved now): its tenant's, @global's and its
// key's. It returns a *CostError for a cost a rule of one of them can
// never admit.
func (r *room) arrivalScopes(ctx context.Context, a waitroom.Arrival, cost int64) (*jobPolicies, []scope, error) {
	res := jobPoliciesOf(a.Policies)
	if res == nil {
		rs, err := r.l.policies.policiesFor(ctx, a.Tenant)
		if err != nil {
			return nil, nil, fmt.Errorf("arrival of tenant %q: %w", a.Tenant, err)
		}
		res = &rs
	}
	scopes := r.scopes(a.Tenant, *res)
	if a.Key != "" {
		ks, err := r.l.keyScope(ctx, a.Tenant, a.Key)
		if err != nil {
			return nil, nil, fmt.Errorf("arrival of tenant %q: %w", a.Tenant, err)
		}
		if ks != nil {
			// decided with the tenant's (in its slot), and with its
			// window or quota again at the start
			scopes = slices.Insert(scopes, 1, *ks)
		}
	}
	for _, s := range scopes {
		if f := s.facts; f.maxCost >= 0 && cost > f.maxCost {
			return nil, nil, &CostError{Tenant: a.Tenant, Cost: cost, Max: f.maxCost, Rule: s.name + " " + f.maxCostRule}
		}
	}
	return res, scopes, nil
}

// Park parks a new job's task in the queue engine's schedule and puts the
// job in its line, in one run of park.lua (see waitroom.Room.Park).
func (r *room) Park(ctx context.Context, p waitroom.Parking) (waitroom.Parked, error) {
	if !r.Shares(p.Engine) {
		return waitroom.Parked{}, waitroom.ErrApart
	}
	j := p.Job
	a := waitroom.Arrival{Tenant: p.Tenant, ID: j.ID, Queue: j.Queue, Cost: j.Cost, Priority: j.Priority, Key: j.Key, Policies: p.Policies}
	if err := r.checkArrival(a); err != nil {
		return waitroom.Parked{}, err
	}
	cost := max(j.Cost, 1)
	res, _, err := r.arrivalScopes(ctx, a, cost)
	if err != nil {
		return waitroom.Parked{}, err
	}
	var backlog int64
	if res.Policy != nil {
		backlog = res.Policy.Backlog
	}
	need := res.Pace
	k := keysFor(r.l.cfg.Prefix, p.Tenant)
	q := queueOf(j.Queue)
	keys := []string{k.lineAt(q, j.Priority)}
	for _, o := range priorities {
		if o != j.Priority {
			keys = append(keys, k.lineAt(q, o))
		}
	}
	t := p.Task
	keys = append(keys, k.queues, k.state, t.TaskKey, t.ScheduleKey, t.QueuesKey, k.intentsAt(j.Priority))
	w := waitroom.Waiter{ID: j.ID, Queue: j.Queue, Cost: cost, Key: j.Key}
	// the queue is registered in the engine's list of queues by this
	// process's first park into it, as asynq's client registers it by
	// its first enqueue
	reg := t.QueuesKey + "\x00" + t.Queue
	_, registered := r.l.registered.Load(reg)
	// concurrent parks share a run (parkMerge)
	res2, err := r.l.batch.runMerged(ctx, lua.Park, keys, []any{r.l.clockArg(), 1, backlog, q, lineTail(w), t.ID, t.Msg,
		micros(p.Fallback), 2 * micros(need) * cost, micros(p.MaxPark), t.Queue, boolInt(!registered)}, parkMerge)
	if err != nil {
		return waitroom.Parked{}, fmt.Errorf("park a job of tenant %q: %w", p.Tenant, err)
	}
	ops, ok := res2.([]any)
	if !ok || len(ops) != 1 {
		return waitroom.Parked{}, fmt.Errorf("park.lua: unexpected reply %v", res2)
	}
	v, err := int64s(ops[0], 4)
	if err != nil {
		return waitroom.Parked{}, fmt.Errorf("park.lua: %w", err)
	}
	if v[0] == 0 && !registered {
		r.l.registered.Store(reg, true)
	}
	switch v[0] {
	case parkConflict:
		return waitroom.Parked{Conflict: true}, nil
	case arriveFull:
		return waitroom.Parked{Waiting: v[1]}, &BacklogError{Tenant: p.Tenant, Backlog: v[1], Limit: backlog}
	}
	d := waitroom.Parked{Waiting: v[1], At: time.UnixMicro(v[3])}
	if v[2] == 1 {
		crashpoint.Hit("room.joined")
		// The line began: its tenant is due now. Should this fail, the
		// pumps' sweep finds the line.
		if err := r.mark(ctx, q, p.Tenant); err != nil {
			return d, err
		}
	}
	return d, nil
}

// sameServer reports whether client e is the limiter's own client c, or a
// client of one server and database with it.
func sameServer(e any, c redis.UniversalClient) bool {
	if e == any(c) {
		return true
	}
	a, ok1 := e.(*redis.Client)
	b, ok2 := c.(*redis.Client)
	if !ok1 || !ok2 {
		return false
	}
	oa, ob := a.Options(), b.Options()
	// a Sentinel client's address names no server ("FailoverClient")
	return oa.Network == ob.Network && oa.Addr == ob.Addr && oa.DB == ob.DB && oa.Addr != "FailoverClient"
}

// parkConflict is park.lua's verdict for a job whose task id is taken.
const parkConflict = -2

// parkMerge merges concurrent parks into one park.lua run: its ARGV
// begins with the clock and the number of ops.
var parkMerge = headerMerger{header: 2}

// arriveToWait is Arrive for a job the fleet has no room for: it waits
// whatever its rules say, so wait.lua checks the line's cap and records
// its intent, as admit.lua's arrive op would, without deciding on it.
func (r *room) arriveToWait(ctx context.Context, a waitroom.Arrival, k scopeKeys, q string, cost, backlog int64) (waitroom.Arrived, error) {
	keys := append(k.lines(q), k.intentsAt(a.Priority))
	res, err := lua.Wait.Run(ctx, r.l.client, keys, r.l.clockArg(), backlog, lineTail(waitroom.Waiter{ID: a.ID, Queue: a.Queue, Cost: cost, Key: a.Key})).Result()
	if err != nil {
		return waitroom.Arrived{}, fmt.Errorf("arrival of tenant %q: %w", a.Tenant, err)
	}
	v, err := int64s(res, 3)
	if err != nil {
		return waitroom.Arrived{}, fmt.Errorf("wait.lua: %w", err)
	}
	d := waitroom.Arrived{Waiting: v[1], Backlog: backlog, Earlier: v[2] == 1}
	if v[0] == arriveFull {
		return d, &BacklogError{Tenant: a.Tenant, Backlog: v[1], Limit: backlog}
	}
	return d, nil
}

// leaseOf is the concurrency lease a job in these scopes holds; 0 when
// it takes no concurrency slot.
func leaseOf(scopes []scope) time.Duration {
	var lease time.Duration
	for _, s := range scopes {
		lease = max(lease, s.facts.lease)
	}
	return lease
}

// decidesAll reports whether the room's decision on a job is final and
// travels with it (flagOnce): when the room decides on every scope the
// gate would (not on a Cluster with @global rules, where the room sees the
// tenant's slot alone), and the policies have rates and concurrency rules
// alone. A window or a quota is decided again when the job starts (on the
// reservation the room takes), since a job late for its slot would be
// charged twice there.
func (r *room) decidesAll(res jobPolicies) bool {
	if r.l.cluster && res.Global.HasRules() {
		return false
	}
	for _, p := range []*Policy{res.Policy, res.Global} {
		if p != nil && (p.Window != nil || p.Quota != nil) {
			return false
		}
	}
	return true
}

// TakeBack gives back what a straight arrival took (its slot and its
// concurrency slot), for a job the queue engine refused. A slot another
// admission of the job has taken over since is left to it.
func (r *room) TakeBack(ctx context.Context, d waitroom.Arrived) error {
	op0, _ := d.Undo.(*admitOp)
	if op0 == nil {
		return nil
	}
	op := *op0
	op.flags = flagUndoOnly | r.l.noTTLFlag()
	op.roomKeys, op.roomArgs = nil, nil
	if _, err := r.l.run(ctx, &op, -1); err != nil {
		return fmt.Errorf("take back the arrival of job %q: %w", op.id, err)
	}
	return nil
}

// scopes are the scopes the room decides a tenant's jobs in: the tenant's
// (even without rules: its line's turn is kept there), and @global's where
// one script sees both (not on a Cluster, where @global is left to the
// gate when the job starts).
func (r *room) scopes(tenant string, res jobPolicies) []scope {
	scopes := r.l.scopesOf(tenant, res)
	if r.l.cluster && len(scopes) > 1 {
		scopes = scopes[:1]
	}
	return scopes
}

// Join puts jobs of one queue in tenant's line of that queue, in order,
// once their tasks are in the queue engine (parked). When the line holds
// backlog jobs (0: no cap) the rest do not join: joined counts those that
// did; a caller takes the others out of the engine again. A line that
// begins here makes its tenant due in the queue's index at once. Jobs join
// joinChunk at a time, one line.lua call each (a batch of any length joins
// in bounded memory); the cap holds across the calls, and on an error the
// first joined jobs are in the line.
func (r *room) Join(ctx context.Context, tenant string, backlog int64, jobs ...waitroom.Waiter) (joined int, waiting int64, err error) {
	return r.join(ctx, tenant, backlog, joinAll, jobs)
}

// JoinArrived is Join for jobs Arrive told to wait: Arrive recorded each
// one's intent, which its joining takes back. A job whose intent is gone
// is in its line already (Rejoin took it: its producer seemed to have died
// before joining it) and counts as joined without joining twice.
func (r *room) JoinArrived(ctx context.Context, tenant string, backlog int64, jobs ...waitroom.Waiter) (joined int, waiting int64, err error) {
	return r.join(ctx, tenant, backlog, joinArrived, jobs)
}

// Rejoin puts in tenant's line the jobs that arrived to wait and joined no
// line (their intents are there): their producer died between parking them
// in the queue engine and joining them, or its join and the clean-up after
// it both failed. The caller has checked that their tasks are parked. A
// job without an intent (it joined, or another Rejoin took it) is left
// out: joined counts those that joined now. The line's backlog cap does
// not apply: the jobs' tasks exist.
func (r *room) Rejoin(ctx context.Context, tenant string, jobs ...waitroom.Waiter) (joined int, err error) {
	joined, _, err = r.join(ctx, tenant, 0, joinIntended, jobs)
	return joined, err
}

// Forget drops the intents of jobs Arrive told to wait that will not
// join their line (the queue engine refused their tasks, or took them out
// again), so that the sweep does not look for them.
func (r *room) Forget(ctx context.Context, tenant string, jobs ...waitroom.Waiter) error {
	if err := validateTenant(tenant); err != nil {
		return err
	}
	if len(jobs) == 0 {
		return nil
	}
	k := keysFor(r.l.cfg.Prefix, tenant)
	members := map[string][]any{}
	for _, j := range jobs {
		key := k.intentsAt(j.Priority)
		members[key] = append(members[key], lineTail(j))
	}
	pipe := r.l.client.Pipeline()
	for key, ms := range members {
		pipe.ZRem(ctx, key, ms...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("forget the intents of tenant %q: %w", tenant, err)
	}
	return nil
}

// Modes of line.lua (its ARGV[4]).
const (
	joinAll      = 0
	joinArrived  = 1
	joinIntended = 2
)

func (r *room) join(ctx context.Context, tenant string, backlog int64, mode int, jobs []waitroom.Waiter) (joined int, waiting int64, err error) {
	if err := validateTenant(tenant); err != nil {
		return 0, 0, err
	}
	if len(jobs) == 0 {
		return 0, 0, nil
	}
	queue := queueOf(jobs[0].Queue)
	for _, j := range jobs {
		if queueOf(j.Queue) != queue {
			return 0, 0, fmt.Errorf("line of tenant %q: jobs of queues %q and %q join apart", tenant, queue, queueOf(j.Queue))
		}
		if strings.Contains(j.Queue, lineSep) {
			return 0, 0, fmt.Errorf("line of tenant %q: queue %q holds the byte 0x1f, which sluice keeps for itself; rename the queue", tenant, j.Queue)
		}
		if err := checkPriority(j.Priority); err != nil {
			return 0, 0, fmt.Errorf("line of tenant %q: job %q: %w", tenant, j.ID, err)
		}
		if j.Key != "" {
			if err := validateKey(j.Key); err != nil {
				return 0, 0, fmt.Errorf("line of tenant %q: job %q: %w", tenant, j.ID, err)
			}
		}
	}
	k := keysFor(r.l.cfg.Prefix, tenant)
	for len(jobs) > 0 {
		// a call joins jobs of one priority level: a run of them, in order
		n := 1
		for n < min(len(jobs), joinChunk) && jobs[n].Priority == jobs[0].Priority {
			n++
		}
		chunk := jobs[:n]
		jobs = jobs[len(chunk):]
		args := make([]any, 0, 4+len(chunk))
		args = append(args, r.l.clockArg(), backlog, queue, mode)
		for _, j := range chunk {
			args = append(args, lineTail(j))
		}
		p := chunk[0].Priority
		keys := []string{k.lineAt(queue, p), k.queues, k.intentsAt(p)}
		for _, o := range priorities {
			if o != p {
				keys = append(keys, k.lineAt(queue, o))
			}
		}
		keys = append(keys, k.state)
		res, err := lua.Line.Run(ctx, r.l.client, keys, args...).Result()
		if err != nil {
			return joined, waiting, fmt.Errorf("line of tenant %q: %w", tenant, err)
		}
		v, err := int64s(res, 3)
		if err != nil {
			return joined, waiting, fmt.Errorf("line.lua: %w", err)
		}
		joined, waiting = joined+int(v[0]), v[1]
		if v[2] == 1 {
			crashpoint.Hit("room.joined")
			// The line began (or its jobs all waited for their keys): its
			// tenant is due now. Should this fail, the pumps' sweep finds
			// the line.
			if err := r.mark(ctx, queue, tenant); err != nil {
				return joined, waiting, err
			}
		}
		if int(v[0]) < len(chunk) && mode != joinIntended {
			break // the line is at its cap
		}
	}
	return joined, waiting, nil
}

// checkPriority says what is wrong with a job's priority level.
func checkPriority(p int) error {
	if p < priorityLow || p > priorityHigh {
		return fmt.Errorf("priority %d: must be 1 (high), 0 (normal) or -1 (low)", p)
	}
	return nil
}

// joinChunk is how many jobs one line.lua call puts in a line.
const joinChunk = 1000

// queueOf names the default queue.
func queueOf(q string) string {
	if q == "" {
		return waitroom.DefaultQueue
	}
	return q
}

// lineTail is a line entry after its time: COST␟QUEUE␟ID, the cost empty
// for 1 and the queue for the default; a job with a key has /KEY after
// its cost.
func lineTail(j waitroom.Waiter) string {
	cost := ""
	if j.Cost > 1 {
		cost = strconv.FormatInt(j.Cost, 10)
	}
	if j.Key != "" {
		cost += keySep + j.Key
	}
	q := j.Queue
	if q == waitroom.DefaultQueue {
		q = ""
	}
	return cost + lineSep + q + lineSep + j.ID
}

// promote gives tenant's line of queue a turn: its head jobs are promoted
// while they may start, at most budget of them, and as much cost as
// quantum plus what the tenant is owed from earlier turns (deficit round
// robin).
func (r *room) promote(ctx context.Context, tenant, queue string, budget int, quantum int64) (waitroom.Turn, error) {
	return r.turn(ctx, tenant, queue, "", 0, budget, quantum, flagPromote)
}

// release gives back the concurrency slots job id holds under claim and in
// the same run promotes at most budget jobs from the head of the tenant's
// line of queue into them.
func (r *room) release(ctx context.Context, tenant, queue, id string, claim uint64, budget int) (waitroom.Turn, error) {
	return r.turn(ctx, tenant, queue, id, claim, budget, int64(budget), flagRelease)
}

func (r *room) turn(ctx context.Context, tenant, queue, id string, claim uint64, budget int, quantum int64, kind int) (waitroom.Turn, error) {
	tt, err := r.turnOp(ctx, tenant, queue, id, claim, budget, quantum, kind)
	if err != nil {
		return waitroom.Turn{}, err
	}
	if kind == flagRelease && budget > 0 {
		r.handInRun(tt, queue, r.engine.Load())
	}
	raw, err := r.l.runRaw(ctx, tt.op, -1)
	return tt.decode(raw, err)
}

// handInRun has turn tt hand the jobs it promotes over to the queue engine
// in its own run, when the engine's layout is known (engine not nil), the
// room is on one server and the tenant has no key policies (a key's scope
// changes a job's ticket: those go through the Handover).
func (r *room) handInRun(tt *turnCall, queue string, engine *waitroom.EngineLayout) {
	if engine != nil && !r.l.cluster && tt.op.keyed == nil {
		tt.op.engine = []any{engine.Prefix(queueOf(queue)), engine.Header,
			strconv.FormatUint(uint64(printWith(tt.fp, tt.scopes)), 10), micros(leaseOf(tt.scopes))}
	}
}

// turnCall is a turn's admit.lua op and what reading its reply needs.
type turnCall struct {
	r      *room
	tenant string
	op     *admitOp
	scopes []scope
	once   bool
	fp     uint32
}

// turnOp is the op of a turn of tenant's line of queue (turn).
func (r *room) turnOp(ctx context.Context, tenant, queue, id string, claim uint64, budget int, quantum int64, kind int) (*turnCall, error) {
	if err := validateTenant(tenant); err != nil {
		return nil, err
	}
	res, err := r.l.policies.policiesFor(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("turn of tenant %q: %w", tenant, err)
	}
	// A release here hands the slot on (Room.Release gave back what no line
	// waits for with release.lua): on a Cluster it is the tenant's slot
	// alone, @global's having gone back on its own.
	scopes := r.scopes(tenant, res)
	if kind == flagPromote {
		claim = newClaim()
	}
	flags := flagHold | kind | r.l.noTTLFlag()
	once := r.decidesAll(res)
	if once {
		flags |= flagOnce
	}
	if kind == flagRelease {
		// a turn a release begins is the tenant's whole quantum
		quantum *= res.Policy.weight()
	}
	op := &admitOp{id: id, cost: 1, flags: flags, claim: claim}
	for _, s := range scopes {
		op.scopes = append(op.scopes, opScope{scope: s})
	}
	op.roomArgs = []any{budget, quantum, micros(waitroom.RepairDefault), micros(r.l.cfg.PromoteLead)}
	if budget > 0 {
		k := keysFor(r.l.cfg.Prefix, tenant)
		q := queueOf(queue)
		op.roomKeys = []string{k.line(q), k.handing, k.queues, k.lineAt(q, priorityHigh), k.lineAt(q, priorityLow)}
		op.roomArgs = append(op.roomArgs, queueOf(queue))
		defName, def, own, err := r.l.policies.keyPolicies(ctx, tenant)
		if err != nil {
			return nil, fmt.Errorf("turn of tenant %q: %w", tenant, err)
		}
		if def.policy != nil || len(own) > 0 {
			op.keyed = &keyedPolicies{base: keyBase(r.l.cfg.Prefix, tenant), defName: defName, def: def, own: own}
		}
	}
	return &turnCall{r: r, tenant: tenant, op: op, scopes: scopes, once: once, fp: res.fingerprint()}, nil
}

// decode reads the turn's reply (raw, or the error that came instead).
func (tt *turnCall) decode(raw any, err error) (waitroom.Turn, error) {
	if err != nil {
		return waitroom.Turn{}, fmt.Errorf("turn of tenant %q: %w", tt.tenant, err)
	}
	r := tt.r
	t, err := decodeTurn(r.l.cfg.Prefix, tt.tenant, raw, tt.scopes, tt.op.keyed, tt.once, tt.fp)
	if err == nil && !r.l.cluster {
		// a hand-over on this server may confirm them itself
		handing := keysFor(r.l.cfg.Prefix, tt.tenant).handing
		for i := range t.Promoted {
			t.Promoted[i].Handing = handing
		}
	}
	return t, err
}

// promoteAll gives each tenant of a pump's round its turn (promote), all in
// one round trip: on one server in one admit.lua run, whose fixed cost the
// turns share; on a Cluster in one pipeline.
//
// With engine (the queue engine's keys, on this server), each turn of a
// tenant without key policies hands its jobs over in the same run.
func (r *room) promoteAll(ctx context.Context, queue string, tenants []string, budgets []int, quanta []int64, engine *waitroom.EngineLayout) ([]waitroom.Turn, []error) {
	turns := make([]waitroom.Turn, len(tenants))
	errs := make([]error, len(tenants))
	var calls []*turnCall
	var at []int
	for i, t := range tenants {
		if budgets[i] == 0 {
			continue
		}
		tt, err := r.turnOp(ctx, t, queue, "", 0, budgets[i], quanta[i], flagPromote)
		if err != nil {
			errs[i] = err
			continue
		}
		r.handInRun(tt, queue, engine)
		calls = append(calls, tt)
		at = append(at, i)
	}
	ops := make([]*admitOp, len(calls))
	for j, tt := range calls {
		ops[j] = tt.op
	}
	raws, rerrs := r.l.runRawAll(ctx, ops)
	for j, tt := range calls {
		turns[at[j]], errs[at[j]] = tt.decode(raws[j], rerrs[j])
	}
	return turns, errs
}

// Shares reports whether engine, the queue engine's client, reaches the
// room's keys (waitroom.Room.Shares): the limiter's own client, or one of
// the same server and database, and not a Cluster.
func (r *room) Shares(engine any) bool {
	return !r.l.cluster && sameServer(engine, r.l.client)
}

// promotion is what a promotion took, per scope, to take it back
// (waitroom.Promoted.Undo).
type promotion struct {
	undo   [][]int64
	scopes []scope
}

// handed confirms that the queue engine has the promoted jobs: they leave
// the handing set.
func (r *room) handed(ctx context.Context, tenant string, jobs []waitroom.Promoted) error {
	if len(jobs) == 0 {
		return nil
	}
	members := make([]any, len(jobs))
	for i, p := range jobs {
		members[i] = p.Entry
	}
	if err := r.l.client.ZRem(ctx, keysFor(r.l.cfg.Prefix, tenant).handing, members...).Err(); err != nil {
		return fmt.Errorf("handed jobs of tenant %q: %w", tenant, err)
	}
	return nil
}

// undo takes a promotion back, for a job the queue engine does not have
// (deleted, archived, or gone while it waited): what it took is given back
// as far as nothing took it over since, and it leaves the handing set.
func (r *room) undo(ctx context.Context, p waitroom.Promoted) error {
	if u, _ := p.Undo.(*promotion); u != nil && len(u.undo) > 0 && len(u.undo) == len(u.scopes) {
		op := &admitOp{id: p.ID, cost: max(p.Cost, 1), flags: flagUndoOnly | r.l.noTTLFlag(), undo: u.undo}
		for _, s := range u.scopes {
			op.scopes = append(op.scopes, opScope{scope: s})
		}
		if _, err := r.l.run(ctx, op, -1); err != nil {
			return fmt.Errorf("undo the promotion of job %q: %w", p.ID, err)
		}
	}
	return r.handed(ctx, p.Tenant, []waitroom.Promoted{p})
}

// sweep drains the pump's queues' unsharded due indexes (left by a
// sluice from before the shards) into the shards, makes every tenant
// whose line is missing from the index due, puts
// in their lines the parked jobs of intents no line took (sweepOrphans),
// and pushes further out the fallback of the parked tasks of waiting jobs
// that come due soon (repark, when set), at most once per sweepEvery
// across the fleet (a lock in Redis): a producer that died between its
// line and the index leaves the one, a producer that died between parking
// a job and its line the other, and a line longer than the fallback would
// otherwise come out of the queue engine's schedule at once.
func (r *room) sweep(ctx context.Context, queues []string, tasks waitroom.TaskLookup, repark waitroom.Repark) error {
	ok, err := r.l.client.SetNX(ctx, sweepKey(r.l.cfg.Prefix), 1, sweepEvery-time.Second).Result()
	if err != nil || !ok {
		return err
	}
	var errs []error
	for _, q := range queues {
		if err := r.drainUnsharded(ctx, q); err != nil {
			errs = append(errs, err)
		}
	}
	lines, err := r.l.scanLines(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("sweep lines: %w", err))...)
	}
	for queue, tenants := range lines {
		if err := r.ensure(ctx, queue, tenants); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	if repark != nil {
		for queue, tenants := range lines {
			inLine := make(map[string]bool, len(tenants))
			for _, t := range tenants {
				inLine[t] = true
			}
			if _, err := repark(ctx, queue, waitroom.ReparkWithin, waitroom.ReparkBy, func(t string) bool { return inLine[t] }); err != nil {
				errs = append(errs, fmt.Errorf("sweep parked tasks: %w", err))
			}
		}
	}
	return errors.Join(append(errs, r.sweepOrphans(ctx, tasks))...)
}

// Waiting is how many of tenant's jobs wait in its lines, and when the
// longest waiting head joined its line (zero when none waits).
func (r *room) Waiting(ctx context.Context, tenant string) (int64, time.Time, error) {
	if err := validateTenant(tenant); err != nil {
		return 0, time.Time{}, err
	}
	lines, err := r.linesOf(ctx, tenant)
	if err != nil {
		return 0, time.Time{}, err
	}
	var n int64
	var oldest time.Time
	for _, l := range lines {
		n += l.Waiting
		if !l.Oldest.IsZero() && (oldest.IsZero() || l.Oldest.Before(oldest)) {
			oldest = l.Oldest
		}
	}
	return n, oldest, nil
}

// queuesOf are the queues tenant has a line in.
func (r *room) queuesOf(ctx context.Context, tenant string) ([]string, error) {
	qs, err := r.l.client.SMembers(ctx, keysFor(r.l.cfg.Prefix, tenant).queues).Result()
	if err != nil {
		return nil, fmt.Errorf("lines of tenant %q: %w", tenant, err)
	}
	sort.Strings(qs)
	return qs, nil
}

// linesOf reads tenant's lines.
func (r *room) linesOf(ctx context.Context, tenant string) ([]waitroom.Line, error) {
	qs, err := r.queuesOf(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return r.readLines(ctx, tenant, qs)
}

// readLines reads the lines of tenants (one tenant for all the queues, or
// a tenant per queue) in one round trip per slot; empty ones are left out.
func (r *room) readLines(ctx context.Context, tenant string, queues []string, tenants ...string) ([]waitroom.Line, error) {
	pipe := r.l.client.Pipeline()
	type read struct {
		tenant, queue string
		n             [len(priorities)]*redis.IntCmd
		head          [len(priorities)]*redis.StringCmd
	}
	var reads []read
	for i, q := range queues {
		t := tenant
		if tenants != nil {
			t = tenants[i]
		}
		rd := read{tenant: t, queue: q}
		for l, key := range keysFor(r.l.cfg.Prefix, t).lines(q) {
			rd.n[l], rd.head[l] = pipe.LLen(ctx, key), pipe.LIndex(ctx, key, 0)
		}
		reads = append(reads, rd)
	}
	if len(reads) == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return nil, fmt.Errorf("read the waiting room's lines: %w", err)
	}
	out := make([]waitroom.Line, 0, len(reads))
	for _, rd := range reads {
		l := waitroom.Line{Tenant: rd.tenant, Queue: rd.queue}
		for i := range priorities {
			if n := rd.n[i].Val(); n > 0 {
				l.Waiting += n
				// the line's longest waiting job heads one of its levels
				if e, ok := parseLineEntry(rd.head[i].Val()); ok && (l.Oldest.IsZero() || e.lined.Before(l.Oldest)) {
					l.Oldest = e.lined
				}
			}
		}
		if l.Waiting > 0 {
			out = append(out, l)
		}
	}
	return out, nil
}

// maxLines bounds how many lines Lines reads.
const maxLines = 10_000

// Lines reads the lines of queues of the tenants in the queues' due
// indexes (every shard; at most 10,000 of them, earliest due first).
// Empty lines are left out.
func (r *room) Lines(ctx context.Context, queues ...string) ([]waitroom.Line, error) {
	var ts, qs []string
	for _, q := range queues {
		if len(ts) == maxLines {
			break
		}
		tenants, err := r.linesIndexed(ctx, q, maxLines-len(ts))
		if err != nil {
			return nil, err
		}
		for _, t := range tenants {
			if len(ts) == maxLines {
				break
			}
			ts, qs = append(ts, t), append(qs, q)
		}
	}
	return r.readLines(ctx, "", qs, ts...)
}

// WaitingIDs lists the task ids of up to n jobs (0: every job) at the head
// of each of tenant's lines, in line order, with their queues.
func (r *room) WaitingIDs(ctx context.Context, tenant string, n int64) ([]waitroom.Waiter, error) {
	if err := validateTenant(tenant); err != nil {
		return nil, err
	}
	qs, err := r.queuesOf(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []waitroom.Waiter
	for _, q := range qs {
		es, levels, err := r.l.lineJobs(ctx, tenant, q, n)
		if err != nil {
			return nil, err
		}
		for i, e := range es {
			out = append(out, waitroom.Waiter{ID: e.id, Queue: e.queue, Cost: e.cost, Priority: levels[i], Key: e.key})
		}
	}
	return out, nil
}

// Prioritize moves job id, waiting in tenant's line of queue, to priority
// level p, at the end of that level's jobs; it reports whether the job was
// waiting there. The line is read in pages to find the job (as Explain
// does), then one script moves it, unless it left the line meanwhile.
func (r *room) Prioritize(ctx context.Context, tenant, queue, id string, p int) (bool, error) {
	if err := validateTenant(tenant); err != nil {
		return false, err
	}
	if err := checkPriority(p); err != nil {
		return false, fmt.Errorf("prioritize job %s of tenant %q: %w", id, tenant, err)
	}
	queue = queueOf(queue)
	k := keysFor(r.l.cfg.Prefix, tenant)
	const page = 1000
	for _, from := range priorities {
		key := k.lineAt(queue, from)
		for start := int64(0); start < maxExplainScan; start += page {
			ms, err := r.l.client.LRange(ctx, key, start, start+page-1).Result()
			if err != nil {
				return false, fmt.Errorf("prioritize job %s of tenant %q: %w", id, tenant, err)
			}
			for _, m := range ms {
				if e, ok := parseLineEntry(m); !ok || e.id != id {
					continue
				}
				if from == p {
					return true, nil
				}
				moved, err := lua.Prioritize.Run(ctx, r.l.client, []string{key, k.lineAt(queue, p)}, m).Int()
				if err != nil {
					return false, fmt.Errorf("prioritize job %s of tenant %q: %w", id, tenant, err)
				}
				return moved == 1, nil
			}
			if len(ms) < page {
				break
			}
		}
	}
	return false, nil
}

// lineJobs are the first n jobs (0: all) of tenant's line of queue, in the
// order they leave it (high priority first), with their levels.
func (l *Limiter) lineJobs(ctx context.Context, tenant, queue string, n int64) ([]lineEntry, []int, error) {
	pipe := l.client.Pipeline()
	var cmds []*redis.StringSliceCmd
	for _, key := range keysFor(l.cfg.Prefix, tenant).lines(queueOf(queue)) {
		cmds = append(cmds, pipe.LRange(ctx, key, 0, n-1))
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return nil, nil, fmt.Errorf("waiting jobs of tenant %q: %w", tenant, err)
	}
	var out []lineEntry
	var levels []int
	for i, c := range cmds {
		for _, m := range c.Val() {
			if n > 0 && int64(len(out)) >= n {
				return out, levels, nil
			}
			if e, ok := parseLineEntry(m); ok {
				out, levels = append(out, e), append(levels, priorities[i])
			}
		}
	}
	return out, levels, nil
}

// lineEntry is a line entry read back: LINED_MS␟COST␟QUEUE␟ID, COST
// followed by /KEY for a job with a key.
type lineEntry struct {
	lined          time.Time
	cost           int64
	queue, id, key string
}

func parseLineEntry(m string) (lineEntry, bool) {
	f := strings.SplitN(m, lineSep, 4)
	if len(f) != 4 {
		return lineEntry{}, false
	}
	ms, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return lineEntry{}, false
	}
	e := lineEntry{lined: time.UnixMilli(ms), cost: 1, queue: f[2], id: f[3]}
	f[1], e.key, _ = strings.Cut(f[1], keySep)
	if f[1] != "" {
		if e.cost, err = strconv.ParseInt(f[1], 10, 64); err != nil || e.cost < 1 {
			return lineEntry{}, false
		}
	}
	if e.queue == "" {
		e.queue = waitroom.DefaultQueue
	}
	return e, true
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func isNil(err error) bool { return errors.Is(err, redis.Nil) }
