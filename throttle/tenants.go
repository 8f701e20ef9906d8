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
// (meters, window entries, reservations, slots, cooldown or a line of
// waiting jobs),
// GlobalPolicy when @global has state, the shared pools that have
// state ("@openai") and the keys below tenants that have state
// ("acme/user-42"). Tenants with a policy but no state
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
	pools, err := l.scanScopes(ctx, poolKeyPattern(l.cfg.Prefix))
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	keys, err := l.scanScopes(ctx, keyKeyPattern(l.cfg.Prefix))
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	for _, m := range []map[string]struct{}{pools, keys} {
		for p := range m {
			seen[p] = struct{}{}
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out, nil
}

// scanLines SCANs the keyspace (every master of a Cluster) for the
// waiting room's lines: the tenants with one, by queue.
func (l *Limiter) scanLines(ctx context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	err := l.scan(ctx, lineKeyPattern(l.cfg.Prefix), func(key string) {
		if t, q, ok := scopeAndQueue(l.cfg.Prefix, key); ok && q != "" {
			out[q] = append(out[q], t)
		}
	})
	return out, err
}

// scanScopes SCANs the keyspace (every master of a Cluster) for keys that
// match pattern and returns the scopes they belong to.
func (l *Limiter) scanScopes(ctx context.Context, pattern string) (map[string]struct{}, error) {
	seen := map[string]struct{}{}
	err := l.scan(ctx, pattern, func(key string) {
		if t, ok := scopeFromKey(l.cfg.Prefix, key); ok {
			seen[t] = struct{}{}
		}
	})
	return seen, err
}

// scan calls found with every key that matches pattern, one at a time.
func (l *Limiter) scan(ctx context.Context, pattern string, found func(key string)) error {
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, tenantsScanCount).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				found(k)
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	}
	return scan(ctx, l.client)
}
