package throttle

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"
)

// tenantsScanCount is the COUNT hint of each SCAN call.
const tenantsScanCount = 1000

// Tenants lists, sorted, every tenant that has throttle state in Redis
// (meters, window entries, reservations, slots, cooldown or backlog), and
// GlobalPolicy when @global has state. Tenants with a policy but no state
// are not listed: PolicyStore.List has those. An idle tenant drops out once
// its keys have expired.
//
// It SCANs the keyspace (every master of a Cluster), so it costs time in
// proportion to the number of keys in the database: it is meant for
// operators' tools, not for the job path.
func (l *Limiter) Tenants(ctx context.Context) ([]string, error) {
	seen, err := l.scanScopes(ctx, scopeKeyPattern(l.cfg.Prefix))
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out, nil
}

// scanScopes SCANs the keyspace (every master of a Cluster) for keys that
// match pattern and returns the scopes they belong to.
func (l *Limiter) scanScopes(ctx context.Context, pattern string) (map[string]struct{}, error) {
	var (
		mu   sync.Mutex
		seen = map[string]struct{}{}
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, tenantsScanCount).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				if t, ok := scopeFromKey(l.cfg.Prefix, k); ok {
					seen[t] = struct{}{}
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.client)
	}
	return seen, err
}
