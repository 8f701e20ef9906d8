package asynqroom

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// forwardChunk is the most tasks one forward.lua call moves, as asynq's
// own forwarder does (a short script run, however many are due).
const forwardChunk = 100

// Forward moves queue's tasks due at now from asynq's schedule and retry
// set to its pending list (a task of a group to its group's set), as
// asynq's forwarder does, in calls of at most forwardChunk tasks until none
// is due. It returns how many it moved. It writes asynq's keys: call it
// only once the layout is known (Layout.Check).
func Forward(ctx context.Context, client redis.UniversalClient, queue string, now time.Time) (int, error) {
	p := queuePrefix(queue)
	keys := []string{p + "scheduled", p + "retry", PendingKey(queue)}
	total := 0
	for {
		n, err := lua.Forward.Run(ctx, client, keys, now.Unix(), p+"t:", strconv.FormatInt(now.UnixNano(), 10), p+"g:", forwardChunk).Int()
		if err != nil {
			return total, fmt.Errorf("forward the due tasks of queue %q: %w", queue, err)
		}
		total += n
		if n < forwardChunk {
			return total, nil
		}
	}
}
