package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/worker"
)

func TestHTTPHandler(t *testing.T) {
	t.Parallel()
	var got struct {
		method, body, header string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.method, got.body, got.header = r.Method, string(b), r.Header.Get("X-Key")
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusNoContent)
		case "/slow-down":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
		case "/unavailable":
			w.Header().Set("Retry-After", time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/busy":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/broken":
			http.Error(w, "database on fire", http.StatusInternalServerError)
		case "/sleep":
			time.Sleep(200 * time.Millisecond)
		default:
			http.Error(w, "no such thing", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	h := &worker.HTTPHandler{Client: srv.Client()}
	call := func(req worker.HTTPRequest) error {
		p, err := json.Marshal(req)
		require.NoError(t, err)
		return h.ProcessTask(context.Background(), asynq.NewTask(worker.TypeHTTP, p))
	}

	require.NoError(t, call(worker.HTTPRequest{Method: "POST", URL: srv.URL + "/ok", Body: "hello", Headers: map[string]string{"X-Key": "k1"}}))
	require.Equal(t, "POST", got.method)
	require.Equal(t, "hello", got.body)
	require.Equal(t, "k1", got.header)
	require.NoError(t, call(worker.HTTPRequest{URL: srv.URL + "/ok"}))
	require.Equal(t, "GET", got.method)

	var ra *worker.RetryAfterError
	require.ErrorAs(t, call(worker.HTTPRequest{URL: srv.URL + "/slow-down"}), &ra)
	require.Equal(t, 7*time.Second, ra.Delay)
	require.ErrorAs(t, call(worker.HTTPRequest{URL: srv.URL + "/unavailable"}), &ra)
	require.InDelta(t, 90*time.Second, ra.Delay, float64(2*time.Second))
	require.ErrorAs(t, call(worker.HTTPRequest{URL: srv.URL + "/busy"}), &ra)
	require.Equal(t, worker.RetryAfterDefault, ra.Delay)

	err := call(worker.HTTPRequest{URL: srv.URL + "/broken"})
	require.Error(t, err)
	require.NotErrorIs(t, err, asynq.SkipRetry, "a 5xx is retried")
	require.Contains(t, err.Error(), "status 500: database on fire")

	err = call(worker.HTTPRequest{URL: srv.URL + "/missing"})
	require.ErrorIs(t, err, asynq.SkipRetry, "a 4xx is archived")
	require.Contains(t, err.Error(), "status 404")

	err = call(worker.HTTPRequest{URL: srv.URL + "/sleep", TimeoutMS: 20})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, asynq.SkipRetry, "a timeout is retried")

	for _, payload := range []string{`not json`, `{"method":"GET"}`, `{"url":"http://x","timeout_ms":-1}`, `{"url":"::bad"}`} {
		err := h.ProcessTask(context.Background(), asynq.NewTask(worker.TypeHTTP, []byte(payload)))
		require.ErrorIs(t, err, asynq.SkipRetry, payload)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		value string
		want  time.Duration
	}{
		{"", worker.RetryAfterDefault},
		{"3", 3 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"0", worker.RetryAfterDefault},
		{"-5", worker.RetryAfterDefault},
		{"soon", worker.RetryAfterDefault},
		{"99999999", worker.RetryAfterMax},
		{"Sat, 01 Mar 2025 12:00:30 GMT", 30 * time.Second},
		{"Sat, 01 Mar 2025 11:59:00 GMT", worker.RetryAfterDefault},
		{"Sun, 02 Mar 2025 12:00:00 GMT", worker.RetryAfterMax},
	}
	for _, c := range cases {
		require.Equal(t, c.want, worker.ParseRetryAfter(c.value, now), "%q", c.value)
	}
}

func TestSleepHandler(t *testing.T) {
	t.Parallel()
	start := time.Now()
	require.NoError(t, worker.SleepHandler(context.Background(), asynq.NewTask(worker.TypeSleep, []byte(`{"ms":30}`))))
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, worker.SleepHandler(ctx, asynq.NewTask(worker.TypeSleep, []byte(`{"ms":60000}`))), context.Canceled)

	for _, payload := range []string{`nope`, `{"ms":-1}`} {
		err := worker.SleepHandler(context.Background(), asynq.NewTask(worker.TypeSleep, []byte(payload)))
		require.True(t, errors.Is(err, asynq.SkipRetry), payload)
	}
}
