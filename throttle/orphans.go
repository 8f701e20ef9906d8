package throttle

import (
	"context"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Orphans: jobs whose tasks are parked in the queue engine but that no line
// holds. A producer records a job's intent (Arrive, when the job is to
// wait) before it parks the task, and joining the line takes the intent
// back; a producer that dies in between, or whose join and the clean-up
// after it both fail, leaves the intent. The pumps' sweep finds intents
// older than intentAge and puts their jobs in their lines when the tasks
// are still parked, or drops them.

const (
	// intentAge is how old an intent is before the sweep takes its job for
	// an orphan: a producer between Arrive and its join is much quicker.
	intentAge = 10 * time.Second
	// intentGoneAge is how old the intent of a job without a task is
	// before the sweep drops it.
	intentGoneAge = time.Minute
	// orphansPerCall is how many intents the sweep reads at once.
	orphansPerCall = 1000
)

// intentKeyPattern is a SCAN MATCH pattern for every tenant's intents.
func intentKeyPattern(prefix string) string {
	return globEscape(prefix) + ":{t:*}:j*"
}

// sweepOrphans puts in their lines the jobs of intents older than
// intentAge whose tasks lookup finds parked, and drops the intents of jobs
// it finds elsewhere or (after intentGoneAge) missing.
func (r *room) sweepOrphans(ctx context.Context, lookup waitroom.TaskLookup) error {
	if lookup == nil {
		return nil
	}
	var now time.Time
	if r.l.clock != nil {
		now = r.l.clock()
	} else {
		t, err := r.l.client.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("sweep intents: read Redis time: %w", err)
		}
		now = t
	}
	var tenants []string
	seen := map[string]bool{}
	err := r.l.scan(ctx, intentKeyPattern(r.l.cfg.Prefix), func(key string) {
		if t, ok := scopeFromKey(r.l.cfg.Prefix, key); ok && t != GlobalPolicy && !seen[t] {
			seen[t] = true
			tenants = append(tenants, t)
		}
	})
	if err != nil {
		return fmt.Errorf("sweep intents: %w", err)
	}
	for _, t := range tenants {
		for _, p := range priorities {
			if err := r.sweepTenantOrphans(ctx, t, p, now, lookup); err != nil {
				return err
			}
		}
	}
	return nil
}

// sweepTenantOrphans sweeps tenant's intents of priority level p: the jobs
// it joins join that level.
func (r *room) sweepTenantOrphans(ctx context.Context, tenant string, p int, now time.Time, lookup waitroom.TaskLookup) error {
	key := keysFor(r.l.cfg.Prefix, tenant).intentsAt(p)
	max := strconv.FormatInt(now.Add(-intentAge).UnixMicro(), 10)
	gone := now.Add(-intentGoneAge).UnixMicro()
	for offset := int64(0); ; offset += orphansPerCall {
		zs, err := r.l.client.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: max, Offset: offset, Count: orphansPerCall}).Result()
		if err != nil {
			return fmt.Errorf("sweep intents of tenant %q: %w", tenant, err)
		}
		jobs := make([]waitroom.Waiter, 0, len(zs))
		scores := make([]int64, 0, len(zs))
		var bad []any
		for _, z := range zs {
			m, _ := z.Member.(string)
			w, ok := parseLineTail(m)
			w.Priority = p
			if !ok {
				bad = append(bad, m)
				continue
			}
			jobs, scores = append(jobs, w), append(scores, int64(z.Score))
		}
		if len(bad) > 0 {
			if err := r.l.client.ZRem(ctx, key, bad...).Err(); err != nil {
				return fmt.Errorf("sweep intents of tenant %q: %w", tenant, err)
			}
		}
		if len(jobs) > 0 {
			states, err := lookup(ctx, tenant, jobs)
			if err != nil {
				return fmt.Errorf("sweep intents of tenant %q: %w", tenant, err)
			}
			if len(states) != len(jobs) {
				return fmt.Errorf("sweep intents of tenant %q: the lookup answered %d of %d jobs", tenant, len(states), len(jobs))
			}
			parked := map[string][]waitroom.Waiter{}
			var drop []waitroom.Waiter
			for i, w := range jobs {
				switch {
				case states[i] == waitroom.TaskParked:
					parked[queueOf(w.Queue)] = append(parked[queueOf(w.Queue)], w)
				case states[i] == waitroom.TaskElsewhere, states[i] == waitroom.TaskMissing && scores[i] <= gone:
					drop = append(drop, w)
				}
			}
			for _, ws := range parked {
				if _, err := r.Rejoin(ctx, tenant, ws...); err != nil {
					return fmt.Errorf("sweep intents: %w", err)
				}
			}
			if err := r.Forget(ctx, tenant, drop...); err != nil {
				return fmt.Errorf("sweep intents: %w", err)
			}
			// what was joined or dropped left the set; the rest stays
			offset -= int64(len(drop) + len(bad))
			for _, ws := range parked {
				offset -= int64(len(ws))
			}
		}
		if len(zs) < orphansPerCall {
			return nil
		}
	}
}

// parseLineTail reads a line entry without its time, COST␟QUEUE␟ID, back
// into a Waiter.
func parseLineTail(m string) (waitroom.Waiter, bool) {
	e, ok := parseLineEntry("0" + lineSep + m)
	if !ok {
		return waitroom.Waiter{}, false
	}
	return waitroom.Waiter{ID: e.id, Queue: e.queue, Cost: e.cost, Key: e.key}, true
}
