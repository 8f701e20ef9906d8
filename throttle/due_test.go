package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
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

// TestDueShardsSpread: shard i's hash tag lies in the i-th twelfth of the
// slot space, so that a Cluster whose masters hold even runs of slots (1,
// 2, 3, 4 or 6 of them) holds as many shards on each; and tenants spread
// over the shards.
func TestDueShardsSpread(t *testing.T) {
	t.Parallel()
	const width = redistest.ClusterSlots / dueShards
	seen := map[uint16]bool{}
	for i := range dueShards {
		slot := keySlot(dueKey("sluice", "default", i))
		require.GreaterOrEqual(t, int(slot), i*width, "shard %d", i)
		require.Less(t, int(slot), (i+1)*width, "shard %d", i)
		require.False(t, seen[slot])
		seen[slot] = true
	}
	require.NotEqual(t, keySlot(unshardedDueKey("sluice", "default")), keySlot(dueKey("sluice", "default", 0)))
	var per [dueShards]int
	for i := range 12000 {
		per[dueShard(fmt.Sprintf("tenant-%d", i))]++
	}
	for i, n := range per {
		require.InDelta(t, 1000, n, 150, "shard %d of %v", i, per)
	}
	require.Equal(t, dueShard("acme"), dueShard("acme"))
}

// TestRoomTurnAcrossShards: a tenant alone in its shard is not first when
// a tenant of another shard is due before it; the view of the other
// shards is read again once it is older than turnFresh.
func TestRoomTurnAcrossShards(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	a, b := "a", "b"
	for dueShard(b) == dueShard(a) {
		b += "b"
	}
	require.NoError(t, room.mark(ctx, q, a))
	first, others, err := room.turnOf(ctx, q, a)
	require.NoError(t, err)
	require.True(t, first)
	require.False(t, others)

	// b, due a minute before a, in another shard: a's turn waits for it
	require.NoError(t, room.markAt(ctx, q, b, e.clock.Now().Add(-time.Minute)))
	e.clock.Advance(time.Millisecond)
	room.alone = nil
	first, others, err = room.turnOf(ctx, q, a)
	require.NoError(t, err)
	require.False(t, first, "b of shard %d is due before a of shard %d", dueShard(b), dueShard(a))
	require.True(t, others)

	// a pump takes b (the view learns it); a's turn is first again
	taken, err := room.take(ctx, q, 1, waitroom.HoldDefault)
	require.NoError(t, err)
	require.Len(t, taken, 1)
	require.Equal(t, b, taken[0].tenant, "the earliest due across shards first")
	first, others, err = room.turnOf(ctx, q, a)
	require.NoError(t, err)
	require.True(t, first)
	require.False(t, others)
	require.NoError(t, room.settle(ctx, q, taken, map[string]time.Time{b: dueNow}))

	// a change the view does not hear of (no wake) is read once the view
	// is older than turnFresh
	require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, q, dueShard(b)), redis.Z{Score: float64(e.clock.Now().Add(-time.Hour).UnixMicro()), Member: b}).Err())
	time.Sleep(turnFresh + 50*time.Millisecond)
	room.alone = nil
	first, _, err = room.turnOf(ctx, q, a)
	require.NoError(t, err)
	require.False(t, first)
}

// TestRoomTurnInACrowd: where many tenants are due (a release nearly never
// finds its tenant first), after crowdSpan turns asked a release of the
// queue answers "another tenant first" without asking, save one in
// crowdAsk; a turn that finds no other tenant due ends the crowd at once,
// and a crowd without new answers ends after crowdFor.
func TestRoomTurnInACrowd(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	var crowd []string
	for i := range 40 {
		crowd = append(crowd, fmt.Sprintf("c%02d", i))
	}
	require.NoError(t, room.markAt(ctx, q, "early", e.clock.Now().Add(-time.Minute)))
	require.NoError(t, room.mark(ctx, q, crowd...))
	e.clock.Advance(time.Millisecond)
	asks := func(n int) (asked int) {
		for i := range n {
			before := room.crowdAsked(q)
			first, others, err := room.turnOf(ctx, q, crowd[i%len(crowd)])
			require.NoError(t, err)
			require.False(t, first, "early is due first")
			require.True(t, others)
			if room.crowdAsked(q) != before {
				asked++
			}
		}
		return asked
	}
	require.Equal(t, crowdSpan, asks(crowdSpan), "every turn is asked until the room is known crowded")
	require.Equal(t, 2, asks(2*crowdAsk), "a crowded room's releases ask one in %d", crowdAsk)

	// the crowd leaves: a turn asked finds nobody else due, and the next
	// ones are asked
	for _, c := range append(crowd, "early") {
		require.NoError(t, e.client.ZRem(ctx, dueKey(e.prefix, q, dueShard(c)), c).Err())
	}
	for s := range dueShards {
		room.l.due.forget(q, s) // read again: as pumps that took them would tell
	}
	require.NoError(t, room.mark(ctx, q, "alone"))
	e.clock.Advance(time.Millisecond)
	for range crowdAsk {
		first, others, err := room.turnOf(ctx, q, "alone")
		require.NoError(t, err)
		if first && !others {
			break
		}
	}
	room.alone = nil
	first, others, err := room.turnOf(ctx, q, "alone")
	require.NoError(t, err)
	require.True(t, first, "asked again once a turn found nobody else due")
	require.False(t, others)

	// a crowd lasts crowdFor without new answers
	room.crowds[q].until = time.Now().Add(-time.Millisecond)
	require.False(t, room.crowded(q))
}

// TestRoomReleaseAndMark: a release in a crowded room gives the job's slot
// back and makes its tenant due now, or keeps the earlier time it had
// (on one server in one release.lua run, on a Cluster with room.lua's
// mark beside it); the pumps are woken only when the tenant became due
// sooner, and a claim that holds no slot is reported lost, the tenant
// marked all the same.
func TestRoomReleaseAndMark(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	e.policy(t, "busy", "concurrency=5")
	wake := e.client.Subscribe(ctx, wakeChannel(e.prefix))
	defer wake.Close()
	_, err := wake.Receive(ctx)
	require.NoError(t, err)
	due := func(tenant string) (float64, bool) {
		v, err := e.client.ZScore(ctx, dueKey(e.prefix, q, dueShard(tenant)), tenant).Result()
		if errors.Is(err, redis.Nil) {
			return 0, false
		}
		require.NoError(t, err)
		return v, true
	}
	admit := func(id string) uint64 {
		d, err := e.lim.Do(ctx, Request{Tenant: "busy", ID: id})
		require.NoError(t, err)
		require.True(t, d.Allowed)
		return d.Claim
	}

	c1 := admit("j1")
	lost, err := room.releaseAndMark(ctx, "busy", q, "j1", c1)
	require.NoError(t, err)
	require.False(t, lost)
	st, err := e.lim.Stats(ctx, "busy")
	require.NoError(t, err)
	require.Zero(t, st.Concurrency.InFlight, "the slot went back")
	at, ok := due("busy")
	require.True(t, ok, "the tenant is due")
	require.Equal(t, float64(e.clock.Now().UnixMicro()), at, "due now")
	msg, err := wake.ReceiveMessage(ctx)
	require.NoError(t, err)
	require.Equal(t, q+lineSep+strconv.Itoa(dueShard("busy"))+"\x1f"+strconv.FormatInt(e.clock.Now().UnixMicro(), 10), msg.Payload, "the pumps wake: it became due")

	// due earlier already: it keeps that time, and nobody is woken
	e.clock.Advance(time.Second)
	c2 := admit("j2")
	lost, err = room.releaseAndMark(ctx, "busy", q, "j2", c2)
	require.NoError(t, err)
	require.False(t, lost)
	again, _ := due("busy")
	require.Equal(t, at, again, "an earlier due time is kept")
	// (the next wake is another tenant's: none came for busy between)
	require.NoError(t, room.mark(ctx, q, "other"))
	msg, err = wake.ReceiveMessage(ctx)
	require.NoError(t, err)
	require.Equal(t, q+lineSep+strconv.Itoa(dueShard("other"))+"\x1f"+strconv.FormatInt(e.clock.Now().UnixMicro(), 10), msg.Payload, "no wake for a tenant due no sooner")

	// a claim that holds nothing: lost, and the tenant still due
	require.NoError(t, e.client.ZRem(ctx, dueKey(e.prefix, q, dueShard("busy")), "busy").Err())
	lost, err = room.releaseAndMark(ctx, "busy", q, "j2", c2)
	require.NoError(t, err)
	require.True(t, lost, "the slot was given back already")
	_, ok = due("busy")
	require.True(t, ok)
}

// TestRoomDrainsTheUnshardedIndex: the tenants an older sluice left in the
// one-key due index move into their shards, each at its due time, when a
// pump sweeps.
func TestRoomDrainsTheUnshardedIndex(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	old := unshardedDueKey(e.prefix, q)
	now := e.clock.Now()
	var zs []redis.Z
	for i := range 2500 {
		zs = append(zs, redis.Z{Score: float64(now.Add(time.Duration(i+1) * time.Second).UnixMicro()), Member: fmt.Sprint("t", i)})
	}
	require.NoError(t, e.client.ZAdd(ctx, old, zs...).Err())
	// a tenant due sooner in its shard keeps the sooner time
	require.NoError(t, room.mark(ctx, q, "t7"))
	require.NoError(t, room.sweep(ctx, []string{q}, nil, nil))
	n, err := e.client.Exists(ctx, old).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the unsharded index is drained")
	for _, z := range zs {
		tenant := z.Member.(string)
		got, err := e.client.ZScore(ctx, dueKey(e.prefix, q, dueShard(tenant)), tenant).Result()
		require.NoError(t, err, tenant)
		if tenant == "t7" {
			require.Equal(t, float64(now.UnixMicro()), got)
			continue
		}
		require.Equal(t, z.Score, got, tenant)
	}
	lines, err := room.linesIndexed(ctx, q, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"t7", "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t8", "t9"}, lines, "earliest due first across shards")
}

// TestRoomTakesEarliestAcrossShards: a round's take gives the n tenants
// due earliest across every shard, earliest first, holds them, and leaves
// the others where they were; the view learns each shard's earliest due
// time once they are held.
func TestRoomTakesEarliestAcrossShards(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	now := e.clock.Now()
	due := map[string]time.Time{}
	for i := range 40 {
		tenant := fmt.Sprint("t", i)
		// due at now - 40 ms ... now - 1 ms, every shard holding some
		at := now.Add(-time.Duration(40-i) * time.Millisecond)
		due[tenant] = at
		require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, q, dueShard(tenant)), redis.Z{Score: float64(at.UnixMicro()), Member: tenant}).Err())
	}
	shards := map[int]bool{}
	for tenant := range due {
		shards[dueShard(tenant)] = true
	}
	require.Greater(t, len(shards), 6, "the tenants spread over the shards")

	taken, err := room.take(ctx, q, 5, time.Minute)
	require.NoError(t, err)
	var got []string
	for _, d := range taken {
		got = append(got, d.tenant)
		require.Equal(t, due[d.tenant].UnixMicro(), d.due, d.tenant)
		require.Equal(t, dueShard(d.tenant), d.shard, d.tenant)
	}
	require.Equal(t, []string{"t0", "t1", "t2", "t3", "t4"}, got, "the earliest due, earliest first")
	for tenant, at := range due {
		score, err := e.client.ZScore(ctx, dueKey(e.prefix, q, dueShard(tenant)), tenant).Result()
		require.NoError(t, err)
		if slices.Contains(got, tenant) {
			require.Greater(t, score, float64(now.UnixMicro()), "%s is held", tenant)
		} else {
			require.Equal(t, float64(at.UnixMicro()), score, "%s keeps its place", tenant)
		}
	}
	// the view knows each shard's earliest due time now
	view := e.lim.due.get(q)
	for s := range dueShards {
		require.True(t, view[s].known, "shard %d", s)
		require.Equal(t, firstDue(t, e, q, s), view[s].head, "shard %d's earliest", s)
	}
	next, _, ok, err := room.next(ctx, q)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, due["t5"].UnixMicro(), next.UnixMicro(), "t5 is the earliest not held")

	// tenants due at the same time are taken in the shards' order, and in
	// a shard in its own order (by name)
	tied := now.Add(-time.Hour)
	byShard := map[int][]string{}
	for i := range 24 {
		tenant := fmt.Sprint("tie", i)
		byShard[dueShard(tenant)] = append(byShard[dueShard(tenant)], tenant)
		require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, q, dueShard(tenant)), redis.Z{Score: float64(tied.UnixMicro()), Member: tenant}).Err())
	}
	var want []string
	for s := range dueShards {
		names := byShard[s]
		slices.Sort(names)
		want = append(want, names...)
	}
	taken, err = room.take(ctx, q, 10, time.Minute)
	require.NoError(t, err)
	got = got[:0]
	for _, d := range taken {
		got = append(got, d.tenant)
	}
	require.Equal(t, want[:10], got)
	view = e.lim.due.get(q)
	for s := range dueShards {
		require.Equal(t, firstDue(t, e, q, s), view[s].head, "shard %d's earliest", s)
	}
}

// firstDue is the earliest due time in shard of queue's index (-1: empty).
func firstDue(t *testing.T, e *env, queue string, shard int) int64 {
	z, err := e.client.ZRangeWithScores(context.Background(), dueKey(e.prefix, queue, shard), 0, 0).Result()
	require.NoError(t, err)
	if len(z) == 0 {
		return -1
	}
	return int64(z[0].Score)
}

// TestRoomSettlesEveryShardInOneCall: the tenants a round took, spread
// over several shards, get their due times (now in the order given, a
// later time, out of the index) in one call on one server (one per shard
// on a Cluster); a tenant marked meanwhile keeps the mark's time, and the
// view learns each shard's earliest due time.
func TestRoomSettlesEveryShardInOneCall(t *testing.T) {
	t.Parallel()
	e, counts := setupCounted(t, false, nil)
	ctx := context.Background()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	now := e.clock.Now()
	var tenants []string
	for i := range 12 {
		tenant := fmt.Sprint("s", i)
		tenants = append(tenants, tenant)
		require.NoError(t, e.client.ZAdd(ctx, dueKey(e.prefix, q, dueShard(tenant)), redis.Z{Score: float64(now.Add(-time.Second).UnixMicro()), Member: tenant}).Err())
	}
	shards := map[int]bool{}
	for _, tenant := range tenants {
		shards[dueShard(tenant)] = true
	}
	require.Greater(t, len(shards), 3, "the tenants spread over the shards")
	taken, err := room.take(ctx, q, len(tenants), time.Minute)
	require.NoError(t, err)
	require.Len(t, taken, len(tenants))
	// s0 is marked while held: it keeps the mark
	require.NoError(t, room.mark(ctx, q, "s0"))
	later := now.Add(time.Hour)
	due := map[string]time.Time{}
	for i, tenant := range tenants {
		switch i % 3 {
		case 0:
			due[tenant] = dueNow
		case 1:
			due[tenant] = later
		default:
			due[tenant] = time.Time{} // its line is empty
		}
	}
	counts.take(lua.Room)
	require.NoError(t, room.settle(ctx, q, taken, due))
	if !e.lim.cluster {
		require.Equal(t, 1, counts.take(lua.Room), "one call for every shard")
	}
	for i, tenant := range tenants {
		score, err := e.client.ZScore(ctx, dueKey(e.prefix, q, dueShard(tenant)), tenant).Result()
		switch {
		case tenant == "s0":
			require.NoError(t, err)
			require.Equal(t, float64(now.UnixMicro()), score, "the mark made while it was held stands")
		case i%3 == 0:
			require.NoError(t, err)
			require.InDelta(t, float64(now.UnixMicro()), score, 12, "%s is due now (the k-th of its shard k µs later)", tenant)
		case i%3 == 1:
			require.NoError(t, err)
			require.Equal(t, float64(later.UnixMicro()), score, "%s is due later", tenant)
		default:
			require.ErrorIs(t, err, redis.Nil, "%s left the index", tenant)
		}
	}
	if !e.lim.cluster {
		// due now in the order given (the round's), whatever their shards:
		// a pump takes the earliest first
		var nowScores []float64
		for _, d := range taken {
			if due[d.tenant].Equal(dueNow) && d.tenant != "s0" {
				score, err := e.client.ZScore(ctx, dueKey(e.prefix, q, d.shard), d.tenant).Result()
				require.NoError(t, err)
				nowScores = append(nowScores, score)
			}
		}
		require.Len(t, nowScores, 3)
		for i := 1; i < len(nowScores); i++ {
			require.Less(t, nowScores[i-1], nowScores[i], "the tenants due now keep their order across the shards: %v", nowScores)
		}
	}
	view := e.lim.due.get(q)
	for s := range shards {
		require.True(t, view[s].known, "shard %d", s)
		var head int64 = -1
		for _, tenant := range tenants {
			if dueShard(tenant) != s {
				continue
			}
			score, err := e.client.ZScore(ctx, dueKey(e.prefix, q, s), tenant).Result()
			if err == nil && (head < 0 || int64(score) < head) {
				head = int64(score)
			}
		}
		require.Equal(t, head, view[s].head, "shard %d's earliest due time", s)
	}
}

// TestClusterRoomSpread: on a three-master Cluster the due index of a
// hundred tenants with lines lands on every master, and a room workload
// (lines joined, pumps serving them, releases asking for turns, a policy
// change) spreads its index commands over the three: before the shards,
// one master, {r}'s, took every one of them.
func TestClusterRoomSpread(t *testing.T) {
	t.Parallel()
	c := redistest.NewCluster(t, nil)
	e := setupOn(t, c.Client(t), true, nil)
	cc := e.client.(*redis.ClusterClient)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	room := e.lim.room()
	q := waitroom.DefaultQueue
	var tenants []string
	for i := range 100 {
		tenants = append(tenants, fmt.Sprintf("tenant-%03d", i))
	}
	masters := map[string]redis.ClusterSlot{} // address -> its slots
	slots, err := cc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	for _, s := range slots {
		masters[s.Nodes[0].Addr] = s
	}
	require.Len(t, masters, 3)
	for i := range dueShards {
		slot := cc.ClusterKeySlot(ctx, dueKey(e.prefix, q, i)).Val()
		require.Equal(t, int64(keySlot(dueKey(e.prefix, q, i))), slot)
	}

	for _, tenant := range tenants {
		joinJobs(t, room, tenant, 5)
	}
	// the due entries, per master
	var mu sync.Mutex
	entries := map[string]int64{}
	require.NoError(t, redistest.ForEachMaster(ctx, cc, func(ctx context.Context, node redis.Cmdable) error {
		addr := node.(*redis.Client).Options().Addr
		for i := range dueShards {
			key := dueKey(e.prefix, q, i)
			if n, err := node.ZCard(ctx, key).Result(); err == nil {
				mu.Lock()
				entries[addr] += n
				mu.Unlock()
			} else if !strings.HasPrefix(err.Error(), "MOVED") {
				return err
			}
		}
		return nil
	}))
	t.Logf("due entries of %d tenants per master (slots): %s", len(tenants), perMaster(masters, entries))
	require.Len(t, entries, 3)
	var sum int64
	for addr, n := range entries {
		require.GreaterOrEqual(t, n, int64(15), "master %s", addr)
		sum += n
	}
	require.Equal(t, int64(len(tenants)), sum)

	// the index alone: every tenant marked, asking for its turn (as a
	// release does) and requeued, taken and settled by a pump, re-marked
	// for a policy change
	require.NoError(t, redistest.ForEachMaster(ctx, cc, func(ctx context.Context, node redis.Cmdable) error {
		return node.ConfigResetStat(ctx).Err()
	}))
	for _, tenant := range tenants {
		require.NoError(t, room.mark(ctx, q, tenant))
		_, _, err := room.turnOf(ctx, q, tenant)
		require.NoError(t, err)
		require.NoError(t, room.requeue(ctx, q, tenant))
	}
	taken, err := room.take(ctx, q, len(tenants), waitroom.HoldDefault)
	require.NoError(t, err)
	require.Len(t, taken, len(tenants))
	due := map[string]time.Time{}
	for _, d := range taken {
		due[d.tenant] = dueNow
	}
	require.NoError(t, room.settle(ctx, q, taken, due))
	require.NoError(t, room.markAll(ctx, q))
	index := masterCommands(t, cc, "cmdstat_evalsha", "cmdstat_eval")
	t.Logf("due index script calls per master (slots): %s", perMaster(masters, index))

	// the whole room: two pumps serve the lines 10 jobs at a time
	require.NoError(t, redistest.ForEachMaster(ctx, cc, func(ctx context.Context, node redis.Cmdable) error {
		return node.ConfigResetStat(ctx).Err()
	}))
	g := &engine{}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = room.Pump(ctx, &waitroom.PumpConfig{
				Handover: g.handover,
				Queues:   []string{q},
				Free:     func(context.Context, string) (int, error) { return 10, nil },
				Interval: 5 * time.Millisecond,
			})
		}()
	}
	waitFor(t, 20*time.Second, func() bool { return len(g.ids()) == 5*len(tenants) })
	cancel()
	wg.Wait()
	all := masterCommands(t, cc)
	t.Logf("commands per master for two pumps serving the lines (slots): %s", perMaster(masters, all))
	for name, n := range map[string]map[string]int64{"due index script calls": index, "commands": all} {
		var total int64
		for _, v := range n {
			total += v
		}
		require.Len(t, n, 3)
		for addr, v := range n {
			require.Greater(t, float64(v)/float64(total), 0.2, "master %s has %d of %d %s", addr, v, total, name)
		}
	}
}

// masterCommands counts the calls of the given commands (every command when
// none is given) in INFO commandstats, per master.
func masterCommands(t *testing.T, cc *redis.ClusterClient, names ...string) map[string]int64 {
	t.Helper()
	var mu sync.Mutex
	out := map[string]int64{}
	require.NoError(t, cc.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" || name == "cmdstat_config|resetstat" {
				continue
			}
			if len(names) > 0 && !slices.Contains(names, name) {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			v, _ := strconv.ParseInt(calls, 10, 64)
			n += v
		}
		mu.Lock()
		defer mu.Unlock()
		out[node.Options().Addr] = n
		return nil
	}))
	return out
}

// perMaster prints counts per master, with its slots and share.
func perMaster(masters map[string]redis.ClusterSlot, n map[string]int64) string {
	var total int64
	for _, v := range n {
		total += v
	}
	addrs := make([]string, 0, len(masters))
	for a := range masters {
		addrs = append(addrs, a)
	}
	sort.Slice(addrs, func(i, j int) bool { return masters[addrs[i]].Start < masters[addrs[j]].Start })
	var parts []string
	for _, a := range addrs {
		parts = append(parts, fmt.Sprintf("%d-%d: %d (%.0f%%)", masters[a].Start, masters[a].End, n[a], 100*float64(n[a])/float64(max(total, 1))))
	}
	return strings.Join(parts, ", ")
}
