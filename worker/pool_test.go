package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
)

// TestPoolSharesADownstream: two tenants whose own policies would let them
// call a strict downstream (20/s, burst 2) far faster than it allows share
// it through a pool (@api rate=18/s concurrency=4), on two workers: the
// pool sets the pace, the downstream refuses none of their calls, and every
// pool slot is given back.
func TestPoolSharesADownstream(t *testing.T) {
	e := setup(t, nil)
	e.policy(t, "acme", "rate=100/s burst=10")
	e.policy(t, "globex", "rate=100/s burst=10")
	e.policy(t, "@api", "rate=18/s burst=1 concurrency=4")
	ds := &strictDownstream{rate: 20, burst: 2, blind: true}
	api := httptest.NewServer(ds)
	defer api.Close()
	var done, refused atomic.Int64
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		code, err := get(ctx, api.URL)
		if err != nil {
			return err
		}
		if code == http.StatusTooManyRequests {
			refused.Add(1)
		}
		done.Add(1)
		return nil
	})
	for range 2 {
		srv := e.server(t, nil)
		srv.Handle("call", handler)
		require.NoError(t, srv.Start())
	}
	const perTenant = 30
	start := time.Now()
	for i := range perTenant {
		for _, tenant := range []string{"acme", "globex"} {
			info, err := e.q.Enqueue(context.Background(), tenant, asynq.NewTask("call", nil), asynq.Queue(e.queue), queue.Pools("@api"), asynq.TaskID(fmt.Sprintf("%s-%d", tenant, i)))
			require.NoError(t, err)
			require.Equal(t, "@api", info.Headers[taskspec.PoolsHeader])
		}
	}
	eventually(t, 60*time.Second, func() bool { return done.Load() == 2*perTenant }, "all %d calls made (%d)", 2*perTenant, done.Load())
	took := time.Since(start)
	t.Logf("%d calls through @api in %s (%.1f/s), %d refused by the downstream", 2*perTenant, took.Round(time.Millisecond), float64(2*perTenant)/took.Seconds(), refused.Load())
	require.Zero(t, refused.Load(), "calls the downstream refused")
	// the pool, not the tenants' own rates, set the pace
	require.Greater(t, took, (2*perTenant-2)*time.Second/18*9/10)
	// (a job's slots go back after its handler returns, so the last
	// call's may still be held the moment it is counted)
	eventually(t, 10*time.Second, func() bool {
		st, err := e.lim.Stats(context.Background(), "@api")
		require.NoError(t, err)
		return st.Concurrency.InFlight == 0
	}, "every job gave its pool slot back")
}

// get calls url and answers its status code.
func get(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
