package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/lua"
)

// Cooldown pauses tenant for d: no job of it starts until then, and jobs
// holding reservations inside the pause get new slots after it. A longer
// cooldown already in place is kept. Use GlobalPolicy to pause everything.
// It returns when the cooldown ends.
func (l *Limiter) Cooldown(ctx context.Context, tenant string, d time.Duration) (time.Time, error) {
	if tenant != GlobalPolicy {
		if err := validateTenant(tenant); err != nil {
			return time.Time{}, err
		}
	}
	if d <= 0 {
		return time.Time{}, fmt.Errorf("cooldown tenant %q: duration %s must be positive", tenant, d)
	}
	keys := []string{keysFor(l.cfg.Prefix, tenant).state}
	res, err := l.batch.run(ctx, lua.Cooldown, keys, []any{l.clockArg(), micros(d), l.noTTLArg()})
	if err != nil {
		return time.Time{}, fmt.Errorf("cooldown tenant %q: %w", tenant, err)
	}
	v, err := int64s(res, 2)
	if err != nil {
		return time.Time{}, fmt.Errorf("cooldown.lua: %w", err)
	}
	return time.UnixMicro(v[0]), nil
}

// Reset deletes every piece of throttle state of tenant (meters, window
// entries, reservations, slots, cooldown). Its policy is kept.
func (l *Limiter) Reset(ctx context.Context, tenant string) error {
	if tenant != GlobalPolicy {
		if err := validateTenant(tenant); err != nil {
			return err
		}
	}
	k := keysFor(l.cfg.Prefix, tenant)
	if err := l.client.Del(ctx, k.state, k.planned, k.started).Err(); err != nil {
		return fmt.Errorf("reset tenant %q: %w", tenant, err)
	}
	return nil
}
