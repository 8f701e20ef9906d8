package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	l.offset.Store(t.Sub(time.Now()).Microseconds())
	return nil
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

// mulDivCeil returns ceil(a*b/c) without overflowing for the values rules use.
func mulDivCeil(a, b, c int64) int64 {
	if a <= math.MaxInt64/max(b, 1) {
		return ceilDiv(a*b, c)
	}
	return int64(math.Ceil(float64(a) * float64(b) / float64(c)))
}
