package throttle

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/internal/blocks"
	"github.com/sluicehq/sluice/lua"
)

// Blocks: a tenant's starts and concurrency slots taken by a worker
// process in blocks (internal/blocks, lua/block.lua). This file is the
// engine; the process's pool that spends them is internal/blocks'.

func init() {
	blocks.Of = func(l any) blocks.Engine { return blockEngine{l.(*Limiter)} }
}

type blockEngine struct{ l *Limiter }

// blockCharge is what a grant charged: per rate its unit and the planned
// and started meters it left.
type blockCharge struct {
	starts             int64
	units              []int64
	planned0, started0 []int64 // before the grant
	planned, started   []int64 // after it
}

// blockPolicy returns the tenant policy of w when its jobs may be served
// from blocks: a tenant's, with rate and concurrency rules only, no rule
// of @global, no shadow and no adaptive rule; nil otherwise.
func blockPolicy(w blocks.Want) *Policy {
	r := jobPoliciesOf(w.Policies)
	if r == nil || w.Tenant == "" || r.Shadow != nil || r.Global.HasRules() {
		return nil
	}
	p := r.Policy
	if p == nil || p.Window != nil || p.Quota != nil || p.Adapt != nil || (len(p.Rates) == 0 && p.Concurrency == nil) {
		return nil
	}
	return p
}

func (e blockEngine) Same(a, b any) bool {
	ra, rb := jobPoliciesOf(a), jobPoliciesOf(b)
	return ra != nil && rb != nil && ra.Policy == rb.Policy && ra.Global == rb.Global
}

func (e blockEngine) Grant(ctx context.Context, w blocks.Want) (*blocks.Grant, error) {
	p := blockPolicy(w)
	if p == nil || w.Starts < 1 {
		return nil, blocks.ErrNoBlock
	}
	if err := validateTenant(w.Tenant); err != nil {
		return nil, err
	}
	id := uuid.NewString()[:8]
	if e.l.blockID != nil {
		id = e.l.blockID()
	}
	g := &blocks.Grant{ID: id, Claim: newClaim(), Tenant: w.Tenant}
	ch := &blockCharge{}
	args := []any{e.l.clockArg(), 1 | e.l.noTTLFlag(), g.ID, g.Claim, w.Starts, max(w.Slots, 0), micros(w.Window), len(p.Rates)}
	for _, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		args = append(args, unit, off)
		ch.units = append(ch.units, unit)
	}
	var lease time.Duration
	if c := p.Concurrency; c != nil {
		lease = c.lease()
		args = append(args, c.Limit, micros(lease))
	} else {
		args = append(args, 0, 0)
	}
	res, err := e.l.batch.run(ctx, lua.Block, []string{keysFor(e.l.cfg.Prefix, w.Tenant).state}, args)
	if err != nil {
		return nil, fmt.Errorf("block for tenant %q: %w", w.Tenant, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) < 2 {
		return nil, fmt.Errorf("block.lua: unexpected reply %v", res)
	}
	if n, _ := arr[0].(int64); n == 0 {
		return nil, blocks.ErrNoBlock
	}
	head, err := int64s(arr[:4], 4)
	if err != nil || len(arr) != 5 {
		return nil, fmt.Errorf("block.lua: unexpected reply %v", res)
	}
	meters, err := int64s(arr[4], 4*len(p.Rates))
	if err != nil {
		return nil, fmt.Errorf("block.lua: %w", err)
	}
	for i := range p.Rates {
		ch.planned0 = append(ch.planned0, meters[4*i])
		ch.started0 = append(ch.started0, meters[4*i+1])
		ch.planned = append(ch.planned, meters[4*i+2])
		ch.started = append(ch.started, meters[4*i+3])
	}
	ch.starts = head[0]
	g.Starts, g.Window, g.Slots = head[0], time.Duration(head[1])*time.Microsecond, int(head[2])
	if g.Slots > 0 {
		g.Lease = lease
	}
	g.Charge = ch
	// a job started from the block is charged where the block was: at the
	// window's end on every meter (Settle settles there)
	at := head[3] + head[1]
	g.Decision = Decision{Allowed: true, RetryAfter: -1, Remaining: -1, ResetAfter: -1, InFlight: -1, planned: at, started: at}
	g.At = time.UnixMicro(head[3])
	return g, nil
}

func (e blockEngine) Renew(ctx context.Context, g *blocks.Grant) (int, error) {
	if g.Slots == 0 {
		return 0, nil
	}
	res, err := e.l.batch.run(ctx, lua.Block, []string{keysFor(e.l.cfg.Prefix, g.Tenant).state},
		[]any{e.l.clockArg(), 2 | e.l.noTTLFlag(), g.ID, g.Claim, g.Slots, micros(g.Lease)})
	if err != nil {
		return 0, fmt.Errorf("renew block of tenant %q: %w", g.Tenant, err)
	}
	n, ok := res.(int64)
	if !ok {
		return 0, fmt.Errorf("block.lua: unexpected reply %v", res)
	}
	return int(n), nil
}

func (e blockEngine) Return(ctx context.Context, g *blocks.Grant, unused int64, last time.Time) error {
	ch, _ := g.Charge.(*blockCharge)
	if ch == nil {
		return fmt.Errorf("return block of tenant %q: not a block of this engine", g.Tenant)
	}
	if unused < 0 {
		unused = 0
	}
	args := []any{e.l.clockArg(), 3 | e.l.noTTLFlag(), g.ID, g.Claim, g.Slots, min(unused, ch.starts), ch.starts, last.UnixMicro(), len(ch.units)}
	for i, u := range ch.units {
		args = append(args, strconv.FormatInt(u, 10), ch.planned0[i], ch.started0[i], ch.planned[i], ch.started[i])
	}
	res, err := e.l.batch.run(ctx, lua.Block, []string{keysFor(e.l.cfg.Prefix, g.Tenant).state}, args)
	if err != nil {
		return fmt.Errorf("return block of tenant %q: %w", g.Tenant, err)
	}
	if _, err := int64s(res, 2); err != nil {
		return fmt.Errorf("block.lua: %w", err)
	}
	return nil
}
