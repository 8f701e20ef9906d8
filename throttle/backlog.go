package throttle

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/lua"
)

// The backlog of a tenant: its queued and deferred jobs, counted against
// its cap (backlog=K).

// AddBacklog counts jobs ids of tenant in its backlog, in order, until the
// backlog holds limit jobs (limit 0: no cap). It returns how many of the ids
// were taken (the first n; an id already counted is taken again without
// counting twice) and the backlog's size afterwards. The queue package calls
// it before enqueueing and RemoveBacklog when an enqueue fails.
func (l *Limiter) AddBacklog(ctx context.Context, tenant string, limit int64, ids ...string) (int, int64, error) {
	if err := ValidateTenant(tenant); err != nil {
		return 0, 0, err
	}
	if limit < 0 {
		return 0, 0, fmt.Errorf("backlog of tenant %q: cap %d must not be negative", tenant, limit)
	}
	if len(ids) == 0 {
		return 0, 0, nil
	}
	args := make([]any, 0, len(ids)+1)
	args = append(args, limit)
	for _, id := range ids {
		args = append(args, id)
	}
	res, err := l.batch.run(ctx, lua.Backlog, []string{keysFor(l.cfg.Prefix, tenant).backlog}, args)
	if err != nil {
		return 0, 0, fmt.Errorf("backlog of tenant %q: %w", tenant, err)
	}
	v, err := int64s(res, 2)
	if err != nil {
		return 0, 0, fmt.Errorf("backlog.lua: %w", err)
	}
	return int(v[0]), v[1], nil
}

// RemoveBacklog takes jobs out of tenant's backlog.
func (l *Limiter) RemoveBacklog(ctx context.Context, tenant string, ids ...string) error {
	if err := ValidateTenant(tenant); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	if err := l.client.ZRem(ctx, keysFor(l.cfg.Prefix, tenant).backlog, members...).Err(); err != nil {
		return fmt.Errorf("backlog of tenant %q: %w", tenant, err)
	}
	return nil
}
