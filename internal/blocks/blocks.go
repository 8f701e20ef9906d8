// Package blocks serves the starts of tenants far from their limits from
// blocks: a worker process takes N starts and K concurrency slots of a
// tenant in one call (lua/block.lua), starts its jobs from them without
// asking Redis again, and gives back what it did not use. A block of
// starts holds for a short window (Window, at most a quarter of the
// tenant's smallest burst) and is charged as if all its starts came at the
// window's end, and granted only while all of them would conform at its
// first instant and the tenant keeps half its burst: any spending of it
// inside the window conforms to the tenant's rules exactly. Its slots are
// leased like a job's and renewed by the pool, one call per block per
// tick: a process that dies frees them when their lease ends.
//
// A tenant near its limits, or with a rule a block does not serve (a
// window, a quota, an adaptive rate, a shadow policy, a rule of @global),
// gets no block: its jobs are decided one by one, as before.
package blocks

import (
	"context"
	"errors"
	"time"
)

// Want is what a process asks of a tenant's block.
type Want struct {
	Tenant string
	// Policies are the job's policies as jobpath.Engine.Resolve returned
	// them (a *jobpath.Policies).
	Policies any
	// Starts is how many starts (cost units) the block is asked for;
	// Slots how many concurrency slots (used only when the tenant has a
	// concurrency rule).
	Starts int64
	Slots  int
	// Window is the longest the block's starts may be spent over.
	Window time.Duration
}

// Grant is a block the engine granted.
type Grant struct {
	// ID names the block's slots; Claim is the token they are held under.
	ID    string
	Claim uint64
	// Starts is how many cost units it may start, Window how long after
	// the grant (measured from before the call was sent) they may start.
	Starts int64
	Window time.Duration
	// Slots is how many concurrency slots it holds (0: the tenant has no
	// concurrency rule), Lease their lease.
	Slots int
	Lease time.Duration
	// Tenant and the engine's own record of the charge, to give back the
	// unused starts.
	Tenant string
	Charge any
	// At is the Redis time of the grant.
	At time.Time
	// Decision is the decision a job started from the block runs on (a
	// throttle.Decision, without its Now).
	Decision any
}

// ErrNoBlock says that the tenant gets no block now: its jobs are decided
// one by one.
var ErrNoBlock = errors.New("sluice: no block for the tenant")

// Engine grants, renews and takes back blocks in Redis. Package throttle
// implements it for a Limiter (Of).
type Engine interface {
	// Grant takes a block for w, or returns ErrNoBlock.
	Grant(ctx context.Context, w Want) (*Grant, error)
	// Renew extends the lease of the block's slots and returns how many
	// it still holds.
	Renew(ctx context.Context, g *Grant) (int, error)
	// Return frees the block's slots and gives back its unused starts
	// where nothing was charged after the block: the meters are charged
	// for the used ones as if all came at last (Redis time; no start of
	// the block was later).
	Return(ctx context.Context, g *Grant, unused int64, last time.Time) error
	// Same reports whether two of Want's Policies are the same policies
	// (a changed policy retires the blocks taken under the old one).
	Same(a, b any) bool
}

// Of returns the block engine of a *throttle.Limiter. Package throttle,
// which imports this one, sets it.
var Of func(limiter any) Engine
