package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Unreserve gives back job id's reservation, for a job that will not come
// for its slot after all (its enqueue failed, or it was dropped): the rate,
// window and quota rules are refunded what the reservation charged, so the
// slot can serve another job. It reports whether a reservation was found.
// cost must be the cost the reservation was made with. A reservation whose
// grace has passed is only removed.
func (l *Limiter) Unreserve(ctx context.Context, tenant, id string, cost int64) (bool, error) {
	if tenant != "" {
		if err := ValidateTenant(tenant); err != nil {
			return false, err
		}
	}
	if cost < 1 {
		return false, fmt.Errorf("unreserve tenant %q: cost %d: must be at least 1", tenant, cost)
	}
	scopes, err := l.scopes(ctx, tenant)
	if err != nil {
		return false, fmt.Errorf("unreserve tenant %q: %w", tenant, err)
	}
	found := false
	for _, s := range scopes {
		raw, err := l.client.HGet(ctx, s.keys.state, "r:"+id).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return found, fmt.Errorf("unreserve tenant %q job %q: %w", tenant, id, err)
		}
		slot, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return found, fmt.Errorf("unreserve tenant %q job %q: reservation %q is not a time", tenant, id, raw)
		}
		found = true
		// a reservation past its grace charged a slot that is gone: drop it only
		d := Decision{Reserved: true, Slot: time.UnixMicro(slot), charged: 1}
		if now := l.estimatedNow(); time.UnixMicro(slot).Add(l.cfg.Grace).Before(now) {
			if err := l.client.HDel(ctx, s.keys.state, "r:"+id).Err(); err != nil {
				return found, fmt.Errorf("unreserve tenant %q job %q: %w", tenant, id, err)
			}
			continue
		}
		if err := l.refund(ctx, s, id, cost, d); err != nil {
			return found, err
		}
	}
	return found, nil
}
