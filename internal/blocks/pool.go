package blocks

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Defaults of Config.
const (
	WindowDefault    = 100 * time.Millisecond
	MinStartsDefault = 8
	MaxStartsDefault = 4096
	// sparseFor is how long a tenant whose last block went mostly unused
	// is decided one by one: a block costs two calls (its grant and its
	// return), worth it only for two starts or more.
	sparseFor = time.Second
	// noneFor is how long a tenant that got no block is not asked for one
	// again.
	noneFor = 250 * time.Millisecond
)

// Config is a Pool's configuration.
type Config struct {
	// Window is the longest a block's starts are spent over (the engine
	// may make it shorter). WindowDefault when zero.
	Window time.Duration
	// MinStarts and MaxStarts bound a block's size: it doubles while
	// blocks run out early and halves while they go half unused.
	MinStarts, MaxStarts int64
	// Slots tells how many concurrency slots a block asks for: the
	// process's concurrency. None when nil.
	Slots func() int
	// CallTimeout bounds each call to the engine.
	CallTimeout time.Duration
	// OnError hears the engine's errors (the job is then decided one by
	// one; a block's slots that cannot be renewed or freed free themselves
	// with their lease).
	OnError func(op string, err error)
}

// Pool spends a worker process's blocks: one current block per tenant,
// from which jobs take starts and slots without a call to Redis.
type Pool struct {
	eng Engine
	cfg Config

	mu      sync.Mutex
	tenants map[string]*tenantBlocks
	held    map[*block]struct{} // blocks with slots: renewed until returned
	returns []*block            // retired blocks to give back
	closed  bool

	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	looping bool // the loop runs (from the first grant on)
	pruneAt int  // the number of tenants known at which idle ones are forgotten
}

type tenantBlocks struct {
	used     time.Time // last taken from
	policies any
	cur      *block
	want     int64
	granting chan struct{} // closed when the grant in flight answers
	noUntil  time.Time     // no block asked for before then
}

type block struct {
	g         *Grant
	sent      time.Time // before the grant was sent: the window runs from here
	left      int64     // starts left
	last      time.Time // Redis time of its last start, as late as it can be
	free      int       // slots free
	running   int       // jobs running on its slots
	retired   bool
	returning bool
	nextRenew time.Time
}

// NewPool returns a pool spending the blocks eng grants. Close it: from its
// first block on it runs a goroutine that renews and gives blocks back.
func NewPool(eng Engine, cfg *Config) *Pool {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Window <= 0 {
		c.Window = WindowDefault
	}
	if c.MinStarts <= 0 {
		c.MinStarts = MinStartsDefault
	}
	if c.MaxStarts < c.MinStarts {
		c.MaxStarts = max(MaxStartsDefault, c.MinStarts)
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = time.Second
	}
	if c.Slots == nil {
		c.Slots = func() int { return 0 }
	}
	if c.OnError == nil {
		c.OnError = func(string, error) {}
	}
	return &Pool{eng: eng, cfg: c, tenants: map[string]*tenantBlocks{}, held: map[*block]struct{}{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), pruneAt: pruneMin}
}

// Start is a job started from a block: Done gives its slot back to the
// block when the job ends.
type Start struct {
	p    *Pool
	b    *block
	slot bool
	// Decision is the decision the job runs on (a throttle.Decision,
	// without its Now); Now is the Redis time of its start, as near as the
	// process knows it.
	Decision any
	Now      time.Time
}

// margin is how long before its window ends a block is no longer spent
// from: the start a job takes comes a little after Take returns.
func (b *block) margin() time.Duration { return b.g.Window / 10 }

func (b *block) open(cost int64, slot bool) bool {
	return !b.retired && b.left >= cost && time.Since(b.sent) < b.g.Window-b.margin() && (!slot || b.g.Slots == 0 || b.free > 0)
}

// Take takes cost starts (and, with slot, a concurrency slot) of tenant's
// block under policies, asking the engine for a block when the tenant has
// none open. It returns false when the job is to be decided one by one.
func (p *Pool) Take(ctx context.Context, tenant string, policies any, cost int64, slot bool) (*Start, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	t := p.tenants[tenant]
	if t == nil {
		if len(p.tenants) >= p.pruneAt {
			p.prune(time.Now())
		}
		t = &tenantBlocks{policies: policies, want: p.cfg.MinStarts}
		p.tenants[tenant] = t
	}
	t.used = time.Now()
	if !p.eng.Same(t.policies, policies) {
		// a changed policy: the blocks taken under the old one go
		if t.cur != nil {
			p.retire(t.cur)
			t.cur = nil
		}
		t.policies, t.noUntil, t.want = policies, time.Time{}, p.cfg.MinStarts
	}
	for {
		if b := t.cur; b != nil && b.open(cost, slot) {
			b.left -= cost
			// the start's Redis time is at most the grant's plus the time
			// since the call was sent
			b.last = b.g.At.Add(time.Since(b.sent))
			s := &Start{p: p, b: b, Decision: b.g.Decision, Now: b.last}
			if slot && b.g.Slots > 0 {
				b.free--
				b.running++
				s.slot = true
			}
			return s, true
		}
		if b := t.cur; b != nil && !b.retired && b.left >= cost && time.Since(b.sent) < b.g.Window-b.margin() {
			// its slots are all running: this job is decided alone
			return nil, false
		}
		if time.Now().Before(t.noUntil) || cost > p.cfg.MaxStarts {
			return nil, false
		}
		if t.granting != nil {
			ch := t.granting
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				p.mu.Lock()
				return nil, false
			}
			p.mu.Lock()
			if p.closed {
				return nil, false
			}
			continue
		}
		if b := t.cur; b != nil {
			p.sized(t, b)
			p.retire(b)
			t.cur = nil
			if time.Now().Before(t.noUntil) {
				return nil, false
			}
		}
		want := max(t.want, cost)
		ch := make(chan struct{})
		t.granting = ch
		p.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
		sent := time.Now()
		g, err := p.eng.Grant(cctx, Want{Tenant: tenant, Policies: policies, Starts: want, Slots: p.cfg.Slots(), Window: p.cfg.Window})
		cancel()
		p.mu.Lock()
		close(ch)
		t.granting = nil
		if err != nil {
			t.noUntil = time.Now().Add(noneFor)
			if !errors.Is(err, ErrNoBlock) {
				p.cfg.OnError("grant", err)
				t.noUntil = time.Now().Add(sparseFor)
			}
			return nil, false
		}
		b := &block{g: g, sent: sent, left: g.Starts, free: g.Slots}
		if p.closed || !p.eng.Same(t.policies, policies) {
			p.retire(b)
			return nil, false
		}
		t.cur = b
		if !p.looping {
			p.looping = true
			go p.loop()
		}
		if g.Slots > 0 {
			b.nextRenew = sent.Add(g.Lease / 3)
			p.held[b] = struct{}{}
		}
	}
}

// idleFor is how long a tenant with no block is remembered (its block size
// and its pause) after its last job; pruneMin is how many tenants the pool
// knows before it first looks for idle ones.
const (
	idleFor  = time.Minute
	pruneMin = 1024
)

// prune forgets the tenants with no block whose last job is older than
// idleFor, and sets when to look again (at twice the tenants left, so that
// the scans cost O(1) per new tenant). p.mu is held.
func (p *Pool) prune(now time.Time) {
	for name, t := range p.tenants {
		if t.cur == nil && t.granting == nil && now.Sub(t.used) > idleFor {
			delete(p.tenants, name)
		}
	}
	p.pruneAt = max(2*len(p.tenants), pruneMin)
}

// Retire takes tenant's open block out of service (its downstream asked
// for a pause: no job of it starts from a block granted before) and asks
// for no block for a while.
func (p *Pool) Retire(tenant string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tenants[tenant]
	if t == nil {
		return
	}
	if t.cur != nil {
		p.retire(t.cur)
		t.cur = nil
	}
	t.noUntil = time.Now().Add(noneFor)
}

// sized sets the size of the tenant's next block from how its last one
// went: doubled when it ran out in the first half of its window, halved
// when half of it went unused, and no block for a while when it served
// fewer than two starts.
func (p *Pool) sized(t *tenantBlocks, b *block) {
	used := b.g.Starts - b.left
	switch {
	case used < 2:
		t.noUntil = time.Now().Add(sparseFor)
		t.want = p.cfg.MinStarts
	case b.left*2 > b.g.Starts:
		t.want = max(t.want/2, p.cfg.MinStarts)
	case time.Since(b.sent) < b.g.Window/2:
		t.want = min(t.want*2, p.cfg.MaxStarts)
	}
}

// retire takes b out of service: it is given back (its unused starts,
// its slots) once no job runs on its slots. p.mu is held.
func (p *Pool) retire(b *block) {
	if b.retired {
		return
	}
	b.retired = true
	if b.running == 0 {
		p.queueReturn(b)
	}
}

func (p *Pool) queueReturn(b *block) {
	if b.returning {
		return
	}
	b.returning = true
	p.returns = append(p.returns, b)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Done gives the job's slot back to its block.
func (s *Start) Done() {
	if !s.slot {
		return
	}
	s.slot = false
	p := s.p
	p.mu.Lock()
	s.b.running--
	s.b.free++
	last := s.b.retired && s.b.running == 0
	if last && p.closed && !s.b.returning {
		// the pool's loop is gone: the block is given back here
		s.b.returning = true
		p.mu.Unlock()
		p.giveBack([]*block{s.b})
		return
	}
	if last {
		p.queueReturn(s.b)
	}
	p.mu.Unlock()
}

// loop renews the blocks' slots, retires blocks whose window is over and
// gives back retired ones.
func (p *Pool) loop() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.Window)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			p.drain()
			return
		case <-tick.C:
		case <-p.wake:
		}
		p.work()
	}
}

// work does what is due: renewals, retirements, returns.
func (p *Pool) work() {
	p.mu.Lock()
	now := time.Now()
	for _, t := range p.tenants {
		if b := t.cur; b != nil && t.granting == nil && now.Sub(b.sent) >= b.g.Window {
			p.sized(t, b)
			p.retire(b)
			t.cur = nil
		}
	}
	var renew []*block
	for b := range p.held {
		if !b.returning && !now.Before(b.nextRenew) {
			renew = append(renew, b)
			b.nextRenew = now.Add(b.g.Lease / 3)
		}
	}
	returns := p.returns
	p.returns = nil
	p.mu.Unlock()
	for _, b := range renew {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CallTimeout)
		n, err := p.eng.Renew(ctx, b.g)
		cancel()
		if err != nil {
			p.cfg.OnError("renew", err)
			continue
		}
		if n < b.g.Slots {
			// a slot's lease ran out: the block serves no new job
			p.mu.Lock()
			p.retire(b)
			for _, t := range p.tenants {
				if t.cur == b {
					t.cur = nil
				}
			}
			p.mu.Unlock()
		}
	}
	p.giveBack(returns)
}

func (p *Pool) giveBack(bs []*block) {
	for _, b := range bs {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CallTimeout)
		p.mu.Lock()
		left, last := b.left, b.last
		p.mu.Unlock()
		if err := p.eng.Return(ctx, b.g, left, last); err != nil {
			p.cfg.OnError("return", err)
		}
		cancel()
		p.mu.Lock()
		delete(p.held, b)
		p.mu.Unlock()
	}
}

// drain retires every block and gives back those no job runs on (a block
// whose jobs still run frees its slots with their lease).
func (p *Pool) drain() {
	p.mu.Lock()
	for _, t := range p.tenants {
		if t.cur != nil {
			p.retire(t.cur)
			t.cur = nil
		}
	}
	returns := p.returns
	p.returns = nil
	p.mu.Unlock()
	p.giveBack(returns)
}

// Close stops the pool: no block is taken after it, and every block no
// job runs on is given back.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	looping := p.looping
	p.mu.Unlock()
	if !looping {
		return
	}
	close(p.stop)
	<-p.done
}
