package throttle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/crashpoint"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/lua"
)

// The pump: whoever runs jobs runs one, and it moves waiting jobs from
// their lines to the queue engine when they may start and the fleet has
// room for them, serving the due tenants in turn.

// sweepEvery is how often one pump of the fleet sweeps for lines missing
// from the index and for orphans.
const sweepEvery = 30 * time.Second

// Pump runs the waiting room's pump until ctx ends: while the fleet has
// room it takes the due tenants from the index, oldest first, gives each
// a turn (deficit round robin by the tenants' weights, weight= in their
// policies, across rounds: a turn the room cut short goes on first at the
// next), hands the promoted jobs over and sets when each tenant is next
// due. While no line is due it sleeps until
// the next one is, woken at once when a line begins (the index's wake
// channel), so an idle pump costs Redis about one call per Idle. A policy
// change makes every waiting tenant due at once (one pump of the fleet
// does it per change), so that its jobs follow the new rules, and every
// half minute one pump looks for lines missing from the index (a producer
// that died between its line and the index). Several pumps share the
// work: a tenant taken by one is held from the others for a few seconds.
func (r *room) Pump(ctx context.Context, cfg *waitroom.PumpConfig) error {
	var c waitroom.PumpConfig
	if cfg != nil {
		c = *cfg
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	p := &pump{r: r, cfg: c, wake: make(chan struct{}, 1)}
	if c.Engine != nil {
		r.engine.Store(c.Engine)
	}
	// resolving once starts the policy store's watcher, whose changes the
	// pump follows from here on
	if _, err := r.l.policies.resolve(ctx, ""); err != nil {
		p.report(ctx, err)
	}
	p.changes = r.l.policies.changeCount()
	sub := r.l.client.Subscribe(ctx, wakeChannel(r.l.cfg.Prefix))
	defer sub.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.listen(ctx, sub)
	}()
	p.run(ctx)
	_ = sub.Close()
	wg.Wait()
	return nil
}

type pump struct {
	r       *room
	cfg     waitroom.PumpConfig
	changes uint64 // the policy changes followed so far
	// owed are the queues whose re-mark for a policy version this pump
	// took and has not done yet (it failed)
	owed      map[string]int64
	lastSweep time.Time
	wake      chan struct{}
	// full: the last round found a queue's fleet without room for its due
	// lines (a kick then calls for a round)
	full bool
	// seen are, per queue, the tenants this pump took from the index
	// within the last seenFor, with their weights
	seen map[string]map[string]seenTenant
	// hungry are, per queue, the tenants whose last turn this pump gave
	// promoted as many jobs as its room and left jobs waiting
	hungry map[string]map[string]bool
}

// seenTenant is a tenant a pump took, its weight and when.
type seenTenant struct {
	weight int64
	at     time.Time
}

// minTurn is the room, in jobs per unit of weight, a round with little
// room gives a tenant's turn (serve). A turn costs admit.lua a share of
// its fixed work (the tenant's state and line read, its deficit and
// handing set written) and a round costs the index a take and a settle,
// whatever they promote: a busy fleet, whose rounds find room for a few
// jobs each, promoted one job per turn, and its pumps spent several calls
// per job. Deficit round robin keeps the tenants' shares by their weights
// over the rounds whatever the quantum; a larger one only makes the
// rounds coarser.
const minTurn = 4

// seenFor is how long a pump counts a tenant it took among those sharing
// out a round's room (dueWeight).
const seenFor = time.Second

// dueWeight records the tenants a round of queue took, with their weights,
// and returns the weight of every tenant the pump took within seenFor,
// these included, but those whose turn emptied their line since (serve):
// they wait for nothing. Several pumps take the due tenants between them:
// a round that took only some of them still shares out its room as if
// all of them were in it, so that a tenant's quantum does not grow with
// the tenants other pumps hold at that moment.
func (p *pump) dueWeight(queue string, tenants []string, weights []int64) int64 {
	if p.seen == nil {
		p.seen = map[string]map[string]seenTenant{}
	}
	m := p.seen[queue]
	if m == nil {
		m = map[string]seenTenant{}
		p.seen[queue] = m
	}
	now := time.Now()
	for i, t := range tenants {
		m[t] = seenTenant{weight: weights[i], at: now}
	}
	var total int64
	for t, s := range m {
		if now.Sub(s.at) > seenFor {
			delete(m, t)
			continue
		}
		total += s.weight
	}
	return total
}

// fed records whether tenant's turn in queue had more jobs than its room:
// it promoted as many as the room and left jobs waiting.
func (p *pump) fed(queue, tenant string, hungry bool) {
	if p.hungry == nil {
		p.hungry = map[string]map[string]bool{}
	}
	m := p.hungry[queue]
	if m == nil || len(m) >= 4096 {
		m = map[string]bool{}
		p.hungry[queue] = m
	}
	if hungry {
		m[tenant] = true
	} else {
		delete(m, tenant)
	}
}

// manyDue reports whether the pump took 2*minTurn tenants or more of
// queue within the last seenFor: many tenants wait their turns.
func (p *pump) manyDue(queue string) bool {
	now := time.Now()
	n := 0
	for _, s := range p.seen[queue] {
		if now.Sub(s.at) <= seenFor {
			n++
		}
	}
	return n >= 2*minTurn
}

// listen turns wake-ups for the pump's queues into a signal.
func (p *pump) listen(ctx context.Context, sub *redis.PubSub) {
	queues := map[string]bool{}
	for _, q := range p.cfg.Queues {
		queues[q] = true
	}
	for {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			// go-redis reconnects; a wake-up lost meanwhile costs Idle
			continue
		}
		q, shard, due, ok := parseWake(msg.Payload)
		if queues[q] {
			if ok {
				p.r.l.due.lower(q, shard, due)
			}
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (p *pump) run(ctx context.Context) {
	for ctx.Err() == nil {
		began := time.Now()
		wait, err := p.round(ctx)
		if err != nil && ctx.Err() == nil {
			p.report(ctx, err)
			wait = max(wait, p.cfg.Interval)
		}
		if wait > 0 {
			var kick <-chan struct{}
			if p.full {
				kick = p.cfg.Kick
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			case <-p.wake:
			case <-kick:
				// the jobs that end in the next moments are served too
				if gap := p.kickGap() - time.Since(began); gap > 0 {
					g := time.NewTimer(gap)
					select {
					case <-ctx.Done():
					case <-g.C:
					}
					g.Stop()
				}
			}
			t.Stop()
		}
	}
}

// kickGap is how long after a round's start a kicked pump starts the
// next: KickGap, or a quarter of the time the shortest-lasting pending
// list of its queues lasts (PumpConfig.Drain) when that is longer, at
// most Interval.
func (p *pump) kickGap() time.Duration {
	if p.cfg.Drain == nil {
		return waitroom.KickGap
	}
	var least time.Duration
	for _, q := range p.cfg.Queues {
		if d := p.cfg.Drain(q); d > 0 && (least == 0 || d < least) {
			least = d
		}
	}
	return min(max(least/4, waitroom.KickGap), p.cfg.Interval)
}

// report passes err to OnError, unless the pump is stopping (ctx is
// done): the calls its stop cut short are not errors.
func (p *pump) report(ctx context.Context, err error) {
	if p.cfg.OnError != nil && ctx.Err() == nil {
		p.cfg.OnError(err)
	}
}

// round serves the due tenants of every queue once; it returns how long
// to wait before the next round.
func (p *pump) round(ctx context.Context) (time.Duration, error) {
	if n := p.r.l.policies.changeCount(); n != p.changes {
		// followed only once every queue is re-marked: a failure is
		// tried again next round
		if err := p.remark(ctx); err != nil {
			return 0, err
		}
		p.changes = n
	}
	if time.Since(p.lastSweep) > sweepEvery {
		p.lastSweep = time.Now()
		if err := p.r.sweep(ctx, p.cfg.Queues, p.cfg.Tasks, p.cfg.Repark); err != nil {
			p.report(ctx, err)
		}
	}
	wait := p.idle()
	var firstErr error
	p.full = false
	for _, q := range p.cfg.Queues {
		w, err := p.serve(ctx, q)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		wait = min(wait, w)
	}
	return wait, firstErr
}

// remark makes every waiting tenant of the pump's queues due now, after a
// policy change: one pump of the fleet does it per change of the stored
// policies (a key of the change's version says which).
func (p *pump) remark(ctx context.Context) error {
	version, err := p.r.l.policies.readVersion(ctx)
	if err != nil {
		return fmt.Errorf("re-mark waiting tenants: %w", err)
	}
	for _, q := range p.cfg.Queues {
		if p.owed[q] != version {
			first, err := p.r.l.client.SetNX(ctx, markAllKey(p.r.l.cfg.Prefix, q, version), 1, time.Minute).Result()
			if err != nil {
				return fmt.Errorf("re-mark waiting tenants: %w", err)
			}
			if !first {
				continue
			}
		}
		if err := p.r.markAll(ctx, q); err != nil {
			// this pump took the change's re-mark: it owes it, and tries
			// again next round
			if p.owed == nil {
				p.owed = map[string]int64{}
			}
			p.owed[q] = version
			return err
		}
		delete(p.owed, q)
	}
	return nil
}

// serve serves queue's due tenants once; it returns how long to wait
// before serving it again.
func (p *pump) serve(ctx context.Context, queue string) (time.Duration, error) {
	free, err := p.cfg.Free(ctx, queue)
	if err != nil {
		return p.cfg.Interval, err
	}
	if free <= 0 {
		p.full = true
		return p.cfg.Interval, nil
	}
	n := min(free, p.cfg.Tenants)
	if p.manyDue(queue) {
		// a hungry tenant's turn takes minTurn jobs (below): fewer
		// tenants are taken, twice as many as hungry ones would fill
		n = min(n, 2*((free+minTurn-1)/minTurn))
	}
	if !p.r.l.cluster {
		// on one server the shards the view lost track of are read in one
		// call, and only those holding due tenants are taken from: an
		// idle pump makes one call per Idle, not one per shard
		var stale []int
		for s, h := range p.r.l.due.get(queue) {
			if p.stale(h) {
				stale = append(stale, s)
			}
		}
		if _, _, err := p.r.readHeads(ctx, queue, stale); err != nil {
			return p.cfg.Interval, err
		}
	}
	shards := p.shards(queue, n)
	if len(shards) == 0 {
		return p.sleep(queue), nil
	}
	taken, takeErr := p.r.takeShards(ctx, queue, shards, n, waitroom.HoldDefault)
	if len(taken) == 0 {
		if takeErr != nil {
			return p.cfg.Interval, takeErr
		}
		return p.sleep(queue), nil
	}
	if takeErr != nil {
		p.report(ctx, takeErr)
	}
	// the n earliest due are served; the others keep their places
	rest := taken[min(n, len(taken)):]
	taken = taken[:min(n, len(taken))]
	// Deficit round robin over the rounds, in the index's order: a tenant's
	// turn adds its quantum (its weight, in units that share out this
	// round's room when it is large) to its deficit and promotes while the
	// deficit covers its head; the room given to a turn is what the
	// tenants before it in the round left. A turn the room cut short goes
	// on at the next round (its deficit kept, admit.lua), so it keeps its
	// place in the index; tenants the room did not reach keep theirs.
	weights := make([]int64, len(taken))
	var total int64
	for i, d := range taken {
		weights[i] = 1
		if res, err := p.r.l.policies.policiesFor(ctx, d.tenant); err == nil {
			weights[i] = res.Policy.weight()
		}
		total += weights[i]
	}
	names := make([]string, len(taken))
	for i, d := range taken {
		names[i] = d.tenant
	}
	dueW := max(total, p.dueWeight(queue, names, weights))
	unit := max(1, int64(free)/dueW)
	// many tenants due and less room than a job per unit of their weight:
	// a tenant whose last turn had more jobs than its room (hungry) is
	// served for minTurn jobs per unit of weight, rather than for one, and
	// the room runs out sooner (the tenants it did not reach keep their
	// places). A tenant whose turn promotes one job at a time (a rate
	// holds its line, or the line is short) stays at one. (With a few
	// tenants a turn's room is several jobs already, and the turns a
	// release begins, one job per unit of weight, keep the weights.)
	scarce := int64(free) < dueW && p.manyDue(queue)
	budgets := make([]int, len(taken))
	quanta := make([]int64, len(taken))
	left := free
	for i, d := range taken {
		quanta[i] = weights[i] * unit
		if scarce && p.hungry[queue][d.tenant] {
			quanta[i] = weights[i] * minTurn
		}
		budgets[i] = int(min(int64(left), quanta[i]))
		left -= budgets[i]
	}
	tenants := make([]string, len(taken))
	for i, d := range taken {
		tenants[i] = d.tenant
	}
	// the round's turns in one round trip (one script run on one server)
	turns, errs := p.r.promoteAll(ctx, queue, tenants, budgets, quanta, p.cfg.Engine)
	due := make(map[string]time.Time, len(taken))
	// all: the jobs promoted; toHand: those the turns did not hand over
	// in their run
	var all, toHand []waitroom.Promoted
	inRun := map[string]int{}
	for i, t := range tenants {
		if errs[i] != nil {
			// due again when the hold ends
			p.report(ctx, errs[i])
			continue
		}
		if budgets[i] > 0 {
			due[t] = turns[i].Due
			all = append(all, turns[i].Promoted...)
			for _, j := range turns[i].Promoted {
				if j.InRun {
					inRun[t]++
				} else {
					toHand = append(toHand, j)
				}
			}
			p.fed(queue, t, len(turns[i].Promoted) >= budgets[i] && turns[i].Waiting > 0)
			if turns[i].Waiting == 0 {
				// its line is empty: it no longer shares out the rounds'
				// room (dueWeight) until it is taken again
				delete(p.seen[queue], t)
			}
		}
	}
	if len(all) > 0 {
		// (the jobs a turn handed over in its run are in asynq already)
		crashpoint.Hit("room.promoted")
	}
	handed, gone, herr := p.r.handOver(ctx, toHand, p.cfg.Handover)
	if herr != nil {
		p.report(ctx, herr)
	}
	for t, n := range inRun {
		handed[t] += n
	}
	for t, n := range gone {
		// the gone jobs' promotions were taken back: the slots they took
		// are free again, and the due time the turn computed after them
		// is too late
		if _, ok := due[t]; ok && n > 0 {
			due[t] = dueNow
		}
	}
	if p.cfg.OnTurn != nil {
		for i, t := range tenants {
			if errs[i] == nil && budgets[i] > 0 {
				p.cfg.OnTurn(t, turns[i], handed[t], gone[t]+turns[i].Gone)
			}
		}
	}
	// the order of the index: first the turns that go on and the tenants
	// the room did not reach, at their places; then, in the order served,
	// those whose turns ended, due now or when their lines may go on
	settled := make([]dueTenant, 0, len(taken)+len(rest))
	settled = append(settled, rest...)
	var ended []dueTenant
	// due times up to now are due now, in the order served; later ones are
	// kept as they are, even a few ms ahead: made due now, the tenant
	// would be taken again at once for a turn that promotes nothing
	now := p.r.l.estimatedNow()
	for i, d := range taken {
		at, ok := due[d.tenant]
		switch {
		case errs[i] != nil:
		case !ok || turns[i].MidTurn && !at.IsZero() && !at.After(now):
			settled = append(settled, d)
		case at.Equal(dueNow) || !at.IsZero() && !at.After(now):
			d.due = 0
			ended = append(ended, d)
		case at.IsZero():
			d.due = -1
			ended = append(ended, d)
		default:
			d.due = at.UnixMicro()
			ended = append(ended, d)
		}
	}
	if err := p.r.settleDue(ctx, queue, append(settled, ended...)); err != nil {
		return 0, err
	}
	if len(all) >= free {
		// the room bounded the round: the list is full again, and the
		// next round waits for slots to free, as a full fleet's does
		// (kicked, after kickGap), rather than refilling one slot at a
		// time
		p.full = true
		return p.kickGap(), nil
	}
	return 0, nil
}

// shards are the shards of queue's index the pump takes from, for a round
// that serves up to n tenants: those its view does not know or read more
// than half an Idle ago, and of those it knows to hold due tenants the n
// whose earliest are the earliest (the n earliest due tenants of the
// index are in them, as far as the view is right).
func (p *pump) shards(queue string, n int) []int {
	view := p.r.l.due.get(queue)
	now := p.r.l.estimatedNow().UnixMicro()
	var out, due []int
	for s, h := range view {
		switch {
		case p.stale(h):
			out = append(out, s)
		case h.head >= 0 && h.head <= now:
			due = append(due, s)
		}
	}
	sort.SliceStable(due, func(i, j int) bool { return view[due[i]].head < view[due[j]].head })
	return append(out, due[:min(n, len(due))]...)
}

// stale reports whether the view of a shard is unknown or more than half
// an idle old.
func (p *pump) stale(h shardHead) bool {
	return !h.known || h.read.IsZero() || time.Since(h.read) >= p.idle()/2
}

// idle is the longest the pump sleeps while no line it knows of is due:
// Idle, or QuietIdleFactor Idles while another pump of the fleet polls
// (PumpConfig.Quiet).
func (p *pump) idle() time.Duration {
	if p.cfg.Quiet != nil && p.cfg.Quiet() {
		return waitroom.QuietIdleFactor * p.cfg.Idle
	}
	return p.cfg.Idle
}

// sleep is how long the pump may sleep when it took nothing from queue:
// until the earliest due time its view knows of, at most idle.
func (p *pump) sleep(queue string) time.Duration {
	wait := p.idle()
	now := p.r.l.estimatedNow()
	for _, h := range p.r.l.due.get(queue) {
		if !h.known {
			return p.cfg.Interval
		}
		if h.head >= 0 {
			wait = min(wait, max(time.UnixMicro(h.head).Sub(now), time.Millisecond))
		}
	}
	return wait
}

// handOver gives promoted jobs to the queue engine, then confirms them in
// their tenants' handing sets, or takes back the promotions of jobs the
// engine does not have (an earlier promotion's retry only leaves the set:
// the engine may have run it already). Jobs it could not hand over stay in
// the handing sets, to be tried again. It returns, per tenant, how many
// jobs were handed over and how many were gone, and what went wrong (jobs
// the engine could not be asked about, an undo or a confirmation that
// failed: each is tried again by a later turn after the repair age).
func (r *room) handOver(ctx context.Context, jobs []waitroom.Promoted, h waitroom.Handover) (handed, gone map[string]int, err error) {
	handed, gone = map[string]int{}, map[string]int{}
	if len(jobs) == 0 {
		return handed, gone, nil
	}
	results := h(ctx, jobs)
	crashpoint.Hit("room.handed-over")
	done := map[string][]waitroom.Promoted{}
	failed := 0
	var errs []error
	for i, j := range jobs {
		res := waitroom.Failed
		if i < len(results) {
			res = results[i]
		}
		switch {
		case res == waitroom.Confirmed:
			// the hand-over took it out of the handing set itself
			handed[j.Tenant]++
		case res == waitroom.Handed:
			handed[j.Tenant]++
			done[j.Tenant] = append(done[j.Tenant], j)
		case res == waitroom.Gone && j.Retry:
			gone[j.Tenant]++
			done[j.Tenant] = append(done[j.Tenant], j)
		case res == waitroom.Gone:
			gone[j.Tenant]++
			// an error leaves the entry to be tried again
			if err := r.undo(ctx, j); err != nil {
				errs = append(errs, err)
			}
		default:
			failed++
		}
	}
	if err := r.handedMany(ctx, done); err != nil {
		errs = append(errs, err)
	}
	if failed > 0 {
		errs = append(errs, fmt.Errorf("hand %d of %d promoted jobs to the queue engine: it could not be asked; they are handed over again after %s", failed, len(jobs), waitroom.RepairDefault))
	}
	return handed, gone, errors.Join(errs...)
}

// handedMany confirms hand-overs of several tenants in one round trip.
func (r *room) handedMany(ctx context.Context, done map[string][]waitroom.Promoted) error {
	if len(done) == 0 {
		return nil
	}
	pipe := r.l.client.Pipeline()
	for t, jobs := range done {
		members := make([]any, len(jobs))
		for i, p := range jobs {
			members[i] = p.Entry
		}
		pipe.ZRem(ctx, keysFor(r.l.cfg.Prefix, t).handing, members...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("handed jobs: %w", err)
	}
	return nil
}

// Release gives back the concurrency slots job id of tenant holds under
// claim (as Limiter.Release does) and, in the same script run, hands the
// freed slot to the next job in the tenant's line of queue (the finished
// job's): that job is promoted and given to the queue engine with h at
// once. It does so only when it is the tenant's turn: when the fleet has
// room to spare (spare says 2 or more, the pumps serve the others with
// the rest), or when no other tenant is due before it in the queue's due
// index; otherwise the slot is given back and the tenant is made due, so
// that the pumps serve the due tenants in turn. With spare nil the fleet's
// room is not known and the slot is handed on. With h nil (a worker
// shutting down) nothing is handed on: the slots are given back and the
// tenant is made due now, so that the fleet's pumps serve its line. It
// returns ErrClaimLost as Limiter.Release does.
func (r *room) Release(ctx context.Context, tenant, queue, id string, claim uint64, sc waitroom.Scopes, h waitroom.Handover, spare waitroom.Spare) (err error) {
	if h == nil {
		_, err := r.l.release(ctx, tenant, "", id, claim, sc)
		if tenant != "" && (err == nil || errors.Is(err, ErrClaimLost)) {
			// a pump that found every slot held left the tenant due only
			// at a lease's end
			if merr := r.mark(ctx, queueOf(queue), tenant); merr != nil {
				return merr
			}
		}
		return err
	}
	// the small release first: with nobody waiting it is all there is (the
	// job's key's and pools' slots go in the same call), and with jobs
	// waiting for no slot of the job's (none of its scopes was full) the
	// slots go back and the tenant is made due: the pumps promote its line
	// in their turns, many tenants in one run, rather than this release
	// handing its slot on alone. On one server, where it gives back
	// nothing at all while jobs wait for its slot, a tenant whose line
	// waited for its slot at its last release goes straight to the
	// hand-on.
	queued := queue + lineSep + tenant
	if r.l.cluster || !r.lately(&r.queued, queued) {
		waiting, given, err := r.l.releaseIn(ctx, tenant, queue, id, claim, sc, true)
		if given && r.l.cluster && (err == nil || errors.Is(err, ErrClaimLost)) {
			// on a Cluster the index is in another slot: nudged on its own
			if merr := r.nudge(ctx, queueOf(queue), tenant); merr != nil {
				return merr
			}
		}
		if !waiting || err != nil {
			return err
		}
		r.remember(&r.queued, queued, queuedFor)
	}
	return r.handOn(ctx, tenant, queue, id, claim, sc, h, spare)
}

// ReleaseAll is Release for several jobs at once, in as few round trips
// as it takes: their small releases in one (on one server in one
// release.lua run), then the hand-ons of those whose lines wait for their
// slots, side by side. It returns each job's error, in order.
func (r *room) ReleaseAll(ctx context.Context, jobs []waitroom.Releasing, h waitroom.Handover, spare waitroom.Spare) []error {
	errs := make([]error, len(jobs))
	if h == nil {
		for i, j := range jobs {
			errs[i] = r.Release(ctx, j.Tenant, j.Queue, j.ID, j.Claim, j.Scopes, nil, spare)
		}
		return errs
	}
	rcs := make([]*releasing, len(jobs))
	handOn := make([]bool, len(jobs))
	var calls []*call
	for i, j := range jobs {
		if j.Tenant == "" {
			errs[i] = r.Release(ctx, j.Tenant, j.Queue, j.ID, j.Claim, j.Scopes, h, spare)
			continue
		}
		if !r.l.cluster && r.lately(&r.queued, j.Queue+lineSep+j.Tenant) {
			handOn[i] = true
			continue
		}
		rc, err := r.l.releaseCalls(ctx, j.Tenant, j.Queue, j.ID, j.Claim, j.Scopes, true)
		if err != nil {
			errs[i] = err
			continue
		}
		rcs[i] = rc
		calls = append(calls, rc.calls...)
	}
	r.l.batch.runAll(calls)
	// on a Cluster the index is in another slot: the tenants whose slots
	// went back while jobs wait are nudged on their own, per queue
	marks := map[string][]int{}
	for i, rc := range rcs {
		if rc == nil {
			continue
		}
		j := jobs[i]
		waiting, given, err := rc.read()
		if given && r.l.cluster && (err == nil || errors.Is(err, ErrClaimLost)) {
			marks[queueOf(j.Queue)] = append(marks[queueOf(j.Queue)], i)
		}
		errs[i] = err
		if waiting && err == nil {
			r.remember(&r.queued, j.Queue+lineSep+j.Tenant, queuedFor)
			handOn[i] = true
		}
	}
	var wg sync.WaitGroup
	for i, j := range jobs {
		if handOn[i] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = r.handOn(ctx, j.Tenant, j.Queue, j.ID, j.Claim, j.Scopes, h, spare)
			}()
		}
	}
	for q, idx := range marks {
		tenants := make([]string, len(idx))
		for k, i := range idx {
			tenants[k] = jobs[i].Tenant
		}
		if err := r.nudge(ctx, q, tenants...); err != nil {
			for _, i := range idx {
				if errs[i] == nil || errors.Is(errs[i], ErrClaimLost) {
					errs[i] = err
				}
			}
		}
	}
	wg.Wait()
	return errs
}

// handOn is Release for a job whose tenant's line waits for its slots:
// the slots go to the line's head when it is the tenant's turn, and back
// otherwise (the tenant then waits its turn).
func (r *room) handOn(ctx context.Context, tenant, queue, id string, claim uint64, sc waitroom.Scopes, h waitroom.Handover, spare waitroom.Spare) (err error) {
	queued := queue + lineSep + tenant
	if sc.Key != "" || (len(sc.Pools) > 0 && !r.l.cluster) {
		// nothing of the tenant's slot was given back (and on one server
		// nothing at all), and the hand-on below gives back the tenant's
		// and @global's slots, not the key's or the pools': theirs go now.
		// (On a Cluster the pools' went with @global's, in a call of
		// their slot's.)
		if perr := r.l.releaseBelow(ctx, tenant, id, claim, sc, !r.l.cluster); perr != nil {
			if !errors.Is(perr, ErrClaimLost) {
				return perr
			}
			defer func() {
				if err == nil {
					err = perr
				}
			}()
		}
	}
	// jobs wait: is it the tenant's turn?
	others := false
	var turnErr error
	if spare != nil && spare(ctx, queueOf(queue)) < 2 {
		var first bool
		if first, others, turnErr = r.turnOf(ctx, queueOf(queue), tenant); turnErr != nil {
			// the slot is handed on as if it were its turn, rather than
			// held until its lease ends; the error is reported
			first, others = true, false
		}
		if !first {
			// another tenant's turn: the slot goes back (release.lua: no
			// promotion, so not admit.lua's release op), and the tenant
			// waits its turn (or keeps its place): both in one round trip
			lost, err := r.releaseAndMark(ctx, tenant, queueOf(queue), id, claim)
			if err != nil {
				return err
			}
			if claim != 0 && lost {
				return fmt.Errorf("release tenant %q job %q: %w", tenant, id, ErrClaimLost)
			}
			return nil
		}
	}
	t, err := r.release(ctx, tenant, queue, id, claim, 1)
	if err != nil {
		return err
	}
	if t.Gone > 0 {
		// jobs the run found gone and dropped (waitroom.Promoted.Gone):
		// told to the hand-over only to be counted
		gone := make([]waitroom.Promoted, t.Gone)
		for i := range gone {
			gone[i] = waitroom.Promoted{Tenant: tenant, Queue: queue, InRun: true, Gone: true}
		}
		h(ctx, gone)
	}
	if t.Waiting == 0 {
		// the line is empty: the next release asks again
		r.remember(&r.queued, queued, 0)
	}
	if len(t.Promoted) > 0 {
		crashpoint.Hit("room.released")
		_, gone, herr := r.handOver(ctx, t.Promoted, h)
		if herr != nil {
			// the handing set keeps the job: a pump hands it over again
			return fmt.Errorf("release tenant %q job %q: %w", tenant, id, herr)
		}
		if gone[tenant] > 0 {
			// the job the slot went to was gone, its promotion taken back:
			// the slot is free again, and a pump may have left the tenant
			// due only at a lease's end
			if err := r.mark(ctx, queueOf(queue), tenant); err != nil {
				return err
			}
		}
	} else if !t.Due.IsZero() {
		// The slot is free but the line's head may not take it yet (its
		// rate slot is ahead): the tenant is due then. A pump may have
		// left it due only at a lease's end, while every slot was held.
		// Should this fail, that lease's end still brings a pump.
		if err := r.markAt(ctx, queueOf(queue), tenant, t.Due); err != nil {
			return err
		}
	}
	if others && !t.MidTurn {
		// its turn ended here: the tenants due behind it go first
		if err := r.requeue(ctx, queueOf(queue), tenant); err != nil {
			return err
		}
	}
	if claim != 0 && t.Lost > 0 {
		return fmt.Errorf("release tenant %q job %q: %w", tenant, id, ErrClaimLost)
	}
	return turnErr
}

// releaseAndMark is releaseTurnless and mark at once: the job's slots go
// back and its tenant is due now in queue's index. On one server
// release.lua does both in one run; on a Cluster (the index is in another
// slot) the two scripts go in one pipeline.
func (r *room) releaseAndMark(ctx context.Context, tenant, queue, id string, claim uint64) (lost bool, err error) {
	rc, err := r.l.releaseTurnlessCall(ctx, tenant, id, claim)
	if err != nil {
		return false, err
	}
	shard := dueShard(tenant)
	due := dueKey(r.l.cfg.Prefix, queue, shard)
	if rc != nil && !r.l.cluster {
		// the op's line count, + 256: a mark follows (release.lua)
		p := rc.payload.([]any)
		p[len(p)-1] = 256
		rc.payload = append(p, tenant, wakeChannel(r.l.cfg.Prefix), queue+lineSep+strconv.Itoa(shard))
		rc.keys = append(rc.keys, due)
		r.l.batch.runAll([]*call{rc})
		if lost, err = turnlessLost(tenant, id, rc.res, rc.err); err != nil {
			return false, err
		}
		r.l.due.lower(queue, shard, r.l.estimatedNow().UnixMicro())
		return lost, nil
	}
	mc := &call{ctx: ctx, script: lua.Room, keys: []string{due}, args: r.roomArgs("mark", queue, shard, tenant)}
	calls := []*call{mc}
	if rc != nil {
		calls = []*call{rc, mc}
	}
	r.l.batch.runAll(calls)
	if rc != nil {
		if lost, err = turnlessLost(tenant, id, rc.res, rc.err); err != nil {
			return false, err
		}
	}
	if mc.err != nil {
		return lost, fmt.Errorf("mark tenants due: %w", mc.err)
	}
	// this process's releases know at once (others from the wake)
	r.l.due.lower(queue, shard, r.l.estimatedNow().UnixMicro())
	return lost, nil
}
