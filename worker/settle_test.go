package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// usageAPI answers like an LLM API: {"usage": {"total_tokens": N}} with N
// from the request's query, and counts the tokens it served.
type usageAPI struct {
	served atomic.Int64
}

func (a *usageAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("tokens"), 10, 64)
	if err != nil {
		// an answer whose usage is unreadable
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"usage": {"total_tokens": "lots"}}`))
		return
	}
	a.served.Add(n)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"usage": map[string]any{"total_tokens": n}})
}

// TestSettleFromUsage: jobs admitted on an estimate of 500 tokens, run by
// the http handler against a real API answering its usage in JSON, are
// settled to what they used: the tenant's window and quota meters end at
// the sum of the actual costs, and the refunds are counted.
func TestSettleFromUsage(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "window=100000/min quota=1000000/day")
	api := &usageAPI{}
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	srv := e.server(t, nil)
	srv.Handle(worker.TypeHTTP, &worker.HTTPHandler{UsageJSON: "usage.total_tokens"})
	require.NoError(t, srv.Start())

	const n, estimate = 20, 500
	want, refunded, extra := int64(0), int64(0), int64(0)
	ctx := context.Background()
	for i := range n {
		tokens := int64(10 + 37*i) // 10 to 713: most cheaper than estimated, a few dearer
		want += tokens
		refunded += max(estimate-tokens, 0)
		extra += max(tokens-estimate, 0)
		payload, err := json.Marshal(worker.HTTPRequest{URL: fmt.Sprintf("%s/v1/chat?tokens=%d", ts.URL, tokens)})
		require.NoError(t, err)
		_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask(worker.TypeHTTP, payload), asynq.Queue(e.queue), queue.Cost(estimate))
		require.NoError(t, err)
	}
	// one more whose answer's usage is unreadable: it keeps its estimate
	payload, err := json.Marshal(worker.HTTPRequest{URL: ts.URL + "/v1/chat"})
	require.NoError(t, err)
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask(worker.TypeHTTP, payload), asynq.Queue(e.queue), queue.Cost(estimate))
	require.NoError(t, err)

	eventually(t, 20*time.Second, func() bool {
		return e.queueInfo(t).Processed == n+1
	}, "%d jobs done", n+1)
	require.Equal(t, want, api.served.Load())
	// settled before each job completes: the meters hold the actual costs
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, want+estimate, st.Quota.Used, "quota: the sum of the actual costs, and the estimate of the unreadable one")
	require.Equal(t, want+estimate, st.Window.Started, "window's started entries")
	require.Equal(t, want+estimate, st.Window.Planned, "window's planned entries")
	require.Equal(t, refunded, st.Refunded)
	require.Equal(t, extra, st.Extra)
	g := srv.Gate().Gatherer()
	require.Equal(t, float64(refunded), metric(t, g, "sluice_worker_settled_cost_total", map[string]string{"direction": "refund"}))
	require.Equal(t, float64(extra), metric(t, g, "sluice_worker_settled_cost_total", map[string]string{"direction": "extra"}))
	require.Equal(t, 1.0, metric(t, g, "sluice_worker_errors_total", map[string]string{"kind": "usage"}))
}

// TestSettleCost: a handler reports its cost with SettleCost (dearer: an
// extra charge into debt that holds the next start back), and a failed job
// is refunded with RefundFailed.
func TestSettleCost(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "acme", "quota=100/day")
	var outside error
	srv := e.server(t, func(c *worker.Config) { c.Gate.RefundFailed = true })
	srv.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
		switch string(task.Payload()) {
		case "dear":
			return worker.SettleCost(ctx, 130)
		case "negative":
			if err := worker.SettleCost(ctx, -1); err == nil {
				return fmt.Errorf("SettleCost(-1) took a negative cost")
			}
			return nil
		}
		return fmt.Errorf("failed before the downstream counted it: %w", asynq.SkipRetry)
	})
	outside = worker.SettleCost(context.Background(), 3)
	require.ErrorContains(t, outside, "not a job's that the gate admitted")
	require.NoError(t, srv.Start())
	ctx := context.Background()
	for _, p := range []string{"fail", "negative"} {
		_, err := e.q.Enqueue(ctx, "acme", asynq.NewTask("job", []byte(p)), asynq.Queue(e.queue), queue.Cost(10), asynq.MaxRetry(0))
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, func() bool {
		info := e.queueInfo(t)
		return info.Processed == 2
	}, "two jobs done")
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(10), st.Quota.Used, "the failed job refunded; the one whose report was refused keeps its estimate")
	_, err = e.q.Enqueue(ctx, "acme", asynq.NewTask("job", []byte("dear")), asynq.Queue(e.queue), queue.Cost(10))
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool {
		st, err := e.lim.Stats(ctx, "acme")
		return err == nil && st.Quota.Used == 140
	}, "the dear job's 130 charged")
	d, err := e.lim.Do(ctx, throttle.Request{Tenant: "acme", ID: "probe", DryRun: true})
	require.NoError(t, err)
	require.False(t, d.Allowed, "in debt for the day")
	require.Equal(t, "quota", d.Rule)
}
