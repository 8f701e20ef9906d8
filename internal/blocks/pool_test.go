package blocks

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeEngine grants every block asked for, with the slots asked, and
// records what is given back.
type fakeEngine struct {
	mu       sync.Mutex
	grants   []*Grant
	returned map[string]int64 // block id -> unused starts
	renewals int
	none     bool // grant nothing
}

func (f *fakeEngine) Grant(_ context.Context, w Want) (*Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.none {
		return nil, ErrNoBlock
	}
	g := &Grant{ID: strconv.Itoa(len(f.grants)), Tenant: w.Tenant, Starts: w.Starts, Window: w.Window, Slots: w.Slots, Lease: time.Hour, At: time.Now(), Decision: "d"}
	f.grants = append(f.grants, g)
	return g, nil
}

func (f *fakeEngine) Renew(_ context.Context, g *Grant) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renewals++
	return g.Slots, nil
}

func (f *fakeEngine) Return(_ context.Context, g *Grant, unused int64, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.returned == nil {
		f.returned = map[string]int64{}
	}
	f.returned[g.ID] = unused
	return nil
}

func (f *fakeEngine) Same(a, b any) bool { return a == b }

func (f *fakeEngine) state() (grants int, returned map[string]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int64{}
	for k, v := range f.returned {
		out[k] = v
	}
	return len(f.grants), out
}

func TestPoolSpendsBlocks(t *testing.T) {
	ctx := context.Background()
	eng := &fakeEngine{}
	p := NewPool(eng, &Config{Window: time.Hour, MinStarts: 4, MaxStarts: 16, Slots: func() int { return 2 }})
	defer p.Close()
	pol := new(int)

	// one grant serves four starts; two slots, then a job is decided alone
	var held []*Start
	for range 2 {
		s, ok := p.Take(ctx, "acme", pol, 1, true)
		require.True(t, ok)
		require.Equal(t, "d", s.Decision)
		held = append(held, s)
	}
	_, ok := p.Take(ctx, "acme", pol, 1, true)
	require.False(t, ok, "no slot left in the block: decided alone")
	held[0].Done()
	s, ok := p.Take(ctx, "acme", pol, 1, true)
	require.True(t, ok, "a slot given back serves the next job")
	s.Done()
	held[1].Done()
	n, _ := eng.state()
	require.Equal(t, 1, n)

	// a job of cost 2 does not fit the one start left: a new block, twice
	// the size (the last ran out in its first half)
	s, ok = p.Take(ctx, "acme", pol, 2, false)
	require.True(t, ok)
	s.Done()
	n, returned := eng.state()
	require.Equal(t, 2, n)
	eng.mu.Lock()
	require.Equal(t, int64(8), eng.grants[1].Starts)
	eng.mu.Unlock()
	require.Eventually(t, func() bool { _, r := eng.state(); return len(r) == 1 }, 5*time.Second, time.Millisecond)
	_, returned = eng.state()
	require.Equal(t, int64(1), returned["0"], "the first block's unused start given back")

	// a changed policy retires the block at once
	pol2 := new(int)
	_, ok = p.Take(ctx, "acme", pol2, 1, false)
	require.True(t, ok)
	require.Eventually(t, func() bool { _, r := eng.state(); return len(r) == 2 }, 5*time.Second, time.Millisecond)
	_, returned = eng.state()
	require.Equal(t, int64(6), returned["1"])

	// a pause asked by the downstream retires it too, and no block is
	// taken for a while
	p.Retire("acme")
	_, ok = p.Take(ctx, "acme", pol2, 1, false)
	require.False(t, ok)
	require.Eventually(t, func() bool { _, r := eng.state(); return len(r) == 3 }, 5*time.Second, time.Millisecond)
}

func TestPoolNoBlockAndClose(t *testing.T) {
	ctx := context.Background()
	eng := &fakeEngine{none: true}
	p := NewPool(eng, &Config{Window: time.Hour, Slots: func() int { return 2 }})
	pol := new(int)
	_, ok := p.Take(ctx, "acme", pol, 1, true)
	require.False(t, ok)
	n, _ := eng.state()
	require.Equal(t, 0, n)
	_, ok = p.Take(ctx, "acme", pol, 1, true)
	require.False(t, ok)
	n, _ = eng.state()
	require.Equal(t, 0, n, "no block asked for again at once")
	p.Close() // no block ever: no goroutine to stop

	eng = &fakeEngine{}
	p = NewPool(eng, &Config{Window: time.Hour, Slots: func() int { return 2 }})
	s, ok := p.Take(ctx, "acme", pol, 1, true)
	require.True(t, ok)
	p.Close()
	_, ok = p.Take(ctx, "acme", pol, 1, true)
	require.False(t, ok, "nothing after Close")
	_, returned := eng.state()
	require.Empty(t, returned, "a block a job runs on is not given back before the job ends")
	s.Done()
	_, returned = eng.state()
	require.Equal(t, int64(MinStartsDefault-1), returned["0"], "given back when its last job ends")
}

func TestPoolRetiresBlocksAtWindowEnd(t *testing.T) {
	ctx := context.Background()
	eng := &fakeEngine{}
	p := NewPool(eng, &Config{Window: 20 * time.Millisecond, Slots: func() int { return 0 }})
	defer p.Close()
	pol := new(int)
	for range 3 {
		s, ok := p.Take(ctx, "acme", pol, 1, false)
		require.True(t, ok)
		s.Done()
	}
	require.Eventually(t, func() bool { _, r := eng.state(); return len(r) == 1 }, 5*time.Second, time.Millisecond, "given back when its window ends")
	_, returned := eng.state()
	require.Equal(t, int64(MinStartsDefault-3), returned["0"])
}

func TestPoolForgetsIdleTenants(t *testing.T) {
	ctx := context.Background()
	p := NewPool(&fakeEngine{none: true}, nil)
	defer p.Close()
	pol := new(int)
	for i := range pruneMin {
		p.Take(ctx, strconv.Itoa(i), pol, 1, false)
	}
	p.mu.Lock()
	for _, tb := range p.tenants {
		tb.used = time.Now().Add(-2 * idleFor)
	}
	p.mu.Unlock()
	p.Take(ctx, "new", pol, 1, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Len(t, p.tenants, 1, "the idle tenants forgotten when a new one comes")
	require.Equal(t, pruneMin, p.pruneAt)
}
