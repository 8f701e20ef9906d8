package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Redis time, as the scripts see it, and the integer arithmetic of
// microseconds.

func (l *Limiter) clockArg() int64 {
	if l.clock == nil {
		return -1
	}
	return l.clock().UnixMicro()
}

// estimatedNow is the local guess of Redis time, used only to choose which
// quota windows to send; the script tells when the guess was off.
func (l *Limiter) estimatedNow() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now().Add(time.Duration(l.offset.Load()) * time.Microsecond)
}

func (l *Limiter) syncClock(ctx context.Context) error {
	if l.clock != nil {
		return errors.New("quota windows do not cover the test clock")
	}
	t, err := l.client.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("read Redis time: %w", err)
	}
	l.setOffset(t.UnixMicro())
	return nil
}

// setOffset records Redis time (µs) as just read.
func (l *Limiter) setOffset(redisNow int64) {
	now := time.Now()
	l.offset.Store(redisNow - now.UnixMicro())
	l.offsetAt.Store(now.UnixNano())
}

// offsetMaxAge is how old the estimate of Redis time may grow before a
// ticket's redemption reads Redis time again (clocks drift apart slowly).
const offsetMaxAge = 30 * time.Second

// freshClock makes sure the estimate of Redis time was measured within
// offsetMaxAge (one TIME call when it was not).
func (l *Limiter) freshClock(ctx context.Context) error {
	if l.clock != nil || time.Since(time.Unix(0, l.offsetAt.Load())) < offsetMaxAge {
		return nil
	}
	return l.syncClock(ctx)
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
