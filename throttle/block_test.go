package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/blocks"
)

// exactConfig decides with no tolerance on the started meters, so that
// every start the limiter allows conforms to its rates exactly.
var exactConfig = &Config{Horizon: 30 * time.Second, Grace: 2 * time.Second, Tolerance: -1}

// conforms checks that starts (µs, any order) conform to rate r exactly:
// the meter's own arithmetic (GCRA on the increment and burst offset the
// scripts use), one start of cost 1 each.
func conforms(t *testing.T, r Rate, starts []int64, where string) {
	t.Helper()
	_, unit, off := rateArgs(r, 1)
	s := slices.Clone(starts)
	slices.Sort(s)
	tat := int64(-1 << 62)
	for i, at := range s {
		if tat+unit-off > at {
			require.Failf(t, "a start does not conform", "%s: %s: start %d of %d at %dµs, %dµs early", where, r, i, len(s), at-s[0], tat+unit-off-at)
		}
		tat = max(tat, at) + unit
	}
}

// blockEnv is a limiter on the fake clock with no started-meter tolerance,
// tenant acme under policy, acme's resolved policies and the block engine.
func blockEnv(t *testing.T, policy string) (*env, *policiesView, blocks.Engine) {
	t.Helper()
	e := setup(t, false, exactConfig)
	e.policy(t, "acme", policy)
	res, err := jobPath{e.lim}.Resolve(context.Background(), "acme")
	require.NoError(t, err)
	return e, res, blocks.Of(e.lim)
}

// TestBlockStartsConform is the property test of blocks: random policies,
// random decisions of single jobs, random blocks spent at random times
// inside their windows and given back with random parts unused. Every
// start the sequence makes (a block's at the time chosen for it, a single
// job's at its decision) conforms to every rate exactly, and the slots
// held (blocks' and single jobs') never exceed the concurrency limit.
func TestBlockStartsConform(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trials := 32
	if testing.Short() {
		trials = 4
	}
	for trial := range trials {
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(trial), 41))
			// bursts spanning 100 ms to 1 s (a shorter one gets no block)
			r := 50 + rng.IntN(2000)
			text := fmt.Sprintf("rate=%d/s burst=%d", r, max(8, r*(100+rng.IntN(900))/1000))
			if rng.IntN(2) == 0 {
				r := 3000 + rng.IntN(100000)
				text += fmt.Sprintf(" rate=%d/min burst=%d", r, max(50, r*(100+rng.IntN(900))/60000))
			}
			clim := 0
			if rng.IntN(3) > 0 {
				clim = 8 + rng.IntN(200)
				text += fmt.Sprintf(" concurrency=%d", clim)
			}
			e, res, eng := blockEnv(t, text)
			var starts []int64
			type grant struct {
				g      *blocks.Grant
				unused int64
				last   time.Time
				ends   time.Time
			}
			var open []grant
			held := map[string]uint64{} // single jobs holding a slot
			slots := 0                  // blocks' slots held
			var granted, fromBlocks, single int
			// edge makes single decisions at at up to the first denial
			// (the meters' edge), recording the allowed starts
			edge := func(at time.Time, name string) int {
				n := 0
				for k := range 5000 {
					id := fmt.Sprintf("%s-%d", name, k)
					d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: id, policies: jobPoliciesOf(res)})
					require.NoError(t, err)
					if !d.Allowed {
						break
					}
					starts = append(starts, at.UnixMicro())
					n++
					if d.Claim != 0 {
						held[id] = d.Claim
					}
				}
				return n
			}
			for step := range 600 {
				e.clock.Advance(time.Duration(rng.IntN(15_000)) * time.Microsecond)
				now := e.clock.Now()
				where := fmt.Sprintf("%s step %d", text, step)
				// blocks whose time came are given back, their unused part
				// too
				for i := 0; i < len(open); i++ {
					if now.After(open[i].ends) || rng.IntN(6) == 0 {
						require.NoError(t, eng.Return(ctx, open[i].g, open[i].unused, open[i].last), where)
						slots -= open[i].g.Slots
						open = slices.Delete(open, i, i+1)
						i--
						if rng.IntN(2) == 0 {
							// the edge: single jobs up to the first denial
							// on the meters the return left
							single += edge(now, fmt.Sprint("back-", step, "-", i))
						}
					}
				}
				switch op := rng.IntN(10); {
				case op < 6:
					// single jobs, one or a burst of them up to the first
					// denial (the meters' edge)
					n := 1
					if rng.IntN(10) == 0 {
						n = 5000
					}
					for k := range n {
						id := fmt.Sprintf("job-%d-%d", step, k)
						d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: id, policies: jobPoliciesOf(res)})
						require.NoError(t, err, where)
						if !d.Allowed {
							break
						}
						starts = append(starts, now.UnixMicro())
						single++
						if d.Claim != 0 {
							held[id] = d.Claim
						}
					}
				case op < 8:
					g, err := eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 1 + rng.Int64N(300),
						Slots: rng.IntN(30), Window: time.Duration(20+rng.IntN(200)) * time.Millisecond})
					if err == blocks.ErrNoBlock {
						continue
					}
					require.NoError(t, err, where)
					require.True(t, now.Equal(g.At), "%s: granted at %s, now %s", where, g.At, now)
					require.Positive(t, g.Starts, where)
					granted++
					slots += g.Slots
					// its starts: some of them, at random times inside its
					// window
					used := rng.Int64N(g.Starts + 1)
					var last time.Time
					for range used {
						at := now.Add(time.Duration(rng.Int64N(int64(g.Window))))
						starts = append(starts, at.UnixMicro())
						if at.After(last) {
							last = at
						}
					}
					fromBlocks += int(used)
					open = append(open, grant{g: g, unused: g.Starts - used, last: last, ends: now.Add(g.Window)})
					if rng.IntN(2) == 0 {
						// the edge: single jobs up to the first denial inside
						// the block's window, before some of its starts
						e.clock.Advance(time.Duration(rng.Int64N(g.Window.Microseconds())) * time.Microsecond)
						single += edge(e.clock.Now(), fmt.Sprint("edge-", step))
					}
				default:
					for id, claim := range held {
						if rng.IntN(2) == 0 {
							require.NoError(t, e.lim.Release(ctx, "acme", id, claim), where)
							delete(held, id)
						}
					}
				}
				if clim > 0 {
					require.LessOrEqual(t, len(held)+slots, clim, "%s: slots held by single jobs and blocks", where)
				}
			}
			for _, r := range res.Policy.Rates {
				conforms(t, r, starts, text)
			}
			t.Logf("%s: %d blocks, %d starts from blocks, %d single", text, granted, fromBlocks, single)
			require.Positive(t, granted, "some blocks were granted")
			require.Positive(t, single, "some single jobs were allowed")
		})
	}
}

// TestBlockReturn: a block given back whole, with nothing charged after
// it, leaves the meters and slots as they were before it; one with a
// single job's charge after it keeps its starts (they are no longer the
// last charge) and frees its slots.
func TestBlockReturn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, res, eng := blockEnv(t, "rate=100/s burst=100 concurrency=40")
	d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: "first", policies: jobPoliciesOf(res)})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	before, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)

	g, err := eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 30, Slots: 50, Window: time.Second})
	require.NoError(t, err)
	// a quarter of the burst (1 s) is the window; half the burst is kept:
	// 49 starts fit, less the window's 25
	require.Equal(t, 250*time.Millisecond, g.Window)
	require.Equal(t, int64(25), g.Starts, "half the burst less the window (the first job is inside it)")
	require.Equal(t, 9, g.Slots, "a quarter of the free slots, within half the limit")
	during, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(1+9), during.Concurrency.InFlight)
	require.Less(t, during.Rates[0].Available, before.Rates[0].Available)

	require.NoError(t, eng.Return(ctx, g, g.Starts, time.Time{}))
	after, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, before.Rates[0].Available, after.Rates[0].Available, "every start given back")
	require.Equal(t, before.Concurrency.InFlight, after.Concurrency.InFlight, "every slot freed")

	// a charge after the block's: its starts stay charged
	g, err = eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 10, Slots: 2, Window: time.Second})
	require.NoError(t, err)
	d, err = e.lim.Do(ctx, Request{Tenant: "acme", ID: "second", policies: jobPoliciesOf(res)})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	mid, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.NoError(t, eng.Return(ctx, g, g.Starts, time.Time{}))
	after, err = e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, mid.Rates[0].Available, after.Rates[0].Available, "a block's starts stay when a charge came after them")
	require.Equal(t, int64(2), after.Concurrency.InFlight, "the block's slots freed, the two jobs' kept")

	// a renewal of a returned block renews nothing
	n, err := eng.Renew(ctx, g)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestBlockDeclined: no block for a tenant near its limits, or with a rule
// a block does not serve, or in a cooldown.
func TestBlockDeclined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, false, exactConfig)
	eng := blocks.Of(e.lim)
	for _, text := range []string{
		"rate=10/s",                        // burst 1: no room for a window
		"rate=100/s burst=100 window=50/s", // a window rule
		"quota=100/day",
		"rate=100/s burst=100 concurrency=1", // no slot to spare
	} {
		e.policy(t, "acme", text)
		res, err := jobPath{e.lim}.Resolve(ctx, "acme")
		require.NoError(t, err)
		_, err = eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 10, Slots: 4, Window: 100 * time.Millisecond})
		require.ErrorIs(t, err, blocks.ErrNoBlock, text)
	}
	e.policy(t, "acme", "rate=100/s burst=100")
	res, err := jobPath{e.lim}.Resolve(ctx, "acme")
	require.NoError(t, err)
	// most of the burst used: no block
	for i := range 60 {
		d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: fmt.Sprint("j", i), policies: jobPoliciesOf(res)})
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	_, err = eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 10, Window: 100 * time.Millisecond})
	require.ErrorIs(t, err, blocks.ErrNoBlock, "more than half the burst used")
	e.clock.Advance(time.Second)
	_, err = e.lim.Cooldown(ctx, "acme", time.Second)
	require.NoError(t, err)
	_, err = eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 10, Window: 100 * time.Millisecond})
	require.ErrorIs(t, err, blocks.ErrNoBlock, "in a cooldown")
	e.clock.Advance(1100 * time.Millisecond)
	_, err = eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 10, Window: 100 * time.Millisecond})
	require.NoError(t, err, "after it")
}

// TestBlockReturnAtTheLastStart: a block given back before its starts
// came (the worker knows the last of them) leaves the meters charged as if
// all came then, so that single jobs decided at once leave room for them:
// every start, the block's late ones included, conforms.
func TestBlockReturnAtTheLastStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, res, eng := blockEnv(t, "rate=100/s burst=100")
	g, err := eng.Grant(ctx, blocks.Want{Tenant: "acme", Policies: res, Starts: 1000, Window: 25 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, int64(47), g.Starts, "half the burst less the window")
	// 40 starts of the block at the end of its window, the rest given
	// back now
	last := g.At.Add(g.Window - time.Millisecond)
	const used = 40
	require.NoError(t, eng.Return(ctx, g, g.Starts-used, last))
	var starts []int64
	for range used {
		starts = append(starts, last.UnixMicro())
	}
	for i := 0; ; i++ {
		d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: fmt.Sprint("j", i), policies: jobPoliciesOf(res)})
		require.NoError(t, err)
		if !d.Allowed {
			break
		}
		starts = append(starts, e.clock.Now().UnixMicro())
	}
	require.LessOrEqual(t, len(starts), 100, "the block's starts kept their room")
	conforms(t, res.Policy.Rates[0], starts, "a block given back before its starts")
}
