package throttle

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"
)

// On Redis Cluster a job's tenant and @global live in different slots,
// where no script sees both. doSplit reaches the decision one script over
// both scopes would reach, in steps that each run admit.lua over both
// scopes, one local (read and written) and the other remote (its state
// passed in as the snapshot an earlier step returned), all at the clock of
// the first step:
//
//	A  the tenant, alone: its snapshot; it is charged only when it alone
//	   would start the job now (then A also returns an undo record).
//	B  @global, with the tenant remote: the decision, @global's part of it
//	   written, and @global's snapshot.
//	C  the tenant again, with @global remote, when the tenant must write
//	   something B decided (a reservation) or take back what A wrote (B
//	   denied the job): A's charge is undone, the decision made again and
//	   written only when it is B's.
//
// An admitted job takes two round trips (A, B), a job given a reservation
// three. Given the same state, every decision is a single server's, and a
// denied job leaves nothing charged in either scope.
//
// C's decision differs from B's only when another admission changed the
// tenant between A and C (another process: a process's own two-step
// admissions of one tenant take turns). Then @global's part is taken back
// too and B and C run again with the tenant's fresh snapshot, up to
// maxSplitRounds times. An undo is exact when nothing else charged the same
// meters meanwhile; otherwise a planned meter keeps its place and a started
// meter stays charged, at most one interval per undo, counted in the
// scope's Stats.Leftovers: the cautious side.
//
// When a step fails, what earlier steps wrote is taken back as far as
// Redis answers; a concurrency slot a lost answer may hold is released
// under its claim by do.
const maxSplitRounds = 3

// splitStripes is how many locks serialise a process's two-step admissions
// per tenant (tenants share a lock when they hash alike).
const splitStripes = 64

func (l *Limiter) lockSplit(ctx context.Context, tenant string) (func(), error) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenant))
	lock := l.splitLocks[h.Sum32()%splitStripes]
	select {
	case lock <- struct{}{}:
		return func() { <-lock }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// needsSplit reports whether op's scopes live in two slots: on a Cluster,
// a tenant's (the tenant and its key) and the others (@global and the
// job's pools, which share @global's slot).
func (l *Limiter) needsSplit(scopes []scope) bool {
	return l.cluster && len(scopes) > 1 && !inGlobalSlot(scopes[0].name) && inGlobalSlot(scopes[len(scopes)-1].name)
}

// inGlobalSlot reports whether a scope lives in @global's slot (@global
// and the shared pools).
func inGlobalSlot(name string) bool {
	return name == GlobalPolicy || isPool(name)
}

// doSplit decides op, whose scopes are the tenant's slot's first (the
// tenant's and its key's) and then, in @global's slot, @global's and its
// pools', in steps.
func (l *Limiter) doSplit(ctx context.Context, op *admitOp) (Decision, error) {
	unlock, err := l.lockSplit(ctx, op.scopes[0].name)
	if err != nil {
		return Decision{}, err
	}
	defer unlock()
	n := 1
	for n < len(op.scopes) && !inGlobalSlot(op.scopes[n].name) {
		n++
	}
	s := &split{l: l, op: op, tenant: op.scopes[:n], global: op.scopes[n:]}
	return s.decide(ctx)
}

type split struct {
	l  *Limiter
	op *admitOp
	// tenant are the scopes of the tenant's slot: the tenant's and its
	// key's, decided together in one step (A), as the other side
	tenant []opScope
	// global are the scopes of @global's slot: @global and the job's pools,
	// decided together in one step (B), as one side of the admission
	global []opScope
	clock  int64 // µs: the time every step decides at (A's Redis time)
}

// step is one run of admit.lua for the op with the given scopes, flags
// added and undo records.
func (s *split) step(ctx context.Context, scopes []opScope, flags int, undo [][]int64, clock int64) (*admitReply, error) {
	op := *s.op
	op.scopes, op.flags, op.undo = scopes, s.op.flags|flags, undo
	return s.l.run(ctx, &op, clock)
}

// remote are scopes decided on from their snapshots (one each).
func (s *split) remote(scopes []opScope, snapshots [][]int64) []opScope {
	out := make([]opScope, len(scopes))
	for i, sc := range scopes {
		out[i] = opScope{scope: sc.scope, snapshot: snapshots[i]}
	}
	return out
}

func (s *split) decide(ctx context.Context) (Decision, error) {
	ra, err := s.step(ctx, s.tenant, flagProbe|flagTwoStep, nil, -1)
	if err != nil {
		return Decision{}, fmt.Errorf("%s: %w", s.tenant[0].name, err)
	}
	s.clock = ra.now
	snapT := ra.snapshots
	var undoT [][]int64 // what the tenant holds that the answer may take back
	if ra.wrote() {
		undoT = ra.undos
	}
	tenantFigures := ra
	var last *admitReply
	for round := 1; ; round++ {
		both := append(s.remote(s.tenant, snapT), s.global...)
		rb, err := s.step(ctx, both, flagTwoStep, nil, s.clock)
		if err != nil {
			s.undo(ctx, s.tenant, undoT)
			return Decision{}, fmt.Errorf("%s: %w", s.global[0].name, err)
		}
		var undoG [][]int64
		if rb.wrote() {
			undoG = rb.undos
		}
		// the tenant already holds what B decided (A started the job), or
		// B wrote nothing and the tenant holds nothing: B is the answer
		startedInA := undoT != nil && rb.allowed() && s.op.flags&flagPlan == 0
		if startedInA || (undoT == nil && !rb.wrote()) || s.op.flags&flagDry != 0 {
			return s.answer(rb, both, tenantFigures, rb), nil
		}
		// C: the tenant writes B's decision, or takes back A's charge
		both = append(s.tenant[:len(s.tenant):len(s.tenant)], s.remote(s.global, rb.snapshots)...)
		flags := flagTwoStep | flagExpect
		var undo [][]int64
		if undoT != nil {
			flags |= flagUndo
			undo = undoT
		}
		c := *s.op
		c.scopes, c.flags, c.undo = both, s.op.flags|flags, undo
		c.expectAllowed, c.expectSlot = rb.allowed(), rb.slot
		rc, err := s.l.run(ctx, &c, s.clock)
		if err != nil {
			// whether C wrote is unknown: @global's part is taken back, and
			// the tenant keeps what it may hold (the cautious side)
			s.undo(ctx, s.global, undoG)
			return Decision{}, fmt.Errorf("%s: %w", s.tenant[0].name, err)
		}
		if !rc.conflict() {
			return s.answer(rc, both, rc, rb), nil
		}
		// another admission changed the tenant since A: take back @global's
		// part and decide again on the tenant's state as it is now
		s.undo(ctx, s.global, undoG)
		snapT, undoT, tenantFigures, last = rc.snapshots, nil, rc, rc
		if round == maxSplitRounds {
			break
		}
	}
	// The tenant kept changing under the steps: the job is denied, charged
	// nothing, and told to come back soon, as a full concurrency rule would.
	d := last.decision(append(s.tenant[:len(s.tenant):len(s.tenant)], s.global...))
	d.Allowed, d.Reserved, d.Slot = false, false, time.Time{}
	d.RetryAfter = max(d.RetryAfter, s.l.cfg.ConcurrencyRetry)
	if d.Rule == "" {
		d.Rule, d.Policy = ruleName(kindConcurrency, 0), s.tenant[0].name
	}
	return d, nil
}

// undo takes back what a step wrote to scopes of one slot (their undo
// records, one each), even when the caller has given up waiting: a charge
// left behind would hold back later jobs.
func (s *split) undo(ctx context.Context, scopes []opScope, records [][]int64) {
	if len(records) == 0 || records[0] == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateRelease)
	defer cancel()
	_, err := s.step(ctx, scopes, flagUndoOnly, records, s.clock)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return
	}
}

// answer is the verdict of reply (whose scopes are given) with the figures
// of what is left in both scopes: the tenant's from tenant's reply and
// @global's from global's, as one script over both would report them.
func (s *split) answer(reply *admitReply, scopes []opScope, tenant, global *admitReply) Decision {
	d := reply.decision(scopes)
	d.Now = time.UnixMicro(s.clock)
	d.Remaining = minRemaining(tenant.remaining, global.remaining)
	d.ResetAfter = -1
	if r := max(tenant.reset, global.reset); r >= 0 {
		d.ResetAfter = time.Duration(r) * time.Microsecond
	}
	d.InFlight = tenant.inFlight
	if d.InFlight < 0 {
		d.InFlight = global.inFlight
	}
	return d
}

func minRemaining(a, b int64) int64 {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	}
	return min(a, b)
}
