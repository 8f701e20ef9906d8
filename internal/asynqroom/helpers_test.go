package asynqroom

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// waitFor waits, 10 s at the most, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "timed out waiting for %s", what)
		time.Sleep(5 * time.Millisecond)
	}
}

// runLog is what a test's asynq server ran: each task's runs and the
// headers of its last run.
type runLog struct {
	srv     *asynq.Server
	mu      sync.Mutex
	ran     map[string]int
	headers map[string]map[string]string
}

func (l *runLog) runs(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ran[id]
}

func (l *runLog) headersOf(id string) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.headers[id]
}

// retryServer starts a real asynq server on queue whose own forwarder
// polls once an hour: task "retry" fails its first try (into the retry
// set, an hour away), every other task succeeds. It stops with the test.
func retryServer(t *testing.T, client redis.UniversalClient, queue string) *runLog {
	l := &runLog{ran: map[string]int{}, headers: map[string]map[string]string{}}
	mux := asynq.NewServeMux()
	mux.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ran[id]++
		l.headers[id] = task.Headers()
		if id == "retry" && l.ran[id] == 1 {
			return errors.New("the first try fails")
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(client, asynq.Config{
		Queues:                   map[string]int{queue: 1},
		Concurrency:              4,
		TaskCheckInterval:        10 * time.Millisecond,
		DelayedTaskCheckInterval: time.Hour,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return time.Hour },
		LogLevel:                 asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	l.srv = srv
	return l
}
