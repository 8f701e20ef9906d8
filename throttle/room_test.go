package throttle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/lua"
)

// engine is a stand-in queue engine for the room's tests: it records the
// jobs handed to it and answers what the test tells it to.
type engine struct {
	mu     sync.Mutex
	handed []waitroom.Promoted
	answer func(p waitroom.Promoted) waitroom.HandoverResult // nil: Handed
}

func (g *engine) handover(_ context.Context, jobs []waitroom.Promoted) []waitroom.HandoverResult {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]waitroom.HandoverResult, len(jobs))
	for i, j := range jobs {
		out[i] = waitroom.Handed
		if g.answer != nil {
			out[i] = g.answer(j)
		}
		if out[i] == waitroom.Handed {
			g.handed = append(g.handed, j)
		}
	}
	return out
}

func (g *engine) ids() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, p := range g.handed {
		out = append(out, p.ID)
	}
	return out
}

func arrive(t *testing.T, e *env, tenant, id string, mayGo bool) waitroom.Arrived {
	t.Helper()
	a, err := e.lim.room().Arrive(context.Background(), waitroom.Arrival{Tenant: tenant, ID: id, MayGo: mayGo})
	require.NoError(t, err)
	if a.Ticket != "" {
		e.tickets.Store(id, a.Ticket)
	}
	return a
}

// line brings jobs in as queue.Client does: each arrives and, unless it
// goes straight, joins the line.
func line(t *testing.T, e *env, tenant string, ids ...string) (straight []string) {
	t.Helper()
	for _, id := range ids {
		a := arrive(t, e, tenant, id, true)
		if a.Straight {
			straight = append(straight, id)
			continue
		}
		joined, _, err := e.lim.room().Join(context.Background(), tenant, a.Backlog, waitroom.Waiter{ID: id})
		require.NoError(t, err)
		require.Equal(t, 1, joined)
	}
	return straight
}

func TestRoomArrival(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=2 concurrency=1 backlog=2")
	room := e.lim.room()

	// the line is empty, the fleet has room and the rules allow it: straight
	a := arrive(t, e, "acme", "j1", true)
	require.True(t, a.Straight)
	require.NotZero(t, a.Claim, "it holds its concurrency slot")
	require.Equal(t, e.clock.Now().UnixMicro(), a.Slot.UnixMicro())
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight)
	require.Equal(t, int64(1), st.Reservations, "its slot is reserved for the gate")

	// its concurrency slot is taken: the next waits, charged nothing
	require.False(t, arrive(t, e, "acme", "j2", true).Straight)
	// the fleet has no room: it waits, even with a free slot elsewhere
	require.False(t, arrive(t, e, "other", "o1", false).Straight)
	require.True(t, arrive(t, e, "other", "o1", true).Straight, "another tenant is not held back")

	// a line that holds jobs keeps newcomers behind them
	joined, waiting, err := room.Join(ctx, "acme", 2, waitroom.Waiter{ID: "j2"}, waitroom.Waiter{ID: "j3"}, waitroom.Waiter{ID: "j4"})
	require.NoError(t, err)
	require.Equal(t, 2, joined, "backlog=2 caps the line")
	require.Equal(t, int64(2), waiting)
	_, err = room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: "j5", MayGo: true})
	var be *BacklogError
	require.ErrorAs(t, err, &be)
	require.ErrorIs(t, err, ErrBacklogFull)
	require.Equal(t, int64(2), be.Limit)

	st, err = e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Waiting)
	require.Equal(t, e.clock.Now().UnixMilli(), st.WaitingSince.UnixMilli())
	require.Equal(t, int64(1), st.Rates[0].Available, "waiting jobs are charged nothing")
	ids, err := room.WaitingIDs(ctx, "acme", 10)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{{ID: "j2", Queue: waitroom.DefaultQueue, Cost: 1}, {ID: "j3", Queue: waitroom.DefaultQueue, Cost: 1}}, ids)

	// a straight job the engine refused gives back what it took
	require.NoError(t, room.TakeBack(ctx, a))
	st, err = e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(0), st.Concurrency.InFlight)
	require.Equal(t, int64(0), st.Reservations)
	require.Equal(t, int64(2), st.Rates[0].Available)

	// bad input changes nothing
	_, err = room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: "x", Queue: "a\x1fb", MayGo: true})
	require.ErrorContains(t, err, "0x1f")
	_, err = room.Arrive(ctx, waitroom.Arrival{Tenant: "*", ID: "x"})
	require.ErrorIs(t, err, ErrInvalidTenant)
	e.policy(t, "costly", "rate=10/s burst=3")
	_, err = room.Arrive(ctx, waitroom.Arrival{Tenant: "costly", ID: "x", Cost: 4, MayGo: true})
	var ce *CostError
	require.ErrorAs(t, err, &ce)
}

// TestRoomPromotesAtEachSlot: a rate-limited line is promoted one job per
// slot, each decided at its slot when it leaves (its ticket); a concurrency
// limited line waits for a slot, and a release hands its slot to the head
// in the same script run.
func TestRoomPromotesAtEachSlot(t *testing.T) {
	t.Parallel()
	e := setup(t, false, &Config{PromoteLead: 10 * time.Millisecond})
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s")
	room := e.lim.room()
	require.Equal(t, []string{"j1"}, line(t, e, "acme", "j1", "j2", "j3", "j4"))

	start := e.clock.Now()
	turn, err := room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Empty(t, turn.Promoted, "j2's slot is 100ms away")
	require.Equal(t, start.Add(90*time.Millisecond).UnixMicro(), turn.Due.UnixMicro(), "due at the slot less the lead")
	require.Equal(t, int64(3), turn.Waiting)

	e.clock.Advance(90 * time.Millisecond)
	turn, err = room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Len(t, turn.Promoted, 1)
	p := turn.Promoted[0]
	require.Equal(t, "j2", p.ID)
	require.Equal(t, waitroom.DefaultQueue, p.Queue)
	require.Equal(t, start.Add(100*time.Millisecond).UnixMicro(), p.Slot.UnixMicro())
	require.Equal(t, start.Add(190*time.Millisecond).UnixMicro(), turn.Due.UnixMicro())
	require.Equal(t, int64(2), turn.Waiting)

	// until handed over, the job is in the handing set: a turn after the
	// repair age hands it over again
	e.clock.Advance(waitroom.RepairDefault)
	turn, err = room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	var retried []string
	for _, p := range turn.Promoted {
		if p.Retry {
			retried = append(retried, p.ID)
		}
	}
	require.Equal(t, []string{"j2"}, retried)
	g := &engine{}
	room.handOver(ctx, turn.Promoted, g.handover)
	require.ElementsMatch(t, []string{"j2", "j3"}, g.ids(), "j2 again, and j3 whose slot is due")
	n, err := e.client.ZCard(ctx, keysFor(e.prefix, "acme").handing).Result()
	require.NoError(t, err)
	require.Zero(t, n, "handed jobs leave the handing set")

	// a promoted job carries its decision, even with no burst to spare
	// (its slot's start conforms): the gate starts it on its ticket there,
	// asking nothing
	e.keep(turn.Promoted)
	require.True(t, e.redeem(t, "acme", "j3").Allowed)

	// concurrency: the line waits for a slot, a release hands it on
	e.policy(t, "pool", "concurrency=1")
	require.Equal(t, []string{"p1"}, line(t, e, "pool", "p1", "p2", "p3"))
	turn, err = room.promote(ctx, "pool", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Empty(t, turn.Promoted)
	lease := LeaseDefault
	require.Equal(t, e.clock.Now().Add(lease).UnixMicro(), turn.Due.UnixMicro(), "due when p1's lease would run out")
	d, err := e.lim.Admit(ctx, "pool", "p1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	g = &engine{}
	require.NoError(t, room.Release(ctx, "pool", waitroom.DefaultQueue, "p1", d.Claim, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, []string{"p2"}, g.ids(), "the freed slot went to the head of the line")
	st, err := e.lim.Stats(ctx, "pool")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight, "p2 holds the slot")
	require.Equal(t, "p2", st.Concurrency.Holders[0].ID)
	require.Equal(t, int64(1), st.Waiting)
	// a second release of the same claim changes nothing and says so
	require.ErrorIs(t, room.Release(ctx, "pool", waitroom.DefaultQueue, "p1", d.Claim, waitroom.Scopes{}, g.handover, nil), ErrClaimLost)
	require.Equal(t, []string{"p2"}, g.ids())
}

// TestRoomTicketChargedAsLateAsItStarts: a promoted job's ticket holds
// for the tolerance past its slot, and its started meter is charged that
// late (so that no start is after its charge); the next job's slot is
// placed without that leeway, one interval after the slot before.
func TestRoomTicketChargedAsLateAsItStarts(t *testing.T) {
	t.Parallel()
	e := setup(t, false, &Config{PromoteLead: 10 * time.Millisecond})
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s")
	room := e.lim.room()
	require.Equal(t, []string{"k1"}, line(t, e, "acme", "k1", "k2", "k3"))
	start := e.clock.Now()
	for i, id := range []string{"k2", "k3"} {
		e.clock.Advance(90 * time.Millisecond)
		if i > 0 {
			e.clock.Advance(10 * time.Millisecond)
		}
		turn, err := room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
		require.NoError(t, err)
		require.Len(t, turn.Promoted, 1, id)
		p := turn.Promoted[0]
		require.Equal(t, id, p.ID)
		require.Equal(t, start.Add(time.Duration(i+1)*100*time.Millisecond).UnixMicro(), p.Slot.UnixMicro(), "%s: one interval after the slot before", id)
		tk, ok := parseTicket(p.Ticket)
		require.True(t, ok, "%s: %q", id, p.Ticket)
		require.Equal(t, micros(ToleranceDefault), tk.late, id)
		require.Equal(t, tk.late, tk.slack, "%s: charged as late as it may start", id)
		e.keep(turn.Promoted)
	}
}

// pumpTurn is one pump's turn in the default queue, as Pump takes it, when
// tenant alone is due: it is taken from the index, its line promoted, the
// promoted jobs handed over and its next due time settled.
func pumpTurn(t *testing.T, e *env, tenant string) waitroom.Turn {
	t.Helper()
	ctx, room := context.Background(), e.lim.room()
	taken, err := room.take(ctx, waitroom.DefaultQueue, 10, waitroom.HoldDefault)
	require.NoError(t, err)
	require.Len(t, taken, 1)
	require.Equal(t, tenant, taken[0].tenant)
	turn, err := room.promote(ctx, tenant, waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	e.keep(turn.Promoted)
	room.handOver(ctx, turn.Promoted, (&engine{}).handover)
	require.NoError(t, room.settle(ctx, waitroom.DefaultQueue, taken, map[string]time.Time{tenant: turn.Due}))
	return turn
}

// TestRoomReleaseWithoutHandingOn: a release that hands nothing on (a
// worker shutting down) gives the slot back and makes the tenant due now,
// not at the lease's end a pump left it at.
func TestRoomReleaseWithoutHandingOn(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "pool", "concurrency=1")
	room := e.lim.room()
	require.Equal(t, []string{"p1"}, line(t, e, "pool", "p1", "p2"))
	d, err := e.lim.Admit(ctx, "pool", "p1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	turn := pumpTurn(t, e, "pool")
	require.Empty(t, turn.Promoted)
	require.Equal(t, e.clock.Now().Add(LeaseDefault).UnixMicro(), turn.Due.UnixMicro())

	require.NoError(t, room.Release(ctx, "pool", waitroom.DefaultQueue, "p1", d.Claim, waitroom.Scopes{}, nil, nil))
	st, err := e.lim.Stats(ctx, "pool")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "the slot is given back")
	require.Equal(t, int64(1), st.Waiting, "and not handed on")
	due, now, ok, err := room.next(ctx, waitroom.DefaultQueue)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, now.UnixMicro(), due.UnixMicro(), "due now")
	turn = pumpTurn(t, e, "pool")
	require.Len(t, turn.Promoted, 1)
	require.Equal(t, "p2", turn.Promoted[0].ID)
	require.ErrorIs(t, room.Release(ctx, "pool", waitroom.DefaultQueue, "p1", d.Claim, waitroom.Scopes{}, nil, nil), ErrClaimLost)
}

// TestRoomReleaseKeepsTheLineDue: a release that frees a slot but cannot
// hand it on yet (the line's head is not due by its rate: the release
// before it handed its slot on) leaves the tenant due at the head's slot,
// not where a pump last put it while the slots were all held (the lease's
// end, half a minute away).
func TestRoomReleaseKeepsTheLineDue(t *testing.T) {
	t.Parallel()
	e := setup(t, false, &Config{PromoteLead: 10 * time.Millisecond})
	ctx := context.Background()
	e.policy(t, "both", "rate=10/s concurrency=2")
	room := e.lim.room()
	start := e.clock.Now()
	pumpTurn := func() waitroom.Turn { return pumpTurn(t, e, "both") }
	claim := func(id string) uint64 {
		t.Helper()
		d := e.gate(t, "both", id)
		require.True(t, d.Allowed, "%s: %+v", id, d)
		return d.Claim
	}
	require.Equal(t, []string{"b1"}, line(t, e, "both", "b1", "b2", "b3", "b4"))
	c1 := claim("b1")
	e.clock.Advance(90 * time.Millisecond)
	turn := pumpTurn()
	require.Len(t, turn.Promoted, 1, "b2, its slot 10ms away")
	e.clock.Advance(10 * time.Millisecond)
	c2 := claim("b2")
	e.clock.Advance(90 * time.Millisecond)
	turn = pumpTurn()
	require.Empty(t, turn.Promoted, "b3's slot is due, but both slots are held")
	require.Equal(t, start.Add(LeaseDefault).UnixMicro(), turn.Due.UnixMicro(), "due at b1's lease end")

	// b1 ends: its slot goes to b3, which takes the rate slot; b2 ends 10ms
	// later, when b4's slot is 100ms away
	g := &engine{}
	require.NoError(t, room.Release(ctx, "both", waitroom.DefaultQueue, "b1", c1, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, []string{"b3"}, g.ids())
	e.clock.Advance(10 * time.Millisecond)
	require.NoError(t, room.Release(ctx, "both", waitroom.DefaultQueue, "b2", c2, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, []string{"b3"}, g.ids(), "b4's slot is 100ms away")
	due, _, ok, err := room.next(ctx, waitroom.DefaultQueue)
	require.NoError(t, err)
	require.True(t, ok, "the tenant stays in the index")
	require.Equal(t, start.Add(290*time.Millisecond).UnixMicro(), due.UnixMicro(),
		"due at b4's slot less the lead, not at b1's lease end (%s after the start)", due.Sub(start))

	// then a pump promotes b4
	e.clock.Advance(90 * time.Millisecond)
	turn = pumpTurn()
	require.Len(t, turn.Promoted, 1)
	require.Equal(t, "b4", turn.Promoted[0].ID)
}

// scriptCounts counts the runs of each of sluice's scripts a client makes
// (EVALSHA, and EVAL after NOSCRIPT), by the script's hash.
type scriptCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *scriptCounts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *scriptCounts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.observe(cmd)
		return next(ctx, cmd)
	}
}

func (c *scriptCounts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.observe(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *scriptCounts) observe(cmd redis.Cmder) {
	if cmd.Name() != "evalsha" {
		return
	}
	sha, _ := cmd.Args()[1].(string)
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[sha]++
	c.mu.Unlock()
}

// take returns the counts of script, then zeroes them all.
func (c *scriptCounts) take(script *redis.Script) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[script.Hash()]
	c.n = nil
	return n
}

// setupCounted is setup over a client that counts the script runs it
// makes.
func setupCounted(t *testing.T, real bool, cfg *Config) (*env, *scriptCounts) {
	t.Helper()
	client := redistest.UniversalClient(t)
	counts := &scriptCounts{}
	client.AddHook(counts)
	return setupOn(t, client, real, cfg), counts
}

// waitInLine brings job id of tenant in as a producer does when the fleet
// has no room: it arrives and joins its tenant's line.
func waitInLine(t *testing.T, e *env, tenant, id string) {
	t.Helper()
	a := arrive(t, e, tenant, id, false)
	require.False(t, a.Straight)
	joined, _, err := e.lim.room().Join(context.Background(), tenant, a.Backlog, waitroom.Waiter{ID: id})
	require.NoError(t, err)
	require.Equal(t, 1, joined)
}

// TestRoomReleaseHandsOnInOneStep: on one server, a release whose
// tenant's line held jobs at its last release goes straight to the
// hand-on (admit.lua's release op, one script run), without the small
// release (release.lua) that would only say again that jobs wait; once
// the line is empty, a release is the small release alone again.
func TestRoomReleaseHandsOnInOneStep(t *testing.T) {
	t.Parallel()
	if redistest.ClusterMode() {
		t.Skip("on a Cluster the small release gives back @global's slot even while jobs wait: it is never skipped")
	}
	client := redistest.Client(t)
	counts := &scriptCounts{}
	client.AddHook(counts)
	e := setupOn(t, client, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=1")
	room := e.lim.room()
	require.Equal(t, []string{"a1"}, line(t, e, "acme", "a1", "a2", "a3"))
	d, err := e.lim.Admit(ctx, "acme", "a1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	claim := d.Claim
	g := &engine{}
	counts.take(lua.Release)

	// a1 ends: the small release finds a2 and a3 waiting, and the hand-on
	// gives a1's slot to a2
	require.NoError(t, room.Release(ctx, "acme", waitroom.DefaultQueue, "a1", claim, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, []string{"a2"}, g.ids())
	require.Equal(t, 1, counts.take(lua.Release), "the first release asks whether jobs wait")

	// a2 ends: a3 still waited at a1's release, so the slot goes straight
	// to it
	e.keep(g.handed)
	claim = e.redeem(t, "acme", "a2").Claim
	counts.take(lua.Release)
	require.NoError(t, room.Release(ctx, "acme", waitroom.DefaultQueue, "a2", claim, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, []string{"a2", "a3"}, g.ids())
	require.Zero(t, counts.take(lua.Release), "no small release: the hand-on alone")

	// a3 ends with the line empty (a2's hand-on said so): the small
	// release alone gives the slot back
	e.keep(g.handed)
	claim = e.redeem(t, "acme", "a3").Claim
	counts.take(lua.Release)
	require.NoError(t, room.Release(ctx, "acme", waitroom.DefaultQueue, "a3", claim, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, 1, counts.take(lua.Release))
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "every slot is back")
	require.Zero(t, st.Waiting)
	require.Equal(t, []string{"a2", "a3"}, g.ids(), "nothing more handed on")
}

// TestRoomReleaseYieldsWhenNotFull: a release whose tenant's line waits
// for none of its slots (the tenant was below its concurrency limit: the
// line waits for the fleet's room or its turn) gives its slot back and
// makes the tenant due, in one script run on one server, and hands
// nothing on: the pumps promote the line in their turns, many tenants in
// one run. A release that frees the slot the line waits for (the tenant
// was at its limit) hands it on as before.
func TestRoomReleaseYieldsWhenNotFull(t *testing.T) {
	t.Parallel()
	e, counts := setupCounted(t, false, nil)
	ctx := context.Background()
	q := waitroom.DefaultQueue
	e.policy(t, "roomy", "concurrency=3")
	room := e.lim.room()
	// r2 and r3 wait in the line (the fleet had no room for them)
	waitInLine(t, e, "roomy", "r2")
	waitInLine(t, e, "roomy", "r3")
	// a pump left the tenant due later (held by its turn, say)
	later := e.clock.Now().Add(time.Minute).UnixMicro()
	require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, q, dueShard("roomy")), redis.Z{Score: float64(later), Member: "roomy"}).Err())
	d, err := e.lim.Admit(ctx, "roomy", "r1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	g := &engine{}
	counts.take(lua.Release)
	require.NoError(t, room.Release(ctx, "roomy", q, "r1", d.Claim, waitroom.Scopes{}, g.handover, nil))
	require.Empty(t, g.ids(), "nothing handed on: the line waited for no slot of r1's")
	st, err := e.lim.Stats(ctx, "roomy")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "r1's slot is back")
	require.Equal(t, int64(2), st.Waiting, "r2 and r3 still wait")
	due, now, ok, err := room.next(ctx, q)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, now.UnixMicro(), due.UnixMicro(), "the tenant is due now, for the pumps")
	n := counts.take(lua.Release)
	if !e.lim.cluster {
		require.Equal(t, 1, n, "one script run: the release and the mark")
		require.Zero(t, counts.take(lua.Room), "no turn asked, no mark of its own")
	}
	// the claim is spent: a second release says so and changes nothing
	require.ErrorIs(t, room.Release(ctx, "roomy", q, "r1", d.Claim, waitroom.Scopes{}, g.handover, nil), ErrClaimLost)
	require.Empty(t, g.ids())

	// a tenant a pump holds keeps its turn: a release does not make it
	// due meanwhile (a second pump would take it, and the turns would
	// no longer follow the weights)
	held := e.clock.Now().Add(waitroom.HoldDefault).UnixMicro()
	require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, q, dueShard("roomy")), redis.Z{Score: float64(held), Member: "roomy"}).Err())
	d, err = e.lim.Admit(ctx, "roomy", "r9")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, room.Release(ctx, "roomy", q, "r9", d.Claim, waitroom.Scopes{}, g.handover, nil))
	require.Empty(t, g.ids())
	score, err := e.client.ZScore(ctx, dueKey(e.prefix, q, dueShard("roomy")), "roomy").Result()
	require.NoError(t, err)
	require.Equal(t, float64(held), score, "the pump's hold stands")
	st, err = e.lim.Stats(ctx, "roomy")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "r9's slot is back")

	// at its limit, the line waits for the slot: it is handed on
	e.policy(t, "full", "concurrency=1")
	require.Equal(t, []string{"f1"}, line(t, e, "full", "f1", "f2"))
	d, err = e.lim.Admit(ctx, "full", "f1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, room.Release(ctx, "full", q, "f1", d.Claim, waitroom.Scopes{}, g.handover, nil))
	require.Equal(t, []string{"f2"}, g.ids(), "f1's slot went to f2")
}

// TestRoomReleaseAll: a worker's releases that came together go back in
// one release.lua run on one server: a job with nobody waiting gives its
// slot back, one whose line waits for no slot of its gives it back and
// makes its tenant due, one whose line waits for its slot hands it on,
// and a claim that holds nothing says so; each job gets its own answer.
func TestRoomReleaseAll(t *testing.T) {
	t.Parallel()
	e, counts := setupCounted(t, false, nil)
	ctx := context.Background()
	q := waitroom.DefaultQueue
	room := e.lim.room()
	e.policy(t, "alone", "concurrency=5")
	e.policy(t, "roomy", "concurrency=5")
	e.policy(t, "full", "concurrency=1")
	admit := func(tenant, id string) uint64 {
		t.Helper()
		d, err := e.lim.Admit(ctx, tenant, id)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%s/%s", tenant, id)
		return d.Claim
	}
	ca := admit("alone", "a1")
	cr := admit("roomy", "r1")
	waitInLine(t, e, "roomy", "r2")
	cf := admit("full", "f1")
	waitInLine(t, e, "full", "f2")
	cl := admit("alone", "l1")
	require.NoError(t, e.lim.Release(ctx, "alone", "l1", cl))
	g := &engine{}
	counts.take(lua.Release)
	errs := room.ReleaseAll(ctx, []waitroom.Releasing{
		{Tenant: "alone", Queue: q, ID: "a1", Claim: ca},
		{Tenant: "roomy", Queue: q, ID: "r1", Claim: cr},
		{Tenant: "full", Queue: q, ID: "f1", Claim: cf},
		{Tenant: "alone", Queue: q, ID: "l1", Claim: cl},
	}, g.handover, nil)
	require.Len(t, errs, 4)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.NoError(t, errs[2])
	require.ErrorIs(t, errs[3], ErrClaimLost, "l1's slot went back already")
	if !e.lim.cluster {
		require.Equal(t, 1, counts.take(lua.Release), "the small releases in one run")
	}
	require.Equal(t, []string{"f2"}, g.ids(), "full's slot went to f2, roomy's to nobody")
	for tenant, want := range map[string]int64{"alone": 0, "roomy": 0, "full": 1} {
		st, err := e.lim.Stats(ctx, tenant)
		require.NoError(t, err)
		require.Equal(t, want, st.Concurrency.InFlight, tenant)
	}
	score, err := e.client.ZScore(ctx, dueKey(e.prefix, q, dueShard("roomy")), "roomy").Result()
	require.NoError(t, err)
	require.LessOrEqual(t, score, float64(e.clock.Now().UnixMicro()), "roomy is due: r2 waits for a pump")
}

// TestRoomGoneAndRunningJobs: a line entry whose job the engine no longer
// has is dropped and what its promotion took given back; one whose job
// runs already (brought by the engine's fallback) is dropped uncharged.
func TestRoomGoneAndRunningJobs(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=5 concurrency=5")
	room := e.lim.room()
	_, _, err := room.Join(ctx, "acme", 0, waitroom.Waiter{ID: "gone"}, waitroom.Waiter{ID: "ran"}, waitroom.Waiter{ID: "ok"})
	require.NoError(t, err)
	d, err := e.lim.Admit(ctx, "acme", "ran") // the fallback brought it
	require.NoError(t, err)
	require.True(t, d.Allowed)

	turn, err := room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Equal(t, 1, turn.Skipped, "the running job")
	var ids []string
	for _, p := range turn.Promoted {
		ids = append(ids, p.ID)
	}
	require.Equal(t, []string{"gone", "ok"}, ids)
	g := &engine{answer: func(p waitroom.Promoted) waitroom.HandoverResult {
		if p.ID == "gone" {
			return waitroom.Gone
		}
		return waitroom.Handed
	}}
	handed, gone, err := room.handOver(ctx, turn.Promoted, g.handover)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"acme": 1}, handed)
	require.Equal(t, map[string]int{"acme": 1}, gone)
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Concurrency.InFlight, "ran and ok; gone's slot was given back")
	require.Zero(t, st.Reservations, "ok carries its decision, gone's was given back")
	// gone's charge stays (ok's follows it, and a meter takes back its
	// last charge only): a slot lost, never one too many
	require.Equal(t, int64(2), st.Rates[0].Available, "5 less ran, ok and gone's charge")
	require.Zero(t, st.Waiting)
	n, err := e.client.ZCard(ctx, keysFor(e.prefix, "acme").handing).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestRoomHandOverConfirmedByTheEngine: on one server a promoted job names
// the handing set that holds its entry (Promoted.Handing), so a hand-over
// on a client that shares the room's server (Room.Shares) can take it out
// there itself and answer Confirmed, and the room counts it handed without
// confirming it again; on a Cluster it names none, and the room confirms.
func TestRoomHandOverConfirmedByTheEngine(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=100/s burst=10 concurrency=10")
	room := e.lim.room()
	require.Equal(t, !e.lim.cluster, room.Shares(e.client))
	require.False(t, room.Shares(nil))
	_, _, err := room.Join(ctx, "acme", 0, waitroom.Waiter{ID: "a"}, waitroom.Waiter{ID: "b"})
	require.NoError(t, err)
	turn, err := room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Len(t, turn.Promoted, 2)
	handing := keysFor(e.prefix, "acme").handing
	g := &engine{answer: func(p waitroom.Promoted) waitroom.HandoverResult {
		if p.Handing == "" {
			return waitroom.Handed
		}
		// what asynqroom.Handover does in its script
		require.Equal(t, handing, p.Handing)
		n, err := e.client.ZRem(ctx, p.Handing, p.Entry).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "the entry is in the set Handing names")
		return waitroom.Confirmed
	}}
	handed, gone, err := room.handOver(ctx, turn.Promoted, g.handover)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"acme": 2}, handed)
	require.Empty(t, gone)
	for _, p := range turn.Promoted {
		require.Equal(t, e.lim.cluster, p.Handing == "", "a Handing on one server only")
	}
	n, err := e.client.ZCard(ctx, handing).Result()
	require.NoError(t, err)
	require.Zero(t, n, "every hand-over confirmed")
}

// TestRoomPump: the pump serves due tenants in turn while the fleet has
// room, each an equal share times its weight, and a policy change makes
// the waiting tenants due at once.
func TestRoomPump(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.policy(t, "heavy", "weight=3")
	room := e.lim.room()
	for _, tenant := range []string{"heavy", "light1", "light2"} {
		joinJobs(t, room, tenant, 30)
	}
	// the fleet takes 10 jobs, then nothing until the test says so
	f := &fleetRoom{free: 10}
	g := &f.engine
	done := f.pump(ctx, room)
	count := f.perTenant
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) >= 10 })
	c := count()
	t.Logf("first round: %v", c)
	require.Equal(t, 10, len(g.ids()))
	require.Greater(t, c["heavy"], c["light1"], "weight=3 gets a larger share")
	require.Positive(t, c["light1"])
	require.Positive(t, c["light2"])

	// room for everything: every line drains, none left behind
	f.add(1000)
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == 90 })
	for _, tenant := range []string{"heavy", "light1", "light2"} {
		n, _, err := room.Waiting(ctx, tenant)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	cancel()
	<-done
}

// TestRoomPumpServesManyTenantsSeveralJobsATurn: with many tenants due
// and room for fewer jobs than tenants, a round serves a few of them for
// minTurn jobs each, in the index's order, rather than each for one (a
// turn's fixed cost then falls on several jobs); a turn the room cut
// short goes on first, and every tenant gets its turn before any gets a
// second.
func TestRoomPumpServesManyTenantsSeveralJobsATurn(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	room := e.lim.room()
	const tenants = 16
	for i := range tenants {
		joinJobs(t, room, fmt.Sprintf("t%02d", i), 12)
	}
	f := &fleetRoom{}
	g := &f.engine
	done := f.pump(ctx, room)
	count := f.perTenant
	// room for a job of each: a round serves every tenant once, and the
	// pump knows that many are due
	f.add(tenants)
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == tenants })
	c := count()
	for i := range tenants {
		require.Equal(t, 1, c[fmt.Sprintf("t%02d", i)], "first round: %v", c)
	}
	// then room for 6 jobs a round: the tenants in turn, four jobs each
	// (each had more jobs than its room last time), a turn the room cut
	// short going on at the next round; no tenant has a second turn before
	// every one had its first (60 jobs < 16 turns)
	const room6 = 6
	for round := 1; round <= 10; round++ {
		f.add(room6)
		waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == tenants+round*room6 })
		full, part := 0, 0
		for tenant, n := range count() {
			switch extra := n - 1; {
			case extra == minTurn:
				full++
			case extra > minTurn:
				t.Fatalf("round %d: tenant %s had a second turn: %v", round, tenant, count())
			case extra > 0:
				part++
			}
		}
		// a turn cut short leaves the rest of its room to the next round:
		// at most two turns are partial
		require.GreaterOrEqual(t, full, round*room6/minTurn-1, "round %d: whole turns of %d jobs: %v", round, minTurn, count())
		require.LessOrEqual(t, part, 2, "round %d: turns cut short: %v", round, count())
	}
	// room for everything: every line drains
	f.add(1000)
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == tenants*12 })
	cancel()
	<-done
}

// TestRoomPumpKicked: a pump that found the fleet full looks again when a
// job of its worker ends (PumpConfig.Kick), not after its Interval (an
// hour here): the line's next job is handed over at once.
func TestRoomPumpKicked(t *testing.T) {
	t.Parallel()
	f, kick, stop := kickedPump(t, nil)
	defer stop()
	for want := 2; want <= 5; want++ {
		// a job ends: its slot is free, and the pump is told
		f.add(1)
		kick <- struct{}{}
		waitFor(t, 5*time.Second, func() bool { return len(f.ids()) == want })
	}
}

// TestRoomPumpKickedWaitsForABatch: with the pending list's drain time
// known (PumpConfig.Drain), a kicked pump waits a quarter of it after its
// last round, so that the slots freed meanwhile are refilled in one round.
func TestRoomPumpKickedWaitsForABatch(t *testing.T) {
	t.Parallel()
	// a list that lasts 8 s: a kicked round waits 2 s
	f, kick, stop := kickedPump(t, func(string) time.Duration { return 8 * time.Second })
	defer stop()
	looks := f.looks()
	// a job ends: the pump is told, and waits
	f.add(1)
	kick <- struct{}{}
	require.Never(t, func() bool { return f.looks() > looks }, 500*time.Millisecond, 10*time.Millisecond,
		"a kicked round waits a quarter of the list's drain time")
	// two more end meanwhile: one round serves the three
	f.add(2)
	waitFor(t, 10*time.Second, func() bool { return len(f.ids()) == 4 })
	require.Equal(t, looks+1, f.looks(), "one round for the three freed slots")
}

// kickedPump runs a pump over a fleet with one free place and five jobs of
// one tenant in line (its Interval and Idle an hour, told on kick that a
// job ended, drain its PumpConfig.Drain), and returns once the pump handed
// one job over and found the fleet full. stop ends the pump.
func kickedPump(t *testing.T, drain func(string) time.Duration) (f *fleetRoom, kick chan struct{}, stop func()) {
	t.Helper()
	e := setup(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	room := e.lim.room()
	joinJobs(t, room, "acme", 5)
	f = &fleetRoom{free: 1}
	kick = make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = room.Pump(ctx, &waitroom.PumpConfig{Handover: f.handover, Free: f.Free, Queues: []string{waitroom.DefaultQueue},
			Interval: time.Hour, Idle: time.Hour, Kick: kick, Drain: drain})
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-done
	})
	t.Cleanup(stop)
	waitFor(t, 5*time.Second, func() bool { return len(f.ids()) == 1 })
	// the fleet is full: the pump looked and waits its hour
	waitFor(t, 5*time.Second, func() bool { return f.looks() >= 2 })
	return f, kick, stop
}

// TestRoomPumpGivesTheRoomToTheLinesThatWait: tenants whose turns emptied
// their lines no longer share out a round's room, so the one tenant left
// waiting gets all of it in one turn rather than a job per turn (before,
// the small tenants seen in the last second kept its quantum at one job,
// four for a hungry tenant).
func TestRoomPumpGivesTheRoomToTheLinesThatWait(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	room := e.lim.room()
	for i := range 10 {
		joinJobs(t, room, fmt.Sprintf("small%d", i), 1)
	}
	joinJobs(t, room, "big", 50)
	f := &fleetRoom{free: 11}
	g := &f.engine
	kick := make(chan struct{}, 1)
	var mu sync.Mutex
	var bigTurns []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = room.Pump(ctx, &waitroom.PumpConfig{Handover: f.handover, Free: f.Free, Queues: []string{waitroom.DefaultQueue},
			Interval: time.Hour, Idle: time.Hour, Kick: kick,
			OnTurn: func(tenant string, turn waitroom.Turn, _, _ int) {
				if tenant == "big" {
					mu.Lock()
					bigTurns = append(bigTurns, len(turn.Promoted))
					mu.Unlock()
				}
			}})
	}()
	// a job of each: the small tenants' lines are empty
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == 11 })
	waitFor(t, 5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.free == 0 && f.asked >= 2
	})
	// eight slots free: the big tenant's turn takes them all
	f.add(8)
	kick <- struct{}{}
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == 19 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 8}, bigTurns, "one turn for the eight slots")
}

// TestRoomPumpRoundInOneRun: a pump's round gives every tenant it serves
// its turn in one admit.lua run on one server (one pipeline on a
// Cluster), not one run per tenant, and each turn promotes from its own
// line as a turn of its own would.
func TestRoomPumpRoundInOneRun(t *testing.T) {
	t.Parallel()
	e, counts := setupCounted(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	room := e.lim.room()
	const tenants = 8
	for i := range tenants {
		e.policy(t, fmt.Sprintf("t%d", i), "rate=1000/s burst=100 concurrency=100")
		joinJobs(t, room, fmt.Sprintf("t%d", i), 3)
	}
	counts.take(lua.Admit)
	// room for one job of each: one round
	f := &fleetRoom{free: tenants}
	g := &f.engine
	done := f.pump(ctx, room)
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == tenants })
	runs := counts.take(lua.Admit)
	cancel()
	<-done
	c := f.perTenant()
	for i := range tenants {
		require.Equal(t, 1, c[fmt.Sprintf("t%d", i)], "one job of each tenant: %v", c)
	}
	if e.lim.cluster {
		require.Equal(t, tenants, runs, "a run per tenant, in one pipeline (the tenants are in different slots)")
	} else {
		require.Equal(t, 1, runs, "the round's turns in one run")
	}
	for i := range tenants {
		n, _, err := room.Waiting(context.Background(), fmt.Sprintf("t%d", i))
		require.NoError(t, err)
		require.Equal(t, int64(2), n, "two left in each line")
	}
}

// fleetRoom is a fleet's pending list with free places for a pump: its
// hand-over takes them, Free reports them (and counts the looks).
type fleetRoom struct {
	engine
	mu          sync.Mutex
	free, asked int
}

func (f *fleetRoom) handover(ctx context.Context, jobs []waitroom.Promoted) []waitroom.HandoverResult {
	f.add(-len(jobs))
	return f.engine.handover(ctx, jobs)
}

func (f *fleetRoom) Free(context.Context, string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.free, nil
}

// pump runs room's pump over the fleet f (its Free and hand-over) until
// ctx ends, looking again every 5 ms while f is full; the channel closes
// when it returned.
func (f *fleetRoom) pump(ctx context.Context, room *room) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = room.Pump(ctx, &waitroom.PumpConfig{Handover: f.handover, Free: f.Free, Queues: []string{waitroom.DefaultQueue},
			Interval: 5 * time.Millisecond})
	}()
	return done
}

// perTenant counts the jobs handed to f by tenant (joinJobs' ids,
// TENANT-N).
func (f *fleetRoom) perTenant() map[string]int {
	out := map[string]int{}
	for _, id := range f.engine.ids() {
		out[id[:strings.LastIndex(id, "-")]]++
	}
	return out
}

func (f *fleetRoom) add(n int) {
	f.mu.Lock()
	f.free += n
	f.mu.Unlock()
}

func (f *fleetRoom) looks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRoomSweepFindsLostLines: a producer that died between its line and
// the due index left a line no pump knows of; the pumps' sweep finds it.
func TestRoomSweepFindsLostLines(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// the line alone, as line.lua leaves it
	_, err := e.client.RPush(ctx, keysFor(e.prefix, "lost").line(waitroom.DefaultQueue), "1\x1f\x1f\x1flost-1").Result()
	require.NoError(t, err)
	g := &engine{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.lim.room().Pump(ctx, &waitroom.PumpConfig{Queues: []string{waitroom.DefaultQueue}, Handover: g.handover, Free: func(context.Context, string) (int, error) { return 10, nil }})
	}()
	waitFor(t, 5*time.Second, func() bool { return len(g.ids()) == 1 })
	require.Equal(t, []string{"lost-1"}, g.ids())
	cancel()
	<-done
}

// TestRoomDrainsUnderTheDefault: a tenant whose policy is deleted while
// its jobs wait drains under the default policy.
func TestRoomDrainsUnderTheDefault(t *testing.T) {
	t.Parallel()
	e := setup(t, false, &Config{PromoteLead: time.Millisecond})
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/h")
	e.policy(t, DefaultPolicy, "rate=10/s")
	room := e.lim.room()
	require.Equal(t, []string{"j1"}, line(t, e, "acme", "j1", "j2", "j3"))
	turn, err := room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Empty(t, turn.Promoted, "1/h: the next slot is an hour away")
	_, err = e.store.Delete(ctx, "acme")
	require.NoError(t, err)
	e.lim.policies.invalidate()
	// the meter j1 charged at 1/h is re-timed to 10/s: the unit it held
	// ahead (all but the moment that passed) is 100ms now, not an hour
	turn, err = room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Empty(t, turn.Promoted)
	require.WithinDuration(t, e.clock.Now().Add(100*time.Millisecond), turn.Due, time.Millisecond)
	e.clock.Advance(100 * time.Millisecond)
	turn, err = room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Len(t, turn.Promoted, 1, "under * (10/s) the head may go 100ms after the change")
	e.clock.Advance(100 * time.Millisecond)
	turn, err = room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 10)
	require.NoError(t, err)
	require.Len(t, turn.Promoted, 1)
	require.Zero(t, turn.Waiting)
}

// TestRoomLineMemory measures what a waiting job costs Redis beyond
// asynq's own task: its line entry (MEMORY USAGE of a line of 200,000
// UUID-sized entries, per entry), and checks a line holds such a burst.
func TestRoomLineMemory(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	const n = 200_000
	room := e.lim.room()
	batch := make([]waitroom.Waiter, 0, 1000)
	for i := 0; i < n; i++ {
		batch = append(batch, waitroom.Waiter{ID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)})
		if len(batch) == cap(batch) {
			_, _, err := room.Join(ctx, "burst", 0, batch...)
			require.NoError(t, err)
			batch = batch[:0]
		}
	}
	n2, oldest, err := room.Waiting(ctx, "burst")
	require.NoError(t, err)
	require.Equal(t, int64(n), n2)
	require.False(t, oldest.IsZero())
	bytes, err := e.client.MemoryUsage(ctx, keysFor(e.prefix, "burst").line(waitroom.DefaultQueue), 0).Result()
	require.NoError(t, err)
	per := float64(bytes) / n
	t.Logf("a line of %d waiting jobs (UUID task ids): %d bytes, %.1f bytes per job", n, bytes, per)
	require.Less(t, per, 100.0, "a waiting job costs at most ~100 bytes beyond asynq's task")
}

// TestRoomDecidesOnce: a job the room lets start (straight, or promoted
// from its line) carries its decision, a ticket, when its tenant has room
// to spare: the gate starts it on the ticket with no further decision.
// The ticket holds only while the job is in time for its slot and the
// policies are the ones it was decided by; a job that comes late is
// decided anew and charged once; a tenant near its limits gets no ticket
// (the gate decides when the job starts, on a reservation).
func TestRoomDecidesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "roomy", "rate=100/s burst=50 concurrency=5")
	e.policy(t, "tight", "rate=10/s burst=2")

	a := arrive(t, e, "roomy", "r1", true)
	require.True(t, a.Straight)
	require.NotEmpty(t, a.Ticket)
	st, err := e.lim.Stats(ctx, "roomy")
	require.NoError(t, err)
	require.Zero(t, st.Reservations, "decided once: no reservation for the gate")
	require.Equal(t, int64(1), st.Started, "charged on the started meter at its slot")
	d := e.redeem(t, "roomy", "r1")
	require.Equal(t, a.Claim, d.Claim, "it starts on the concurrency slot it took")
	require.Equal(t, a.Slot, d.Slot)
	require.Equal(t, LeaseDefault, d.Lease)

	// in time up to its slack: the tenant's burst left allows it
	tk, ok := parseTicket(a.Ticket)
	require.True(t, ok)
	require.Positive(t, tk.slack, "a roomy tenant's ticket has slack")
	require.LessOrEqual(t, tk.slack, int64(50000)+micros(ToleranceDefault), "at most 50 ms and the tolerance")
	require.Equal(t, tk.slack, tk.late, "charged as late as it may start")
	e.clock.Advance(time.Duration(tk.late)*time.Microsecond + time.Microsecond)
	_, ok, err = e.lim.redeem(ctx, Request{Tenant: "roomy", ID: "r1"}, a.Ticket)
	require.NoError(t, err)
	require.False(t, ok, "too late for its slot")
	// decided anew: its own charge, the last, is taken back first
	before, err := e.lim.Stats(ctx, "roomy")
	require.NoError(t, err)
	d, err = e.lim.Do(ctx, Request{Tenant: "roomy", ID: "r1", Ticket: a.Ticket})
	require.NoError(t, err)
	require.True(t, d.Allowed, "%+v", d)
	after, err := e.lim.Stats(ctx, "roomy")
	require.NoError(t, err)
	require.Equal(t, before.Rates[0].Available, after.Rates[0].Available, "charged once: the late start replaces its charge at the slot")

	// another policy than the one it was decided by: decided anew
	b := arrive(t, e, "roomy", "r2", true)
	require.NotEmpty(t, b.Ticket)
	e.policy(t, "roomy", "rate=100/s burst=40 concurrency=5")
	_, ok, err = e.lim.redeem(ctx, Request{Tenant: "roomy", ID: "r2"}, b.Ticket)
	require.NoError(t, err)
	require.False(t, ok, "the policy changed since")

	// without a rate a job is never late; a third of its lease gone, it
	// is renewed first; its lease run out, it is decided anew (another
	// admission may hold the slot)
	e.policy(t, "pool", "concurrency=2")
	c := arrive(t, e, "pool", "r3", true)
	require.NotEmpty(t, c.Ticket)
	e.clock.Advance(LeaseDefault / 2)
	d, ok, err = e.lim.redeem(ctx, Request{Tenant: "pool", ID: "r3"}, c.Ticket)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c.Claim, d.Claim)
	e.clock.Advance(LeaseDefault - time.Second)
	_, ok, err = e.lim.redeem(ctx, Request{Tenant: "pool", ID: "r3"}, c.Ticket)
	require.NoError(t, err)
	require.True(t, ok, "renewed at the first redemption, the slot is still held")
	e.clock.Advance(2 * LeaseDefault)
	_, ok, err = e.lim.redeem(ctx, Request{Tenant: "pool", ID: "r3"}, c.Ticket)
	require.NoError(t, err)
	require.False(t, ok, "its lease ran out")

	// near its limits: the ticket carries a reservation only; the gate
	// waits for its slot, then decides on the reservation
	n := arrive(t, e, "tight", "t1", true)
	require.True(t, n.Straight)
	require.NotEmpty(t, n.Ticket)
	st, err = e.lim.Stats(ctx, "tight")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Reservations)
	d, ok, err = e.lim.redeem(ctx, Request{Tenant: "tight", ID: "t1"}, n.Ticket)
	require.NoError(t, err)
	require.False(t, ok, "decided by the gate")
	require.True(t, d.Reserved)
	require.Equal(t, n.Slot, d.Slot, "when to ask")

	// unreadable tickets are decided anew
	for _, bad := range []string{"", "x", "1:2:3", "2:1:1:1:1:1:1", "1:-5:0:0:0:0:0"} {
		_, ok, err := e.lim.redeem(ctx, Request{Tenant: "roomy", ID: "r9"}, bad)
		require.NoError(t, err)
		require.False(t, ok, "%q", bad)
	}
}

// TestRoomJoinMillion: one Join of 1,000,000 jobs of one tenant (a batch
// of that size from EnqueueBatch) puts them all in the line, in order, in
// bounded pieces: no script unpacks more than a piece. Skipped with -short.
func TestRoomJoinMillion(t *testing.T) {
	if testing.Short() {
		t.Skip("a million jobs: skipped with -short")
	}
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	const n = 1_000_000
	ws := make([]waitroom.Waiter, n)
	for i := range ws {
		ws[i] = waitroom.Waiter{ID: fmt.Sprintf("j%07d", i)}
	}
	start := time.Now()
	joined, waiting, err := e.lim.room().Join(ctx, "huge", 0, ws...)
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, n, joined)
	require.Equal(t, int64(n), waiting)
	key := keysFor(e.prefix, "huge").line(waitroom.DefaultQueue)
	t.Cleanup(func() { e.client.Del(context.Background(), key) })
	t.Logf("%d jobs joined one line in %s", n, took.Round(time.Millisecond))
	for _, i := range []int64{0, n / 2, n - 1} {
		m, err := e.client.LIndex(ctx, key, i).Result()
		require.NoError(t, err)
		le, ok := parseLineEntry(m)
		require.True(t, ok, m)
		require.Equal(t, fmt.Sprintf("j%07d", i), le.id, "in order")
	}
}

// TestRoomIndexManyTenants: the due index takes and marks thousands of
// tenants in one call (room.lua once unpacked them whole into one ZADD).
func TestRoomIndexManyTenants(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	room := e.lim.room()
	tenants := make([]string, 9000)
	for i := range tenants {
		tenants[i] = fmt.Sprint("t", i)
	}
	require.NoError(t, room.mark(ctx, waitroom.DefaultQueue, tenants...))
	taken, err := room.take(ctx, waitroom.DefaultQueue, len(tenants), waitroom.HoldDefault)
	require.NoError(t, err)
	require.Len(t, taken, len(tenants))
	require.NoError(t, room.markAll(ctx, waitroom.DefaultQueue))
	taken, err = room.take(ctx, waitroom.DefaultQueue, len(tenants), waitroom.HoldDefault)
	require.NoError(t, err)
	require.Len(t, taken, len(tenants), "every tenant due again")
}

// TestRoomSweepJoinsOrphans: a producer that died between parking a job
// and its line left the job's intent (recorded by Arrive); the sweep puts
// the job in its line once the intent is older than intentAge and the
// task is still parked, and drops the intents of tasks that run or are
// done (at once) or that do not exist (after intentGoneAge). A job that
// joined its line left no intent.
func TestRoomSweepJoinsOrphans(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	e.policy(t, "acme", "rate=1/s")
	intents := keysFor(e.prefix, "acme").intents
	count := func() int64 {
		n, err := e.client.ZCard(ctx, intents).Result()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, []string{"j1"}, line(t, e, "acme", "j1", "j2"))
	require.Zero(t, count(), "a job that joined its line leaves no intent")
	for _, id := range []string{"o1", "o2", "missing", "ran"} {
		require.False(t, arrive(t, e, "acme", id, true).Straight)
	}
	require.Equal(t, int64(4), count())
	state := map[string]waitroom.TaskState{"o1": waitroom.TaskParked, "o2": waitroom.TaskParked, "missing": waitroom.TaskMissing, "ran": waitroom.TaskElsewhere}
	var looked []string
	lookup := func(_ context.Context, tenant string, jobs []waitroom.Waiter) ([]waitroom.TaskState, error) {
		require.Equal(t, "acme", tenant)
		out := make([]waitroom.TaskState, len(jobs))
		for i, j := range jobs {
			looked = append(looked, j.ID)
			out[i] = state[j.ID]
		}
		return out, nil
	}
	require.NoError(t, room.sweepOrphans(ctx, lookup))
	require.Empty(t, looked, "young intents: their producers may be about to join them")
	e.clock.Advance(intentAge)
	require.NoError(t, room.sweep(ctx, nil, lookup, nil))
	ws, err := room.WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	var ids []string
	for _, w := range ws {
		ids = append(ids, w.ID)
	}
	require.Equal(t, []string{"j2", "o1", "o2"}, ids, "the parked orphans joined the line, in the order they came")
	require.Equal(t, int64(1), count(), "the missing task's intent waits a while")
	e.clock.Advance(intentGoneAge)
	require.NoError(t, room.sweepOrphans(ctx, lookup))
	require.Zero(t, count())

	// a producer's join after the sweep took its job counts it, once
	require.False(t, arrive(t, e, "acme", "late", true).Straight)
	e.clock.Advance(intentAge)
	state["late"] = waitroom.TaskParked
	require.NoError(t, room.sweepOrphans(ctx, lookup))
	joined, waiting, err := room.JoinArrived(ctx, "acme", 0, waitroom.Waiter{ID: "late"})
	require.NoError(t, err)
	require.Equal(t, 1, joined)
	require.Equal(t, int64(4), waiting, "in its line once")
}

// TestRoomCostlyHeads: the round robin's deficit counts cost only where a
// rule counts it, a running head leaves the line whatever it costs, and a
// head its rate holds back keeps the deficit it gathered.
func TestRoomCostlyHeads(t *testing.T) {
	t.Parallel()
	e := setup(t, false, &Config{PromoteLead: time.Millisecond})
	ctx := context.Background()
	room := e.lim.room()
	ids := func(turn waitroom.Turn) []string {
		var out []string
		for _, p := range turn.Promoted {
			out = append(out, p.ID)
		}
		return out
	}

	// concurrency only: a job is one in the round robin, whatever its cost
	e.policy(t, "pool", "concurrency=3")
	_, _, err := room.Join(ctx, "pool", 0, waitroom.Waiter{ID: "big", Cost: 1_000_000}, waitroom.Waiter{ID: "small"})
	require.NoError(t, err)
	turn, err := room.promote(ctx, "pool", waitroom.DefaultQueue, 10, 2)
	require.NoError(t, err)
	require.Equal(t, []string{"big", "small"}, ids(turn), "a quantum of 2 serves two jobs")

	// a running head leaves the line at once, though its cost exceeds
	// the deficit
	e.policy(t, "acme", "rate=100/s burst=100 concurrency=5")
	_, _, err = room.Join(ctx, "acme", 0, waitroom.Waiter{ID: "ran", Cost: 50}, waitroom.Waiter{ID: "ok"})
	require.NoError(t, err)
	d, err := e.lim.Admit(ctx, "acme", "ran") // the fallback brought it
	require.NoError(t, err)
	require.True(t, d.Allowed)
	turn, err = room.promote(ctx, "acme", waitroom.DefaultQueue, 10, 1)
	require.NoError(t, err)
	require.Equal(t, 1, turn.Skipped, "the running head")
	require.Equal(t, []string{"ok"}, ids(turn))

	// a head its rate holds back keeps what it is owed: it goes at its
	// slot, in one turn, not after gathering its cost again
	e.policy(t, "meter", "rate=10/s burst=10")
	_, _, err = room.Join(ctx, "meter", 0, waitroom.Waiter{ID: "a", Cost: 10}, waitroom.Waiter{ID: "b", Cost: 5})
	require.NoError(t, err)
	turns := func(id string) int {
		for n := 1; n <= 100; n++ {
			turn, err := room.promote(ctx, "meter", waitroom.DefaultQueue, 10, 1)
			require.NoError(t, err)
			if len(turn.Promoted) > 0 {
				require.Equal(t, []string{id}, ids(turn))
				return n
			}
			if turn.Due.After(e.clock.Now()) {
				e.clock.Set(turn.Due)
			}
		}
		t.Fatalf("%s was not promoted in 100 turns", id)
		return 0
	}
	require.Equal(t, 10, turns("a"), "a gathers a deficit of 10, a quantum a turn; the bucket is full")
	// b gathers 5 and is held back by the rate (the bucket is empty) for
	// 500ms; at its slot one turn serves it
	require.Equal(t, 6, turns("b"), "5 turns to gather its cost, 1 at its slot")
}

// TestRoomPolicyChangeRemarksOnce: a pump's start is no policy change (the
// store's watcher starting is not one), and a change re-marks the waiting
// tenants once for the fleet, however many pumps run: one takes the
// change's version and does it.
func TestRoomPolicyChangeRemarksOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	room := e.lim.room()
	// a tenant due in an hour: re-marked, it becomes due now
	later := time.Now().Add(time.Hour)
	require.NoError(t, room.markAt(ctx, waitroom.DefaultQueue, "later", later))
	score := func() float64 {
		s, err := e.client.ZScore(ctx, dueKey(e.prefix, waitroom.DefaultQueue, dueShard("later")), "later").Result()
		if isNil(err) {
			return 0
		}
		require.NoError(t, err)
		return s
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = room.Pump(ctx, &waitroom.PumpConfig{
				Handover: (&engine{}).handover,
				Queues:   []string{waitroom.DefaultQueue},
				Free:     func(context.Context, string) (int, error) { return 10, nil },
			})
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	// both pumps run (the sweep's lock is taken at a pump's first round)
	// and the store's watcher has read the version once
	eventually(t, 10*time.Second, func() bool {
		n, err := e.client.Exists(ctx, sweepKey(e.prefix)).Result()
		require.NoError(t, err)
		return n == 1 && e.store.version.Load() >= 0
	})
	require.Equal(t, float64(later.UnixMicro()), score(), "a pump's start re-marks nothing")

	e.policy(t, "acme", "rate=5/s")
	version, err := e.store.readVersion(ctx)
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool { return score() < float64(later.UnixMicro()) }) // re-marked
	n, err := e.client.Exists(ctx, markAllKey(e.prefix, waitroom.DefaultQueue, version)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "one pump took the change's re-mark")
}

// joinJobs puts n jobs in tenant's line of the default queue, with ids
// TENANT-0, TENANT-1, ...
func joinJobs(t *testing.T, room *room, tenant string, n int) {
	t.Helper()
	ws := make([]waitroom.Waiter, n)
	for i := range ws {
		ws[i] = waitroom.Waiter{ID: fmt.Sprintf("%s-%d", tenant, i)}
	}
	_, _, err := room.Join(context.Background(), tenant, 0, ws...)
	require.NoError(t, err)
}

// holdScript is a client hook that holds the first run of a script
// until released: calls made meanwhile queue in the limiter's batcher.
type holdScript struct {
	sha      string
	once     sync.Once
	entered  chan struct{}
	released chan struct{}
}

func (h *holdScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && cmd.Args()[1] == h.sha {
			h.once.Do(func() {
				close(h.entered)
				<-h.released
			})
		}
		return next(ctx, cmd)
	}
}

func (h *holdScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRoomParksShareARun: parks made while another is on its way go in
// one park.lua run, in which each job gets its own outcome: parked in its
// line in order, a task id taken, a line at its cap.
func TestRoomParksShareARun(t *testing.T) {
	t.Parallel()
	client := redistest.UniversalClient(t)
	if _, ok := client.(*redis.ClusterClient); ok {
		t.Skip("on a Cluster the room parks nothing in one call (TestRoomParkApart)")
	}
	hold := &holdScript{sha: lua.Park.Hash(), entered: make(chan struct{}), released: make(chan struct{})}
	counts := &scriptCounts{}
	client.AddHook(counts)
	client.AddHook(hold)
	e := setupOn(t, client, false, &Config{Pipelines: 1})
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=2")
	e.policy(t, "capped", "rate=10/s burst=2 backlog=1")
	room := e.lim.room()
	queue := "q-" + e.prefix
	park := func(tenant, id string) (waitroom.Parked, error) {
		return room.Park(ctx, waitroom.Parking{Tenant: tenant, Job: waitroom.Waiter{ID: id, Queue: queue},
			Fallback: time.Hour, MaxPark: 30 * 24 * time.Hour, Engine: e.client,
			Task: waitroom.EngineTask{TaskKey: "asynq:{" + queue + "}:t:" + id, ScheduleKey: "asynq:{" + queue + "}:scheduled",
				QueuesKey: e.prefix + ":asynq-queues", Queue: queue, ID: id, Msg: []byte("msg of " + id)}})
	}
	// the first park is held on its way
	first := make(chan error, 1)
	go func() {
		_, err := park("acme", "a0")
		first <- err
	}()
	<-hold.entered
	type outcome struct {
		p   waitroom.Parked
		err error
	}
	jobs := [][2]string{{"acme", "a1"}, {"acme", "a2"}, {"acme", "a0"}, {"capped", "c1"}, {"capped", "c2"}}
	out := make([]chan outcome, len(jobs))
	for i, j := range jobs {
		out[i] = make(chan outcome, 1)
		go func() {
			p, err := park(j[0], j[1])
			out[i] <- outcome{p, err}
		}()
	}
	waitFor(t, 5*time.Second, func() bool { return len(e.lim.batch.queue) == len(jobs) })
	close(hold.released)
	require.NoError(t, <-first)
	got := make([]outcome, len(jobs))
	for i := range jobs {
		got[i] = <-out[i]
	}
	require.Equal(t, 2, counts.take(lua.Park), "the held run, then one run for the parks queued behind it")

	for _, i := range []int{0, 1} {
		require.NoError(t, got[i].err)
		require.False(t, got[i].p.Conflict)
	}
	require.ElementsMatch(t, []int64{2, 3}, []int64{got[0].p.Waiting, got[1].p.Waiting}, "acme's line grew by each")
	require.NoError(t, got[2].err)
	require.True(t, got[2].p.Conflict, "a0's id is taken by the held park")
	// capped's line holds one: one of its two parks is refused
	var be *BacklogError
	parked, refused := 0, 0
	for _, o := range got[3:] {
		if o.err == nil {
			parked++
			require.Equal(t, int64(1), o.p.Waiting)
		} else {
			require.ErrorAs(t, o.err, &be)
			require.Equal(t, int64(1), be.Limit)
			refused++
		}
	}
	require.Equal(t, [2]int{1, 1}, [2]int{parked, refused})
	ids, err := room.WaitingIDs(ctx, "acme", 10)
	require.NoError(t, err)
	require.Len(t, ids, 3)
	require.Equal(t, "a0", ids[0].ID, "the held park first")
	require.ElementsMatch(t, []string{"a1", "a2"}, []string{ids[1].ID, ids[2].ID})
	for _, id := range []string{"a0", "a1", "a2"} {
		require.Equal(t, int64(1), e.client.Exists(ctx, "asynq:{"+queue+"}:t:"+id).Val(), id)
	}
	n, err := e.client.ZCard(ctx, "asynq:{"+queue+"}:scheduled").Result()
	require.NoError(t, err)
	require.Equal(t, int64(4), n, "a0, a1, a2 and capped's one in asynq's schedule")
}

// TestRoomPark: a job parked in one call is in its line as a joined job
// is (in order, its tenant due in the index), its task is in the engine's
// schedule at its fallback, and the line's cap, a task id taken, a cost no
// rule admits and an engine on another server write nothing.
func TestRoomPark(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	if e.lim.cluster {
		t.Skip("on a Cluster the room parks nothing in one call (TestRoomParkApart)")
	}
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=2 backlog=2")
	room := e.lim.room()
	queue := "q-" + e.prefix
	task := func(id string) waitroom.EngineTask {
		return waitroom.EngineTask{TaskKey: "asynq:{" + queue + "}:t:" + id, ScheduleKey: "asynq:{" + queue + "}:scheduled",
			QueuesKey: e.prefix + ":asynq-queues", Queue: queue, ID: id, Msg: []byte("msg of " + id)}
	}
	park := func(tenant, id string, cost int64) (waitroom.Parked, error) {
		return room.Park(ctx, waitroom.Parking{Tenant: tenant, Job: waitroom.Waiter{ID: id, Queue: queue, Cost: cost},
			Fallback: time.Hour, MaxPark: 30 * 24 * time.Hour, Task: task(id), Engine: e.client})
	}
	lines := func() []waitroom.Line {
		ls, err := room.Lines(ctx, queue)
		require.NoError(t, err)
		return ls
	}
	require.Empty(t, lines())

	p, err := park("acme", "j1", 1)
	require.NoError(t, err)
	require.False(t, p.Conflict)
	require.Equal(t, int64(1), p.Waiting)
	require.Equal(t, e.clock.Now().Add(time.Hour).UnixMicro(), p.At.UnixMicro(), "parked at its fallback")
	require.Equal(t, []waitroom.Line{{Tenant: "acme", Queue: queue, Waiting: 1, Oldest: time.UnixMilli(e.clock.Now().UnixMilli())}}, lines(),
		"its line began: the tenant is due")
	h, err := e.client.HGetAll(ctx, task("j1").TaskKey).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"msg": "msg of j1", "state": "scheduled"}, h)
	score, err := e.client.ZScore(ctx, task("j1").ScheduleKey, "j1").Result()
	require.NoError(t, err)
	require.Equal(t, float64(e.clock.Now().Add(time.Hour).Unix()), score)
	require.True(t, e.client.SIsMember(ctx, task("j1").QueuesKey, queue).Val())

	// the queue is registered by the process's first park into it only,
	// as asynq's client registers it by its first enqueue
	require.NoError(t, e.client.SRem(ctx, task("j1").QueuesKey, queue).Err())
	p, err = park("acme", "j2", 2)
	require.NoError(t, err)
	require.Equal(t, int64(2), p.Waiting)
	require.False(t, e.client.SIsMember(ctx, task("j1").QueuesKey, queue).Val(), "registered once per process")
	ids, err := room.WaitingIDs(ctx, "acme", 10)
	require.NoError(t, err)
	require.Equal(t, []waitroom.Waiter{{ID: "j1", Queue: queue, Cost: 1}, {ID: "j2", Queue: queue, Cost: 2}}, ids, "in its line as Join puts it")

	// nothing written: the line at its cap, a task id taken, a cost no
	// rule admits, an engine on another server
	_, err = park("acme", "j3", 1)
	var be *BacklogError
	require.ErrorAs(t, err, &be)
	require.Equal(t, int64(2), be.Limit)
	p, err = park("acme", "j1", 1)
	require.NoError(t, err)
	require.True(t, p.Conflict)
	e.policy(t, "costly", "rate=10/s burst=3")
	_, err = park("costly", "c1", 4)
	var ce *CostError
	require.ErrorAs(t, err, &ce)
	other := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer other.Close()
	_, err = room.Park(ctx, waitroom.Parking{Tenant: "acme", Job: waitroom.Waiter{ID: "j4", Queue: queue}, Fallback: time.Hour, Task: task("j4"), Engine: other})
	require.ErrorIs(t, err, waitroom.ErrApart)
	for _, id := range []string{"j3", "c1", "j4"} {
		n, err := e.client.Exists(ctx, task(id).TaskKey).Result()
		require.NoError(t, err)
		require.Zero(t, n, id)
	}
	ids, err = room.WaitingIDs(ctx, "acme", 10)
	require.NoError(t, err)
	require.Len(t, ids, 2)
	st, err := e.lim.Stats(ctx, "costly")
	require.NoError(t, err)
	require.Zero(t, st.Waiting)

	// a job that arrived (its intent recorded) is in its line with no
	// intent once parked
	_, err = room.Arrive(ctx, waitroom.Arrival{Tenant: "solo", ID: "s1", Queue: queue})
	require.NoError(t, err)
	intents := keysFor(e.prefix, "solo").intentsAt(priorityNormal)
	require.Equal(t, int64(1), e.client.ZCard(ctx, intents).Val(), "the arrival's intent")
	_, err = park("solo", "s1", 1)
	require.NoError(t, err)
	require.Zero(t, e.client.ZCard(ctx, intents).Val(), "taken back")

	// the pump promotes a parked job as a joined one
	d, err := room.promote(ctx, "acme", queue, 1, 1)
	require.NoError(t, err)
	require.Len(t, d.Promoted, 1)
	require.Equal(t, "j1", d.Promoted[0].ID)
}

// TestRoomParkApart: on a Cluster (or with the engine's keys on another
// client's server) Park writes nothing and says so.
func TestRoomParkApart(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s")
	engine := any(e.client)
	if !e.lim.cluster {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		defer c.Close()
		engine = c
	}
	_, err := e.lim.room().Park(ctx, waitroom.Parking{Tenant: "acme", Job: waitroom.Waiter{ID: "j1"}, Fallback: time.Hour,
		Task: waitroom.EngineTask{TaskKey: e.prefix + ":t", ScheduleKey: e.prefix + ":s", QueuesKey: e.prefix + ":q", Queue: "default", ID: "j1"}, Engine: engine})
	require.ErrorIs(t, err, waitroom.ErrApart)
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Waiting)
}

// TestRoomPumpStopsQuietly: the calls a pump's stop cuts short are not
// errors: a sweep whose call the stop cancelled tells OnError nothing.
func TestRoomPumpStopsQuietly(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	room := e.lim.room()
	joinJobs(t, room, "acme", 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var errs []error
	reparked := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = room.Pump(ctx, &waitroom.PumpConfig{
			Queues:   []string{waitroom.DefaultQueue},
			Free:     func(context.Context, string) (int, error) { return 0, nil },
			Handover: func(context.Context, []waitroom.Promoted) []waitroom.HandoverResult { return nil },
			// the stop comes while the sweep waits on a call
			Repark: func(ctx context.Context, _ string, _, _ time.Duration, _ func(string) bool) (int, error) {
				close(reparked)
				cancel()
				return 0, ctx.Err()
			},
			OnError: func(err error) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			},
		})
	}()
	select {
	case <-reparked:
	case <-time.After(10 * time.Second):
		t.Fatal("the pump never swept")
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pump did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, errs)
}

// TestRoomPumpHandsOverInItsRun: where the queue engine's keys share the
// room's server (PumpConfig.Engine), a round's turns hand their jobs over
// in their own script run: each parked task moves to the pending list
// with its decision as its ticket, no handing set holds it and the
// pump's Handover is not called; a job whose task is gone leaves its
// line charged nothing (its tenant holds no slot for it) and is counted
// gone. On a Cluster (the engine's keys are in other slots) the turns
// leave the hand-over to Handover, as before.
func TestRoomPumpHandsOverInItsRun(t *testing.T) {
	t.Parallel()
	e := setup(t, true, nil)
	ctx := context.Background()
	pumpCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.policy(t, "far", "rate=1000/s burst=100 concurrency=100")
	room := e.lim.room()
	// the engine's layout under a prefix of the test's own
	tag := fmt.Sprintf("inrun%d", time.Now().UnixNano())
	prefix := func(q string) string { return tag + ":{" + q + "}:" }
	const header = "x-decided"
	const n = 5
	joinJobs(t, room, "far", n)
	p := prefix(waitroom.DefaultQueue)
	for i := range n {
		if i == 2 {
			continue // its task is gone (deleted while it waited)
		}
		id := fmt.Sprintf("far-%d", i)
		require.NoError(t, e.client.HSet(ctx, p+"t:"+id, "state", "scheduled", "msg", "m").Err())
		require.NoError(t, e.client.ZAdd(ctx, p+"scheduled", redis.Z{Score: 1, Member: id}).Err())
	}
	f := &fleetRoom{free: 100}
	var mu sync.Mutex
	var handed, gone int
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = room.Pump(pumpCtx, &waitroom.PumpConfig{Handover: f.handover, Free: f.Free, Queues: []string{waitroom.DefaultQueue},
			Interval: 5 * time.Millisecond, Engine: &waitroom.EngineLayout{Prefix: prefix, Header: header},
			OnError: func(err error) { t.Log(err) },
			OnTurn: func(_ string, _ waitroom.Turn, h, g int) {
				mu.Lock()
				handed, gone = handed+h, gone+g
				mu.Unlock()
			}})
	}()
	waitFor(t, 5*time.Second, func() bool {
		w, _, err := room.Waiting(ctx, "far")
		require.NoError(t, err)
		return w == 0
	})
	if e.lim.cluster {
		waitFor(t, 5*time.Second, func() bool { return len(f.ids()) == n })
		cancel()
		<-done
		return
	}
	waitFor(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handed+gone == n
	})
	cancel()
	<-done
	require.Empty(t, f.ids(), "no job went through Handover")
	require.Equal(t, 4, handed)
	require.Equal(t, 1, gone)
	pending, err := e.client.LRange(ctx, p+"pending", 0, -1).Result()
	require.NoError(t, err)
	// in the line's order: asynq takes its pending list's jobs from the
	// right
	require.Equal(t, []string{"far-4", "far-3", "far-1", "far-0"}, pending)
	left, err := e.client.ZCard(ctx, p+"scheduled").Result()
	require.NoError(t, err)
	require.Zero(t, left, "the parked tasks left the schedule")
	for _, id := range pending {
		v, err := e.client.HMGet(ctx, p+"t:"+id, "state", "pending_since", "msg").Result()
		require.NoError(t, err)
		require.Equal(t, "pending", v[0])
		since, err := strconv.ParseInt(v[1].(string), 10, 64)
		require.NoError(t, err)
		require.InDelta(t, float64(time.Now().UnixNano()), float64(since), float64(time.Minute))
		// the task message gained a headers entry (protobuf field 15)
		// holding the decision
		msg := v[2].(string)
		require.True(t, strings.HasPrefix(msg, "m\x7a"), "a headers entry follows the message: %q", msg)
		i := strings.Index(msg, header)
		require.Positive(t, i, "the entry is keyed by the decision's header: %q", msg)
		tk, ok := parseTicket(msg[i+len(header)+2:])
		require.True(t, ok, "a ticket: %q", msg[i+len(header)+2:])
		require.NotZero(t, tk.claim, "it holds its concurrency slot")
		require.Positive(t, tk.leaseEnd)
		require.InDelta(t, float64(time.Now().UnixMicro()), float64(tk.slot), float64(time.Minute))
	}
	n0, err := e.client.ZCard(ctx, keysFor(e.lim.cfg.Prefix, "far").handing).Result()
	require.NoError(t, err)
	require.Zero(t, n0, "no handing entry")
	st, err := e.lim.Stats(ctx, "far")
	require.NoError(t, err)
	require.Equal(t, int64(4), st.Concurrency.InFlight, "the gone job holds no slot")
}

// TestRoomReleaseHandsOnInItsRun: a release's hand-on, in a room whose
// pump was given the queue engine's layout (PumpConfig.Engine), hands the
// job it promotes into the freed slot over in the same run: its task is
// in the pending list with its ticket when Release returns, and the
// Handover it is given only hears of it (Promoted.InRun), to count it.
func TestRoomReleaseHandsOnInItsRun(t *testing.T) {
	t.Parallel()
	if redistest.ClusterMode() {
		t.Skip("on a Cluster asynq's keys are in other slots: the hand-on goes through the Handover (TestRoomReleaseHandsOnInOneStep)")
	}
	e, g, p := releaseInRun(t, []string{"a1", "a2"}, "a2")
	ctx := context.Background()
	require.Len(t, g.handed, 1)
	require.Equal(t, "a2", g.handed[0].ID)
	require.True(t, g.handed[0].InRun, "handed over in the release's run")
	pending, err := e.client.LRange(ctx, p+"pending", 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"a2"}, pending)
	v, err := e.client.HMGet(ctx, p+"t:a2", "state", "msg").Result()
	require.NoError(t, err)
	require.Equal(t, "pending", v[0])
	require.Contains(t, v[1], "x-decided", "with its ticket")
	n, err := e.client.ZCard(ctx, keysFor(e.lim.cfg.Prefix, "acme").handing).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no handing entry")
}

// TestRoomReleaseCountsGoneInItsRun: a release whose hand-on finds the
// line's head gone from asynq (deleted while it waited) drops it in its
// run, charged nothing, hands the slot to the next job, and tells the
// hand-over of the dropped one (waitroom.Promoted.Gone), so that it is
// counted as a pump's turn counts its own.
func TestRoomReleaseCountsGoneInItsRun(t *testing.T) {
	t.Parallel()
	if redistest.ClusterMode() {
		t.Skip("on a Cluster asynq's keys are in other slots: the hand-on goes through the Handover, which finds the job gone itself")
	}
	// g2's task is gone; g3's is parked
	e, g, p := releaseInRun(t, []string{"g1", "g2", "g3"}, "g3")
	ctx := context.Background()
	require.Len(t, g.handed, 2)
	require.Equal(t, waitroom.Promoted{Tenant: "acme", Queue: waitroom.DefaultQueue, InRun: true, Gone: true}, g.handed[0], "the gone job, told to be counted")
	require.Equal(t, "g3", g.handed[1].ID)
	require.True(t, g.handed[1].InRun)
	pending, err := e.client.LRange(ctx, p+"pending", 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"g3"}, pending)
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Waiting, "g2 left the line")
	require.Equal(t, int64(1), st.Concurrency.InFlight, "g3's slot: g2 took none")
}

// releaseInRun lines jobs of a tenant acme at concurrency=1 in a room
// given a queue engine's layout (its keys under p), the first straight,
// parks the task of job parked in the engine's schedule, and releases the
// first job's slot with a stand-in Handover g.
func releaseInRun(t *testing.T, jobs []string, parked string) (e *env, g *engine, p string) {
	e = setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=1")
	room := e.lim.room()
	tag := fmt.Sprintf("inrun%d", time.Now().UnixNano())
	room.engine.Store(&waitroom.EngineLayout{Prefix: func(q string) string { return tag + ":{" + q + "}:" }, Header: "x-decided"})
	p = tag + ":{" + waitroom.DefaultQueue + "}:"
	require.Equal(t, jobs[:1], line(t, e, "acme", jobs...))
	require.NoError(t, e.client.HSet(ctx, p+"t:"+parked, "state", "scheduled", "msg", "m").Err())
	require.NoError(t, e.client.ZAdd(ctx, p+"scheduled", redis.Z{Score: 1, Member: parked}).Err())
	d, err := e.lim.Admit(ctx, "acme", jobs[0])
	require.NoError(t, err)
	require.True(t, d.Allowed)
	g = &engine{}
	require.NoError(t, room.Release(ctx, "acme", waitroom.DefaultQueue, jobs[0], d.Claim, waitroom.Scopes{}, g.handover, nil))
	return e, g, p
}
