package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/waitroom"
)

// TestKeys: a job's key below its tenant is decided by the key's own
// policy (acme/vip), else its tenant's keys' (acme/*), else every
// tenant's keys' (*/*), with the tenant's, all or nothing: the tenant's
// policy limits the sum of its keys, a job its key denies is charged
// nothing in its tenant and one its tenant denies nothing in its key. A
// key's concurrency slot is held, renewed and given back with the job's.
// It runs on the Cluster pass too, where a key lives in its tenant's slot
// (one step beside @global's).
func TestKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=10")
	e.policy(t, "acme/*", "rate=2/s burst=2")
	e.policy(t, "acme/vip", "rate=5/s burst=5")
	e.policy(t, "*/*", "concurrency=1")
	e.policy(t, GlobalPolicy, "rate=1000/s burst=1000")
	do := func(tenant, key, id string) Decision {
		t.Helper()
		d, err := e.lim.Do(ctx, Request{Tenant: tenant, Key: key, ID: id})
		require.NoError(t, err)
		return d
	}
	available := func(name string) int64 {
		t.Helper()
		st, err := e.lim.Stats(ctx, name)
		require.NoError(t, err)
		require.NotNil(t, st.Rates, name)
		return st.Rates[0].Available
	}

	// acme/* gives u1 two starts; its third is denied by the key, and
	// acme is not charged for it
	require.True(t, do("acme", "u1", "u1-1").Allowed)
	require.True(t, do("acme", "u1", "u1-2").Allowed)
	before := available("acme")
	d := do("acme", "u1", "u1-3")
	require.False(t, d.Allowed)
	require.Equal(t, "acme/*", d.Policy)
	require.Equal(t, "rate[0]", d.Rule)
	require.Equal(t, before, available("acme"))
	// vip has its own policy: five starts
	for i := range 5 {
		require.True(t, do("acme", "vip", "v"+string(rune('0'+i))).Allowed, i)
	}
	require.False(t, do("acme", "vip", "v5").Allowed)
	// acme limits the sum of its keys: 2 + 5 taken, 3 left for the others
	require.Equal(t, int64(3), available("acme"))
	require.True(t, do("acme", "u2", "u2-1").Allowed)
	require.True(t, do("acme", "u2", "u2-2").Allowed)
	require.True(t, do("acme", "u3", "u3-1").Allowed)
	// acme is spent: u3's second job is denied by acme, and u3 keeps the
	// start its key would have given
	d = do("acme", "u3", "u3-2")
	require.False(t, d.Allowed)
	require.Equal(t, "acme", d.Policy)
	require.Equal(t, int64(1), available("acme/u3"))
	// a job without a key is limited by acme alone
	d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: "nokey"})
	require.NoError(t, err)
	require.False(t, d.Allowed)
	e.clock.Advance(time.Second)
	require.True(t, do("acme", "u1", "u1-3").Allowed)

	// */* applies to the keys of a tenant without a key policy: one job
	// per key at a time, held, renewed and given back with the job's
	d1 := do("beta", "k1", "k1-a")
	require.True(t, d1.Allowed)
	require.NotZero(t, d1.Claim)
	d = do("beta", "k1", "k1-b")
	require.False(t, d.Allowed)
	require.Equal(t, "*/*", d.Policy)
	require.Equal(t, "concurrency", d.Rule)
	require.True(t, do("beta", "k2", "k2-a").Allowed, "another key has its own slot")
	st, err := e.lim.Stats(ctx, "beta/k1")
	require.NoError(t, err)
	require.Equal(t, "*/*", st.Policy)
	require.Equal(t, int64(1), st.Concurrency.InFlight)
	e.clock.Advance(time.Second)
	require.NoError(t, e.lim.renewAll(ctx, []jobpath.Held{{Tenant: "beta", ID: "k1-a", Claim: d1.Claim, Key: "k1"}})[0])
	st, err = e.lim.Stats(ctx, "beta/k1")
	require.NoError(t, err)
	require.Equal(t, e.clock.Now().Add(LeaseDefault).UnixMicro(), st.Concurrency.Holders[0].LeaseEnd.UnixMicro(), "renewed with the job")
	require.NoError(t, e.lim.room().Release(ctx, "beta", "", "k1-a", d1.Claim, waitroom.Scopes{Key: "k1"}, nil, nil))
	require.True(t, do("beta", "k1", "k1-b").Allowed, "the key's slot was given back")

	// keys with state are listed (sluice stats, top); their keys read
	// back as theirs, a key with ':' and '/' in it too
	ts, err := e.lim.Tenants(ctx)
	require.NoError(t, err)
	require.Contains(t, ts, "acme/u1")
	require.Contains(t, ts, "acme/vip")
	require.Contains(t, ts, "beta/k1")
	require.Contains(t, ts, "acme")
	for _, k := range keysFor("sluice", "a c{m}e/org:1/repo}").admitKeys() {
		got, ok := scopeFromKey("sluice", k)
		require.True(t, ok, k)
		require.Equal(t, "a c{m}e/org:1/repo}", got)
	}
	require.Equal(t, hashTag("a c{m}e"), hashTag("a c{m}e/org:1/repo}"), "a key lives in its tenant's slot")
}

// TestKeyBadInput: a key or a key policy's name that cannot be used gets
// a clear error naming it and the fix, and nothing is written.
func TestKeyBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme/*", "rate=1/s burst=1")
	for _, c := range []struct {
		req  Request
		want string
	}{
		{Request{Tenant: "acme", Key: "*", ID: "j"}, `key "*" names every key`},
		{Request{Tenant: "acme", Key: "a\nb", ID: "j"}, "control character"},
		{Request{Key: "u1", ID: "j"}, `key "u1": a key is below a tenant; give the job's tenant too`},
		{Request{Tenant: "acme/u1", ID: "j"}, `give the tenant "acme" and the key "u1" apart`},
	} {
		_, err := e.lim.Do(ctx, c.req)
		require.ErrorContains(t, err, c.want, c.req)
		require.ErrorIs(t, err, ErrInvalidTenant, c.req)
	}
	ts, err := e.lim.Tenants(ctx)
	require.NoError(t, err)
	require.Empty(t, ts, "nothing was written")

	for name, want := range map[string]string{
		"acme/":       "the key is empty",
		"*/u1":        "so it takes */*",
		"@shadow:a/b": `holds "/"`,
		"ac me/*":     "",
		"*/*":         "",
		"acme/org/x":  "",
	} {
		err := validatePolicyName(name)
		if want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorContains(t, err, want, name)
	}
}

// TestRoomKeys: keyed jobs wait in their tenant's line (fair share is the
// tenant's) and a turn decides each in its key's scope too. A job its key
// holds back does not hold back the tenant's other keys: it goes to the
// end of its line with the jobs of its key behind it, in order, and the
// line is due when a key allows again. A release gives the key's slot
// back and hands the tenant's on to the head.
func TestRoomKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=10")
	e.policy(t, "acme/*", "concurrency=1")
	e.policy(t, "acme/slow", "rate=1/s burst=1")
	room := e.lim.room()
	wait := func(id, key string) {
		t.Helper()
		a, err := room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: id, Key: key})
		require.NoError(t, err)
		require.False(t, a.Straight, id)
		joined, _, err := room.JoinArrived(ctx, "acme", a.Backlog, waitroom.Waiter{ID: id, Key: key})
		require.NoError(t, err)
		require.Equal(t, 1, joined, id)
	}
	for _, j := range [][2]string{{"a1", "a"}, {"a2", "a"}, {"s1", "slow"}, {"s2", "slow"}, {"b1", "b"}, {"a3", "a"}, {"b2", "b"}, {"n1", ""}} {
		wait(j[0], j[1])
	}
	ws, err := room.WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	require.Equal(t, "a", ws[0].Key)
	require.Empty(t, ws[7].Key)

	ids := func(t waitroom.Turn) []string {
		var out []string
		for _, p := range t.Promoted {
			out = append(out, p.ID)
		}
		return out
	}
	// one turn: the first job of each key starts (a's and b's one slot,
	// slow's one start), the job without a key too; the others wait
	tn, err := room.promote(ctx, "acme", "", 100, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "s1", "b1", "n1"}, ids(tn))
	a1 := tn.Promoted[0]
	require.Equal(t, int64(4), tn.Waiting)
	require.False(t, tn.Due.IsZero(), "the line is due when a key allows")
	require.LessOrEqual(t, tn.Due.Sub(e.clock.Now()), time.Second, "slow's next start, at the latest")
	ws, err = room.WaitingIDs(ctx, "acme", 0)
	require.NoError(t, err)
	var order []string
	for _, w := range ws {
		order = append(order, w.ID)
	}
	require.Equal(t, []string{"a2", "s2", "a3", "b2"}, order, "each key's jobs keep their order")
	st, err := e.lim.Stats(ctx, "acme/a")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight)
	st, err = e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(4), st.Concurrency.InFlight, "acme counts every key's jobs")

	// a turn now promotes nothing: every job left waits for its key
	tn, err = room.promote(ctx, "acme", "", 100, 100)
	require.NoError(t, err)
	require.Empty(t, tn.Promoted)
	// as a pump would leave it: due when slow's next start is, say later
	require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, waitroom.DefaultQueue, dueShard("acme")), redis.Z{Score: float64(e.clock.Now().Add(time.Minute).UnixMicro()), Member: "acme"}).Err())
	due, _, ok, err := room.next(ctx, waitroom.DefaultQueue)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, due.After(e.clock.Now()))
	// a job of another key joins: the tenant is due at once (not when a
	// key allows one of the others), and its turn starts the newcomer
	wait("c1", "c")
	due, _, ok, err = room.next(ctx, waitroom.DefaultQueue)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, due.After(e.clock.Now()), "due now, not in a minute")
	tn, err = room.promote(ctx, "acme", "", 100, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"c1"}, ids(tn))

	// a1 ends: its key's slot goes back and acme's is handed to the head
	// of the line whose key allows it (a2)
	g := &engine{}
	require.NoError(t, room.Release(ctx, "acme", waitroom.DefaultQueue, "a1", a1.Claim, waitroom.Scopes{Key: "a"}, g.handover, nil))
	require.Len(t, g.handed, 1)
	require.Equal(t, "a2", g.handed[0].ID)
	st, err = e.lim.Stats(ctx, "acme/a")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight, "a2 holds a's slot now")

	// a second later slow may start again
	e.clock.Advance(time.Second)
	tn, err = room.promote(ctx, "acme", "", 100, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"s2"}, ids(tn))
}

// TestExplainKeys: a waiting job with a key is explained with its key's
// holds too, counting the jobs of its key ahead of it, not the others.
func TestExplainKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "concurrency=10")
	e.policy(t, "acme/*", "rate=1/s burst=1")
	e.policy(t, "acme/pool", "concurrency=1")
	room := e.lim.room()
	for _, j := range [][2]string{{"a1", "a"}, {"b1", "b"}, {"a2", "a"}, {"a3", "a"}, {"p1", "pool"}, {"p2", "pool"}} {
		a, err := room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: j[0], Key: j[1]})
		require.NoError(t, err)
		_, _, err = room.JoinArrived(ctx, "acme", a.Backlog, waitroom.Waiter{ID: j[0], Key: j[1]})
		require.NoError(t, err)
	}
	// take a's start of this second, and pool's one slot
	d, err := e.lim.Do(ctx, Request{Tenant: "acme", Key: "a", ID: "earlier"})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = e.lim.Do(ctx, Request{Tenant: "acme", Key: "pool", ID: "running"})
	require.NoError(t, err)
	require.True(t, d.Allowed)

	x, err := e.lim.Explain(ctx, "acme", "", "a3")
	require.NoError(t, err)
	require.Equal(t, "a", x.Key)
	require.Equal(t, int64(3), x.Ahead, "a1, b1 and a2 wait ahead of it")
	require.Equal(t, "a rate[0]", x.HeldBy)
	require.Equal(t, 3*time.Second, x.Expected.Sub(x.Now), "a1 and a2 of its key first, one a second, after the one started")
	require.Contains(t, x.String(), `job a3 of tenant "acme" (key a)`)
	x, err = e.lim.Explain(ctx, "acme", "", "b1")
	require.NoError(t, err)
	require.Equal(t, "turn", x.HeldBy, "b's rate is its own")
	xs, err := e.lim.ExplainLine(ctx, "acme", "", 0)
	require.NoError(t, err)
	require.Len(t, xs, 6)
	require.Equal(t, "a rate[0]", xs[3].HeldBy)
	require.Equal(t, 3*time.Second, xs[3].Expected.Sub(xs[3].Now))
	require.Equal(t, "pool concurrency", xs[4].HeldBy)
	require.Contains(t, xs[4].String(), "held by its key's concurrency: running jobs of key pool must end first")
}

// TestKeyTickets: a keyed job the room sends straight to the engine
// carries a ticket decided in its key's scope too; it holds at the gate
// under the same policies, and is decided anew once the key's policy
// changed.
func TestKeyTickets(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=100/s burst=10")
	e.policy(t, "acme/*", "rate=10/s burst=20 concurrency=2")
	room := e.lim.room()
	arrive := func(id string) waitroom.Arrived {
		t.Helper()
		a, err := room.Arrive(ctx, waitroom.Arrival{Tenant: "acme", ID: id, Key: "u1", MayGo: true})
		require.NoError(t, err)
		require.True(t, a.Straight, id)
		require.NotEmpty(t, a.Ticket, id)
		return a
	}
	a1 := arrive("j1")
	st, err := e.lim.Stats(ctx, "acme/u1")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Concurrency.InFlight, "the arrival took the key's slot")
	d, ok, err := e.lim.redeem(ctx, Request{Tenant: "acme", Key: "u1", ID: "j1"}, a1.Ticket)
	require.NoError(t, err)
	require.True(t, ok, "the ticket holds under the same policies")
	require.Equal(t, a1.Claim, d.Claim)

	a2 := arrive("j2")
	e.policy(t, "acme/*", "rate=10/s burst=20 concurrency=3")
	require.Eventually(t, func() bool {
		_, ok, err := e.lim.redeem(ctx, Request{Tenant: "acme", Key: "u1", ID: "j2"}, a2.Ticket)
		return err == nil && !ok
	}, 5*time.Second, 10*time.Millisecond, "the key's policy changed: decided anew")
}
