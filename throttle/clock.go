package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis time, as the scripts see it, and the integer arithmetic of
// microseconds.

func (l *Limiter) clockArg() int64 {
	if l.clock == nil {
		return -1
	}
	return l.clock().UnixMicro()
}

// estimatedNow is the earliest Redis time can be now, as the replies
// tell (redisClock): never ahead of it, and behind it by about the
// quickest reply's way back. Quota windows are chosen by it (the script
// tells when the guess was off), and a job waits by it for its slot, so
// that it never starts before it.
func (l *Limiter) estimatedNow() time.Time { return l.redisNow(false) }

// redisNow is Redis time now by the earliest or the latest bound (the
// latest: a job is late for its slot when this is past it).
func (l *Limiter) redisNow(latest bool) time.Time { return l.nowBy(&l.rclock, latest) }

// nowBy is the time now of the server whose bounds c are, by the earliest
// or the latest bound.
func (l *Limiter) nowBy(c *redisClock, latest bool) time.Time {
	if l.clock != nil {
		return l.clock()
	}
	now := time.Now()
	lo, hi, _ := c.bounds(now.UnixMicro())
	if latest {
		lo = hi
	}
	return now.Add(time.Duration(lo) * time.Microsecond)
}

// syncClock reads Redis time with TIME: on a Cluster, that of the master
// that holds key ("": any server's, into the limiter's own bounds).
func (l *Limiter) syncClock(ctx context.Context, key string) error {
	_, err := l.readClock(ctx, key)
	return err
}

// readClock is syncClock that also returns the Redis time it read (unix
// µs).
func (l *Limiter) readClock(ctx context.Context, key string) (int64, error) {
	if l.clock != nil {
		return 0, errors.New("quota windows do not cover the test clock")
	}
	c, node := l.clockFor(ctx, key)
	var cmd redis.Cmdable = l.client
	if node != nil {
		cmd = node
	}
	sent := time.Now()
	t, err := cmd.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("read Redis time: %w", err)
	}
	r, got := t.UnixMicro(), time.Now().UnixMicro()
	c.observe(r, sent.UnixMicro(), got)
	if c != &l.rclock {
		l.rclock.observe(r, sent.UnixMicro(), got)
	}
	return r, nil
}

// observed records the Redis time now (µs) of a reply to a call sent at
// local time sent, from the server that holds key: into the limiter's
// bounds and, on a Cluster, into that master's own.
func (l *Limiter) observed(ctx context.Context, key string, now int64, sent time.Time) {
	got := time.Now().UnixMicro()
	l.rclock.observe(now, sent.UnixMicro(), got)
	if l.cluster && key != "" {
		if c, _ := l.clockFor(ctx, key); c != &l.rclock {
			c.observe(now, sent.UnixMicro(), got)
		}
	}
}

// masterClocks are a Cluster's masters' bounds of Redis time, one per
// master's address. Each master reads its own clock, and clocks of
// different servers may disagree by more than the bounds are wide: in
// one set of bounds, the replies of one master would start the others'
// again, and a job would wait for its slot (a time of its tenant's
// master) by another master's clock, early or late by their difference.
type masterClocks struct {
	m sync.Map // address -> *redisClock
}

func (mc *masterClocks) of(addr string) *redisClock {
	if c, ok := mc.m.Load(addr); ok {
		return c.(*redisClock)
	}
	c, _ := mc.m.LoadOrStore(addr, &redisClock{})
	return c.(*redisClock)
}

// clockFor is the bounds of Redis time that a decision on key is made
// by: on one server the limiter's own; on a Cluster those of the master
// that holds key, with a client of that master (nil: the limiter's own
// bounds, when key is "" or its master is not known).
func (l *Limiter) clockFor(ctx context.Context, key string) (*redisClock, *redis.Client) {
	if !l.cluster || key == "" || l.masterOf == nil {
		return &l.rclock, nil
	}
	node, addr := l.masterOf(ctx, key)
	if addr == "" {
		return &l.rclock, nil
	}
	return l.masters.of(addr), node
}

// nowFor is Redis time now, by the earliest or the latest bound, of the
// server that holds key (clockFor).
func (l *Limiter) nowFor(ctx context.Context, key string, latest bool) time.Time {
	c, _ := l.clockFor(ctx, key)
	return l.nowBy(c, latest)
}

// redisClock is what the replies tell of Redis time against this
// process's clock. A reply that carries Redis time (µs), to a call sent at
// local time sent and answered at got, bounds the offset (Redis minus
// local): Redis read its clock in between, so the offset is at least
// redis-got and at most redis-sent. The bounds of every reply are
// intersected, each widened by clockDrift since it was read (two clocks
// drift apart slowly), so the quickest ways there and back set them, not
// the last reply's, which a loaded process reads late: a job that waits by
// the last reply's offset wakes late by as much, and by a different amount
// each time. Bounds that no longer meet (a clock was set, or the replies
// come from another server) start again from the new reply's.
type redisClock struct {
	b atomic.Pointer[clockBounds]
}

// clockBounds are the offset's bounds (µs) as of local time at (unix µs).
type clockBounds struct{ lo, hi, at int64 }

// clockDrift is how fast the bounds widen with age: 100 µs per second,
// above what clocks kept by NTP drift apart.
const clockDrift = 100 // ppm

// bounds are the offset's bounds at local time now (unix µs); ok is false
// before any reply (both are 0 then).
func (c *redisClock) bounds(now int64) (lo, hi int64, ok bool) {
	b := c.b.Load()
	if b == nil {
		return 0, 0, false
	}
	w := max(0, now-b.at) * clockDrift / 1_000_000
	return b.lo - w, b.hi + w, true
}

// observe records a reply: Redis time redis, for a call sent at local
// time sent and answered at got (all unix µs).
func (c *redisClock) observe(redis, sent, got int64) {
	for {
		old := c.b.Load()
		n := &clockBounds{lo: redis - got, hi: redis - min(sent, got), at: got}
		if old != nil {
			lo, hi, _ := c.bounds(got)
			if l, h := max(lo, n.lo), min(hi, n.hi); l <= h {
				n = &clockBounds{lo: l, hi: h, at: max(got, old.at)}
			}
		}
		if c.b.CompareAndSwap(old, n) {
			return
		}
	}
}

// measuredAt is when the bounds were last narrowed or set (zero: never).
func (c *redisClock) measuredAt() time.Time {
	b := c.b.Load()
	if b == nil {
		return time.Time{}
	}
	return time.UnixMicro(b.at)
}

// offsetMaxAge is how old the bounds of Redis time may grow before a
// ticket's redemption reads Redis time again: they widen by clockDrift,
// 0.1 ms in a second, and a ticket's window after its slot is 2 ms for a
// tenant near its limits. A worker that redeems tickets reads TIME at most
// once a second (its other calls' replies narrow the bounds too).
const offsetMaxAge = time.Second

// freshClock makes sure the bounds of Redis time of the server that
// holds key (clockFor) were measured within offsetMaxAge (one TIME call
// when they were not).
func (l *Limiter) freshClock(ctx context.Context, key string) error {
	if l.clock != nil {
		return nil
	}
	if c, _ := l.clockFor(ctx, key); time.Since(c.measuredAt()) < offsetMaxAge {
		return nil
	}
	return l.syncClock(ctx, key)
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// ceilDiv returns ceil(a/b) for positive b, exactly.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// mulDivCeil returns ceil(a*b/c) for a, b ≥ 0 and c > 0, exactly, or
// math.MaxInt64 when that does not fit in 64 bits (validated policies keep
// every value far below).
func mulDivCeil(a, b, c int64) int64 {
	v, ok := mulDivCeilExact(a, b, c)
	if !ok {
		return math.MaxInt64
	}
	return v
}

// mulDivCeilExact returns ceil(a*b/c) for a, b ≥ 0 and c > 0 in 128-bit
// arithmetic; false when the result does not fit in an int64.
func mulDivCeilExact(a, b, c int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 0, false
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return 0, false
	}
	return int64(q), true
}

// clusterMasterOf names the master of cc that holds a key, from the
// client's map of the Cluster's slots (read once; a reply that says a slot
// moved updates it).
func clusterMasterOf(cc *redis.ClusterClient) func(ctx context.Context, key string) (*redis.Client, string) {
	return func(ctx context.Context, key string) (*redis.Client, string) {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, ""
		}
		return node, node.Options().Addr
	}
}
