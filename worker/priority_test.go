package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
)

// TestRoomPriority: a tenant's jobs of high priority, enqueued after its
// jobs of normal priority, start before them (in the order they came);
// its low ones start last; another tenant's jobs start in their own order,
// unaffected.
func TestRoomPriority(t *testing.T) {
	e := setup(t, nil)
	e.policy(t, "acme", "concurrency=1")
	e.policy(t, "other", "concurrency=1")
	var mu sync.Mutex
	order := map[string][]string{}
	srv := e.server(t, nil)
	srv.Handle("job", asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		tenant := task.Headers()[taskspec.TenantHeader]
		mu.Lock()
		order[tenant] = append(order[tenant], id)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return nil
	}))
	ctx := context.Background()
	enqueue := func(tenant, id string, p taskspec.Priority) {
		t.Helper()
		info, err := e.q.Enqueue(ctx, tenant, asynq.NewTask("job", nil), asynq.Queue(e.queue), asynq.TaskID(id), queue.Priority(p))
		require.NoError(t, err, id)
		if p != queue.Normal {
			require.Equal(t, p.String(), info.Headers[taskspec.PriorityHeader], id)
		}
	}
	// the lines fill before the worker starts: the fleet has no room yet,
	// so every job waits in its tenant's line
	var want []string
	for i := range 10 {
		enqueue("acme", fmt.Sprintf("a-low-%d", i), queue.Low)
	}
	for i := range 10 {
		enqueue("acme", fmt.Sprintf("a-normal-%d", i), queue.Normal)
		enqueue("other", fmt.Sprintf("o-%d", i), queue.Normal)
	}
	for i := range 5 {
		enqueue("acme", fmt.Sprintf("a-high-%d", i), queue.High)
	}
	require.NoError(t, srv.Start())
	eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order["acme"]) == 25 && len(order["other"]) == 10
	}, "all jobs done")
	mu.Lock()
	defer mu.Unlock()
	for i := range 5 {
		want = append(want, fmt.Sprintf("a-high-%d", i))
	}
	for i := range 10 {
		want = append(want, fmt.Sprintf("a-normal-%d", i))
	}
	for i := range 10 {
		want = append(want, fmt.Sprintf("a-low-%d", i))
	}
	require.Equal(t, want, order["acme"], "acme's jobs by priority:\n%s", strings.Join(order["acme"], " "))
	var others []string
	for i := range 10 {
		others = append(others, fmt.Sprintf("o-%d", i))
	}
	require.Equal(t, others, order["other"], "the other tenant's jobs in their order")
}
