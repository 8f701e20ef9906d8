package throttle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/lua"
)

// The due index (lua/room.lua): when each tenant's line of a queue is next
// due. It is split in dueShards shards by tenant (keys.go), so that no key
// and no Cluster slot is touched by every job of every tenant. An op on
// one tenant goes to its shard, one call as before; the pump takes from the
// shards that may hold due tenants and serves what they gave earliest due
// first; a release asks its tenant's shard whose turn it is and compares
// the earliest due times of the others, which each process keeps in a view
// (dueView) that the replies and the wake channel keep up to date.

// dueTenant is a tenant of a due index with its due time (µs): what take
// found, or what settle is to set (0: now, -1: out of the index); its
// shard, and the score take held it at (settle compares it).
type dueTenant struct {
	tenant string
	due    int64
	shard  int
	held   int64
}

// dueView is what a process knows of the earliest due time of each shard
// of a queue's index: read with the shard's last call, or told by a wake
// (lower). Safe for concurrent use; the zero value is empty.
type dueView struct {
	mu     sync.Mutex
	queues map[string]*[dueShards]shardHead
}

type shardHead struct {
	known bool
	head  int64     // the shard's earliest due time, µs (-1: empty)
	read  time.Time // when it was read (local clock; zero: never, only told)
}

func (v *dueView) get(queue string) [dueShards]shardHead {
	v.mu.Lock()
	defer v.mu.Unlock()
	if h := v.queues[queue]; h != nil {
		return *h
	}
	return [dueShards]shardHead{}
}

func (v *dueView) at(queue string) *[dueShards]shardHead {
	if v.queues == nil {
		v.queues = map[string]*[dueShards]shardHead{}
	}
	h := v.queues[queue]
	if h == nil {
		h = &[dueShards]shardHead{}
		v.queues[queue] = h
	}
	return h
}

// set records a shard's earliest due time, read just now.
func (v *dueView) set(queue string, shard int, head int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.at(queue)[shard] = shardHead{known: true, head: head, read: time.Now()}
}

// lower records that a tenant of the shard became due at due.
func (v *dueView) lower(queue string, shard int, due int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	h := &v.at(queue)[shard]
	if !h.known || h.head < 0 || due < h.head {
		h.known, h.head = true, due
	}
}

// forget makes a shard unknown (a call to it failed).
func (v *dueView) forget(queue string, shard int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.at(queue)[shard] = shardHead{}
}

// turnFresh is how old a view of the other shards a release trusts when
// it asks whose turn it is; older shards are read again (at most once per
// turnFresh and process while the fleet is saturated).
const turnFresh = 500 * time.Millisecond

// roomArgs are room.lua's arguments for op on shard of queue's index,
// then args.
func (r *room) roomArgs(op, queue string, shard int, args ...any) []any {
	return append([]any{r.l.clockArg(), op, wakeChannel(r.l.cfg.Prefix), queue + lineSep + strconv.Itoa(shard)}, args...)
}

// runRoom runs room.lua's op on shard of queue's index.
func (r *room) runRoom(ctx context.Context, queue string, shard int, op string, args ...any) (any, error) {
	return r.l.batch.run(ctx, lua.Room, []string{dueKey(r.l.cfg.Prefix, queue, shard)}, r.roomArgs(op, queue, shard, args...))
}

// eachShard calls fn for each shard at once (the calls share round trips,
// one per master on a Cluster) and joins their errors.
func eachShard(shards []int, fn func(i, shard int) error) error {
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, s := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i, s)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// allShards lists every shard.
func allShards() []int {
	s := make([]int, dueShards)
	for i := range s {
		s[i] = i
	}
	return s
}

// byShard groups tenants by shard, in the order given.
func byShard(tenants []string) map[int][]string {
	m := map[int][]string{}
	for _, t := range tenants {
		s := dueShard(t)
		m[s] = append(m[s], t)
	}
	return m
}

func keysOfMap[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// takeShards takes up to n due tenants of queue from each of shards,
// holding them for hold: all it took, earliest due first (a caller serves
// the first ones and settles the others back to their due times, where
// they keep their places). What was taken from the shards that answered is
// returned with the error of those that did not.
func (r *room) takeShards(ctx context.Context, queue string, shards []int, n int, hold time.Duration) ([]dueTenant, error) {
	if !r.l.cluster && len(shards) > 1 {
		return r.takeAll(ctx, queue, shards, n, hold)
	}
	got := make([][]dueTenant, len(shards))
	err := eachShard(shards, func(i, shard int) error {
		due, head, err := r.takeShard(ctx, queue, shard, n, hold)
		if err != nil {
			r.l.due.forget(queue, shard)
			return err
		}
		r.l.due.set(queue, shard, head)
		got[i] = due
		return nil
	})
	var all []dueTenant
	for _, g := range got {
		all = append(all, g...)
	}
	// earliest due first; ties by shard, then in a shard's own order
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].due != all[j].due {
			return all[i].due < all[j].due
		}
		return all[i].shard < all[j].shard
	})
	return all, err
}

// takeAll is takeShards on one server, in one call (room.lua's takeall,
// every shard in KEYS): the n tenants due earliest across shards, and no
// others, so that none is to be given back.
func (r *room) takeAll(ctx context.Context, queue string, shards []int, n int, hold time.Duration) ([]dueTenant, error) {
	keys := make([]string, len(shards))
	for i, s := range shards {
		keys[i] = dueKey(r.l.cfg.Prefix, queue, s)
	}
	res, err := r.l.batch.run(ctx, lua.Room, keys, r.roomArgs("takeall", queue, shards[0], n, micros(hold)))
	if err != nil {
		for _, s := range shards {
			r.l.due.forget(queue, s)
		}
		return nil, fmt.Errorf("take due tenants: %w", err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) < 3 || (len(arr)-3)%3 != 0 {
		return nil, fmt.Errorf("room.lua: unexpected reply %v", res)
	}
	hs, ok := arr[1].(string)
	heads, err := int64s(arr[2], len(shards))
	if !ok || err != nil {
		return nil, fmt.Errorf("room.lua: unexpected reply %v", res)
	}
	held, err := strconv.ParseInt(hs, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("room.lua: unexpected hold %q", hs)
	}
	for i, s := range shards {
		r.l.due.set(queue, s, heads[i])
	}
	due := make([]dueTenant, 0, (len(arr)-3)/3)
	for i := 3; i < len(arr); i += 3 {
		k, okK := arr[i].(int64)
		t, okT := arr[i+1].(string)
		ds, okD := arr[i+2].(string)
		if !okK || !okT || !okD || k < 1 || int(k) > len(shards) {
			return nil, fmt.Errorf("room.lua: unexpected tenant %v %v %v", arr[i], arr[i+1], arr[i+2])
		}
		at, err := strconv.ParseInt(ds, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("room.lua: unexpected due time %q", ds)
		}
		due = append(due, dueTenant{tenant: t, due: at, shard: shards[k-1], held: held})
	}
	return due, nil
}

// takeShard is room.lua's take on one shard: the tenants it took and the
// shard's earliest due time once they are held (-1: empty).
func (r *room) takeShard(ctx context.Context, queue string, shard, n int, hold time.Duration) ([]dueTenant, int64, error) {
	res, err := r.runRoom(ctx, queue, shard, "take", n, micros(hold))
	if err != nil {
		return nil, 0, fmt.Errorf("take due tenants: %w", err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) < 3 || len(arr)%2 == 0 {
		return nil, 0, fmt.Errorf("room.lua: unexpected reply %v", res)
	}
	hs, ok := arr[1].(string)
	head, okHead := arr[2].(int64)
	if !ok || !okHead {
		return nil, 0, fmt.Errorf("room.lua: unexpected reply %v", res)
	}
	held, err := strconv.ParseInt(hs, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("room.lua: unexpected hold %q", hs)
	}
	due := make([]dueTenant, 0, (len(arr)-3)/2)
	for i := 3; i < len(arr); i += 2 {
		s, ok := arr[i].(string)
		ds, okDue := arr[i+1].(string)
		if !ok || !okDue {
			return nil, 0, fmt.Errorf("room.lua: unexpected tenant %v %v", arr[i], arr[i+1])
		}
		at, err := strconv.ParseInt(ds, 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("room.lua: unexpected due time %q", ds)
		}
		due = append(due, dueTenant{tenant: s, due: at, shard: shard, held: held})
	}
	return due, head, nil
}

// take takes up to n tenants whose lines of queue are due, earliest due
// first across the shards, holding them for hold; the others it found due
// keep their places.
func (r *room) take(ctx context.Context, queue string, n int, hold time.Duration) ([]dueTenant, error) {
	taken, err := r.takeShards(ctx, queue, allShards(), n, hold)
	if len(taken) > n {
		if serr := r.settleDue(ctx, queue, taken[n:]); serr != nil {
			err = errors.Join(err, serr)
		}
		taken = taken[:n]
	}
	return taken, err
}

// settle sets the next due time of tenants a pump took from queue's index
// (zero: out of the index; dueNow: now, in Redis time), unless someone
// marked them meanwhile.
func (r *room) settle(ctx context.Context, queue string, taken []dueTenant, due map[string]time.Time) error {
	out := make([]dueTenant, 0, len(taken))
	for _, d := range taken {
		at, ok := due[d.tenant]
		if !ok {
			continue
		}
		d.due = -1
		switch {
		case at.Equal(dueNow):
			d.due = 0
		case !at.IsZero():
			d.due = at.UnixMicro()
		}
		out = append(out, d)
	}
	return r.settleDue(ctx, queue, out)
}

// settleDue is settle in order: the tenants of a shard due now keep the
// order given. One call in all on one server, one per shard on a Cluster.
func (r *room) settleDue(ctx context.Context, queue string, due []dueTenant) error {
	type group struct {
		shard int
		held  int64
	}
	groups := map[group][]any{}
	var order []group
	for _, d := range due {
		g := group{d.shard, d.held}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
			groups[g] = []any{d.held}
		}
		groups[g] = append(groups[g], d.tenant, d.due)
	}
	if !r.l.cluster && len(order) > 1 {
		// on one server, every shard in one call (room.lua's settleall),
		// the tenants in the order given across the shards: those due now
		// keep it, whatever their shards
		keys := make([]string, len(order))
		pos := make(map[group]int, len(order))
		args := make([]any, 0, len(order)+3*len(due))
		for i, g := range order {
			keys[i] = dueKey(r.l.cfg.Prefix, queue, g.shard)
			pos[g] = i + 1
			args = append(args, g.held)
		}
		for _, d := range due {
			args = append(args, pos[group{d.shard, d.held}], d.tenant, d.due)
		}
		res, err := r.l.batch.run(ctx, lua.Room, keys, r.roomArgs("settleall", queue, order[0].shard, args...))
		var heads []int64
		if err == nil {
			arr, ok := res.([]any)
			if !ok || len(arr) != 2 {
				err = fmt.Errorf("room.lua: unexpected reply %v", res)
			} else if heads, err = int64s(arr[1], len(order)); err != nil {
				err = fmt.Errorf("room.lua: %w", err)
			}
		}
		for i, g := range order {
			if err != nil {
				r.l.due.forget(queue, g.shard)
			} else {
				r.l.due.set(queue, g.shard, heads[i])
			}
		}
		if err != nil {
			return fmt.Errorf("settle due tenants: %w", err)
		}
		return nil
	}
	idx := make([]int, len(order))
	for i := range idx {
		idx[i] = i
	}
	return eachShard(idx, func(_, i int) error {
		g := order[i]
		res, err := r.runRoom(ctx, queue, g.shard, "settle", groups[g]...)
		if err != nil {
			r.l.due.forget(queue, g.shard)
			return fmt.Errorf("settle due tenants: %w", err)
		}
		v, err := int64s(res, 2)
		if err != nil {
			return fmt.Errorf("room.lua: %w", err)
		}
		r.l.due.set(queue, g.shard, v[1])
		return nil
	})
}

// turnOf reports whether it is tenant's turn in queue's index to take a
// slot a job of it freed (no other tenant is due before it), and whether
// another tenant is due now. Its shard answers for itself in one call;
// the other shards' earliest due times come from the view, those older
// than turnFresh read again. In a crowded room (crowd) it answers that
// another tenant is due first without asking, most times.
func (r *room) turnOf(ctx context.Context, queue, tenant string) (first, others bool, err error) {
	key := queue + lineSep + tenant
	if r.lately(&r.alone, key) {
		return true, false, nil
	}
	if r.crowded(queue) {
		return false, true, nil
	}
	shard := dueShard(tenant)
	res, err := r.runRoom(ctx, queue, shard, "turn", tenant)
	if err != nil {
		return false, false, fmt.Errorf("turn of tenant %q: %w", tenant, err)
	}
	v, err := int64s(res, 5)
	if err != nil {
		return false, false, fmt.Errorf("room.lua: %w", err)
	}
	now, due := v[0], v[3]
	first, others = v[1] == 1, v[2] == 1
	r.l.due.set(queue, shard, v[4])
	if first || !others {
		heads, err := r.heads(ctx, queue, shard, turnFresh)
		if err != nil {
			return false, false, fmt.Errorf("turn of tenant %q: %w", tenant, err)
		}
		for s, h := range heads {
			if s == shard || h < 0 || h > now {
				continue
			}
			others = true
			if due < 0 || h < due {
				first = false
			}
		}
	}
	if first && !others {
		r.remember(&r.alone, key, aloneFor)
	} else {
		r.remember(&r.alone, key, 0)
	}
	r.asked(queue, first, others)
	return first, others, nil
}

// heads are the earliest due times of the shards of queue's index but
// except (-1: empty; except's is -1), from the view where it was read
// within fresh, read again otherwise.
func (r *room) heads(ctx context.Context, queue string, except int, fresh time.Duration) ([dueShards]int64, error) {
	var heads [dueShards]int64
	view := r.l.due.get(queue)
	var stale []int
	for s, h := range view {
		heads[s] = -1
		if s == except {
			continue
		}
		if !h.known || h.read.IsZero() || time.Since(h.read) > fresh {
			stale = append(stale, s)
			continue
		}
		heads[s] = h.head
	}
	_, read, err := r.readHeads(ctx, queue, stale)
	for i, s := range stale {
		heads[s] = read[i]
	}
	return heads, err
}

// readHeads reads the earliest due time of each of shards (-1: empty),
// which the view records, and the Redis time: on one server in one
// script call (room.lua's heads, every shard in KEYS), on a Cluster one
// call per shard (their tags are in different slots), which share round
// trips.
func (r *room) readHeads(ctx context.Context, queue string, shards []int) (now int64, heads []int64, err error) {
	heads = make([]int64, len(shards))
	if len(shards) == 0 {
		return 0, heads, nil
	}
	if !r.l.cluster {
		keys := make([]string, len(shards))
		for i, s := range shards {
			keys[i] = dueKey(r.l.cfg.Prefix, queue, s)
		}
		res, err := r.l.batch.run(ctx, lua.Room, keys, r.roomArgs("heads", queue, shards[0]))
		if err != nil {
			for _, s := range shards {
				r.l.due.forget(queue, s)
			}
			return 0, nil, fmt.Errorf("next due tenant: %w", err)
		}
		v, err := int64s(res, len(shards)+1)
		if err != nil {
			return 0, nil, fmt.Errorf("room.lua: %w", err)
		}
		for i, s := range shards {
			heads[i] = v[i+1]
			r.l.due.set(queue, s, v[i+1])
		}
		return v[0], heads, nil
	}
	nows := make([]int64, len(shards))
	err = eachShard(shards, func(i, s int) error {
		var err error
		nows[i], heads[i], err = r.nextShard(ctx, queue, s)
		return err
	})
	return nows[0], heads, err
}

// nextShard is room.lua's next on one shard: the Redis time and the
// shard's earliest due time (-1: empty), which the view records.
func (r *room) nextShard(ctx context.Context, queue string, shard int) (now, head int64, err error) {
	res, err := r.runRoom(ctx, queue, shard, "next")
	if err != nil {
		r.l.due.forget(queue, shard)
		return 0, 0, fmt.Errorf("next due tenant: %w", err)
	}
	v, err := int64s(res, 2)
	if err != nil {
		return 0, 0, fmt.Errorf("room.lua: %w", err)
	}
	r.l.due.set(queue, shard, v[1])
	return v[0], v[1], nil
}

// requeue puts tenant, due now or earlier in queue's index, behind the
// tenants due before it: its turn ended.
func (r *room) requeue(ctx context.Context, queue, tenant string) error {
	if _, err := r.runRoom(ctx, queue, dueShard(tenant), "requeue", tenant); err != nil {
		return fmt.Errorf("requeue tenant %q: %w", tenant, err)
	}
	return nil
}

// dueNow, as a due time given to settle, is the time settle runs (Redis
// time).
var dueNow = time.UnixMicro(0)

// mark makes tenants due now in queue's index (or keeps an earlier due
// time): one call per shard they are in.
func (r *room) mark(ctx context.Context, queue string, tenants ...string) error {
	groups := byShard(tenants)
	return eachShard(keysOfMap(groups), func(_, s int) error {
		args := make([]any, len(groups[s]))
		for i, t := range groups[s] {
			args[i] = t
		}
		if _, err := r.runRoom(ctx, queue, s, "mark", args...); err != nil {
			return fmt.Errorf("mark tenants due: %w", err)
		}
		// this process's releases know at once (others from the wake)
		r.l.due.lower(queue, s, r.l.estimatedNow().UnixMicro())
		return nil
	})
}

// nudge makes tenants due now in queue's index unless a pump holds them or
// they are due within the pumps' hold (room.lua's nudge): a release gave
// back a slot their lines did not wait for.
func (r *room) nudge(ctx context.Context, queue string, tenants ...string) error {
	groups := byShard(tenants)
	return eachShard(keysOfMap(groups), func(_, s int) error {
		args := []any{micros(waitroom.HoldDefault)}
		for _, t := range groups[s] {
			args = append(args, t)
		}
		if _, err := r.runRoom(ctx, queue, s, "nudge", args...); err != nil {
			return fmt.Errorf("mark tenants due: %w", err)
		}
		r.l.due.lower(queue, s, r.l.estimatedNow().UnixMicro())
		return nil
	})
}

// markAt makes tenant due in queue's index at the given time, or keeps an
// earlier due time.
func (r *room) markAt(ctx context.Context, queue, tenant string, at time.Time) error {
	if _, err := r.runRoom(ctx, queue, dueShard(tenant), "markat", tenant, at.UnixMicro()); err != nil {
		return fmt.Errorf("mark tenant %q due: %w", tenant, err)
	}
	r.l.due.lower(queue, dueShard(tenant), at.UnixMicro())
	return nil
}

// markAll makes every tenant in queue's index due now: a policy change
// may have moved their lines' due times. One call per shard.
func (r *room) markAll(ctx context.Context, queue string) error {
	return eachShard(allShards(), func(_, s int) error {
		if _, err := r.runRoom(ctx, queue, s, "markall"); err != nil {
			return fmt.Errorf("mark every tenant due: %w", err)
		}
		return nil
	})
}

// ensure makes each tenant not in queue's index due now (lines a sweep
// found), in calls of at most 1,000 tenants of one shard.
func (r *room) ensure(ctx context.Context, queue string, tenants []string) error {
	groups := byShard(tenants)
	return eachShard(keysOfMap(groups), func(_, s int) error {
		ts := groups[s]
		for start := 0; start < len(ts); start += 1000 {
			chunk := ts[start:min(start+1000, len(ts))]
			args := make([]any, len(chunk))
			for i, t := range chunk {
				args[i] = t
			}
			if _, err := r.runRoom(ctx, queue, s, "ensure", args...); err != nil {
				return fmt.Errorf("sweep lines: %w", err)
			}
		}
		return nil
	})
}

// drainUnsharded moves the tenants of queue's index as sluice kept it
// before its shards (one key) into the shards, each at its due time (or
// an earlier one it has there), in pieces of 1,000; the sweep does it, so
// an upgraded fleet serves the lines the old one indexed.
func (r *room) drainUnsharded(ctx context.Context, queue string) error {
	key := unshardedDueKey(r.l.cfg.Prefix, queue)
	for {
		zs, err := r.l.client.ZRangeWithScores(ctx, key, 0, 999).Result()
		if err != nil {
			return fmt.Errorf("drain the unsharded due index of queue %q: %w", queue, err)
		}
		if len(zs) == 0 {
			return nil
		}
		groups := map[int][]any{}
		members := make([]any, 0, len(zs))
		for _, z := range zs {
			t, _ := z.Member.(string)
			s := dueShard(t)
			groups[s] = append(groups[s], t, int64(z.Score))
			members = append(members, t)
		}
		if err := eachShard(keysOfMap(groups), func(_, s int) error {
			_, err := r.runRoom(ctx, queue, s, "markat", groups[s]...)
			return err
		}); err != nil {
			return fmt.Errorf("drain the unsharded due index of queue %q: %w", queue, err)
		}
		if err := r.l.client.ZRem(ctx, key, members...).Err(); err != nil {
			return fmt.Errorf("drain the unsharded due index of queue %q: %w", queue, err)
		}
	}
}

// next is the earliest due time in queue's index (every shard read) and
// the Redis time it was read at; ok is false when no line is due at all.
func (r *room) next(ctx context.Context, queue string) (due, now time.Time, ok bool, err error) {
	nowUS, heads, err := r.readHeads(ctx, queue, allShards())
	if err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	first := int64(-1)
	for _, h := range heads {
		if h >= 0 && (first < 0 || h < first) {
			first = h
		}
	}
	now = time.UnixMicro(nowUS)
	if first < 0 {
		return time.Time{}, now, false, nil
	}
	return time.UnixMicro(first), now, true, nil
}

// parseWake reads a wake message: the queue, the shard of its index and
// the due time a tenant got there; ok is false for anything else (a
// sluice from before the shards sent the queue's name alone).
func parseWake(msg string) (queue string, shard int, due int64, ok bool) {
	f := strings.Split(msg, lineSep)
	if len(f) != 3 {
		return msg, 0, 0, false
	}
	s, err := strconv.Atoi(f[1])
	if err != nil || s < 0 || s >= dueShards {
		return f[0], 0, 0, false
	}
	due, err = strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return f[0], 0, 0, false
	}
	return f[0], s, due, true
}

// linesIndexed are the tenants of queue's index, earliest due first, at
// most max of them (every shard read in one pipeline).
func (r *room) linesIndexed(ctx context.Context, queue string, max int) ([]string, error) {
	pipe := r.l.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, dueShards)
	for s := range cmds {
		cmds[s] = pipe.ZRangeWithScores(ctx, dueKey(r.l.cfg.Prefix, queue, s), 0, int64(max)-1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read the waiting room's lines: %w", err)
	}
	var all []redis.Z
	for _, c := range cmds {
		all = append(all, c.Val()...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Score < all[j].Score })
	out := make([]string, 0, min(len(all), max))
	for _, z := range all[:min(len(all), max)] {
		if t, ok := z.Member.(string); ok {
			out = append(out, t)
		}
	}
	return out, nil
}
