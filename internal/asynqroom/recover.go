package asynqroom

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// ActiveKey is the list of a queue's tasks being run.
func ActiveKey(queue string) string { return queuePrefix(queue) + "active" }

// LeaseKey is the zset of a queue's active tasks by the end of their asynq
// lease (Unix seconds, the worker's clock), which the worker running them
// extends every 5 s.
func LeaseKey(queue string) string { return queuePrefix(queue) + "lease" }

// RecoverMax is how many times sluice gives one task back; after that it
// is left to asynq's own recoverer, which counts each give-back as a
// failed attempt and archives the task at its retry limit (a job that
// kills its worker every time does not run for ever).
const RecoverMax = 3

// Orphan is an active task to give back: its id and, unless its worker
// is known to be dead, the lease score it was seen with for long enough
// (it is given back only if the score is unchanged).
type Orphan struct {
	ID    string
	Lease string // "" when its worker is dead: whatever its lease
}

// Recovered is what became of one task given to Recover.
type Recovered int

// What Recover did with a task.
const (
	// NotActive: the task is gone, done or pending already; left alone.
	NotActive Recovered = iota
	// GivenBack: moved from the active list to the pending list.
	GivenBack
	// TooOften: given back RecoverMax times already; left to asynq.
	TooOften
	// Extended: its lease changed, a live worker holds it; left alone.
	Extended
)

// recoverChunk is the most tasks one recover.lua call moves.
const recoverChunk = 100

// Recover gives the tasks of queue that nobody runs any more back to its
// pending list (lua/recover.lua), one script call per queue and chunk.
// The results are in the order of tasks.
func Recover(ctx context.Context, client redis.UniversalClient, queue string, tasks []Orphan) ([]Recovered, error) {
	out := make([]Recovered, 0, len(tasks))
	for start := 0; start < len(tasks); start += recoverChunk {
		chunk := tasks[start:min(start+recoverChunk, len(tasks))]
		keys := make([]string, 0, 3+len(chunk))
		args := make([]any, 0, 1+2*len(chunk))
		keys = append(keys, ActiveKey(queue), LeaseKey(queue), PendingKey(queue))
		args = append(args, RecoverMax)
		for _, t := range chunk {
			keys = append(keys, TaskKey(queue, t.ID))
			args = append(args, t.ID, t.Lease)
		}
		res, err := lua.Recover.Run(ctx, client, keys, args...).Result()
		if err != nil {
			return out, fmt.Errorf("give back tasks of queue %q: %w", queue, err)
		}
		arr, ok := res.([]any)
		if !ok || len(arr) != len(chunk) {
			return out, fmt.Errorf("give back tasks of queue %q: unexpected reply %v", queue, res)
		}
		for _, v := range arr {
			n, ok := v.(int64)
			if !ok || n < 0 || n > int64(Extended) {
				return out, fmt.Errorf("give back tasks of queue %q: unexpected result %v", queue, v)
			}
			out = append(out, [...]Recovered{NotActive, GivenBack, TooOften, Extended}[n])
		}
	}
	return out, nil
}

// Leases returns the active tasks of queue with their lease scores, as
// text (compared as Recover's Orphan.Lease).
func Leases(ctx context.Context, client redis.UniversalClient, queue string) (map[string]string, error) {
	zs, err := client.ZRangeWithScores(ctx, LeaseKey(queue), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read the leases of queue %q: %w", queue, err)
	}
	out := make(map[string]string, len(zs))
	for _, z := range zs {
		id, ok := z.Member.(string)
		if !ok {
			continue
		}
		out[id] = strconv.FormatFloat(z.Score, 'f', -1, 64)
	}
	return out, nil
}
