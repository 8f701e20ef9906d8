package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// Task types of the built-in handlers.
const (
	TypeHTTP  = "http"
	TypeSleep = "sleep"
)

// Defaults of the built-in handlers.
const (
	// HTTPTimeoutDefault bounds a request whose payload gives no timeout_ms.
	HTTPTimeoutDefault = 30 * time.Second
	// RetryAfterDefault is the cooldown after a 429 or 503 whose
	// Retry-After header is absent, unreadable or not in the future.
	RetryAfterDefault = time.Second
	// RetryAfterMax caps the cooldown a downstream can ask for.
	RetryAfterMax = time.Hour
)

// HTTPRequest is the payload of an "http" task.
type HTTPRequest struct {
	// Method defaults to GET.
	Method  string            `json:"method,omitempty"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
	// TimeoutMS bounds the request; HTTPTimeoutDefault when 0.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// UsageHeader and UsageJSON say where a 2xx answer gives the job's
	// actual cost, settled after the job (SettleCost): a response header
	// ("X-Usage-Tokens") or a field of its JSON body, a dot-separated path
	// ("usage.total_tokens", as LLM APIs answer). They override the
	// handler's own; empty: the handler's.
	UsageHeader string `json:"usage_header,omitempty"`
	UsageJSON   string `json:"usage_json,omitempty"`
}

// SleepRequest is the payload of a "sleep" task.
type SleepRequest struct {
	MS int64 `json:"ms"`
}

// HTTPHandler makes the request an "http" task describes: a 2xx answer
// completes the job; 429 and 503 pause the tenant for the Retry-After the
// downstream asked for (seconds or an HTTP date; else the quota's reset
// when the response says none remains; else RetryAfterDefault) and defer
// the job (RetryAfter) — except that a tenant whose policy adapts
// (adapt=) is not paused when the downstream named no delay: its adaptive
// limit's cut answers the 429 instead; other 5xx answers and network errors are retried
// as usual; other answers (4xx, unfollowed 3xx) archive the job
// (asynq.SkipRetry), as does a payload that cannot be read.
//
// Every answer, a 2xx too, is read for the downstream's rate-limit signals
// (Observe): remaining 0 with a reset pauses the tenant until the reset,
// and a declared limit below the tenant's policy is learned by the fleet.
//
// A job's actual cost may come with the answer (UsageHeader, UsageJSON,
// here or in the task's payload): a 2xx answer's value is settled as the
// job's cost (SettleCost). A value that is missing or not a whole number of
// at least 0 changes nothing: the job keeps its estimate, and it is
// counted and logged once.
type HTTPHandler struct {
	// Client makes the requests; http.DefaultClient when nil.
	Client *http.Client
	// UsageHeader names a response header whose value is the job's actual
	// cost (e.g. "X-Usage-Tokens"), for tasks whose payload names none.
	UsageHeader string
	// UsageJSON is the path of a field of the JSON response body whose
	// value is the job's actual cost (e.g. "usage.total_tokens"), for
	// tasks whose payload names none. The body is read up to 1 MiB.
	UsageJSON string
}

// usageBodyMax bounds the response body read for its usage.
const usageBodyMax = 1 << 20

// ProcessTask implements asynq.Handler.
func (h *HTTPHandler) ProcessTask(ctx context.Context, task *asynq.Task) error {
	var req HTTPRequest
	if err := json.Unmarshal(task.Payload(), &req); err != nil {
		return fmt.Errorf("http task: payload is not {\"method\",\"url\",\"headers\",\"body\",\"timeout_ms\"} JSON: %v: %w", err, asynq.SkipRetry)
	}
	if req.URL == "" {
		return fmt.Errorf("http task: payload has no url: %w", asynq.SkipRetry)
	}
	if req.TimeoutMS < 0 {
		return fmt.Errorf("http task: timeout_ms %d must not be negative: %w", req.TimeoutMS, asynq.SkipRetry)
	}
	timeout := HTTPTimeoutDefault
	if req.TimeoutMS > 0 {
		timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	var body io.Reader
	if req.Body != "" {
		body = strings.NewReader(req.Body)
	}
	hreq, err := http.NewRequestWithContext(ctx, method, req.URL, body)
	if err != nil {
		return fmt.Errorf("http task: %v: %w", err, asynq.SkipRetry)
	}
	for k, v := range req.Headers {
		hreq.Header.Set(k, v)
	}
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return fmt.Errorf("http task: %s %s: %w", method, req.URL, err)
	}
	defer resp.Body.Close()
	// Read a little of the answer for the error message (all of it, up to
	// a bound, when its usage is in the body), and drain the rest (bounded)
	// so the connection can be reused.
	usageHeader, usageJSON := cmp.Or(req.UsageHeader, h.UsageHeader), cmp.Or(req.UsageJSON, h.UsageJSON)
	read := int64(512)
	if usageJSON != "" {
		read = usageBodyMax
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, read))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		if usageHeader != "" {
			usage(ctx, resp.Header.Get(usageHeader), "header "+usageHeader)
		} else if usageJSON != "" {
			usage(ctx, jsonField(snippet, usageJSON), "JSON field "+usageJSON)
		}
		snippet = snippet[:min(len(snippet), 512)]
	}
	sig := Observe(ctx, resp)
	code := resp.StatusCode
	status := fmt.Sprintf("http task: %s %s: status %d", method, req.URL, code)
	if s := strings.TrimSpace(string(snippet)); s != "" && (code < 200 || code > 299) {
		status += ": " + s
	}
	switch {
	case code >= 200 && code <= 299:
		return nil
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		return &RetryAfterError{Delay: sig.RetryDelay(), Err: errors.New(status), guessed: sig.RetryAfter < 0 && !sig.Exhausted()}
	case code >= 500:
		return errors.New(status)
	default:
		return fmt.Errorf("%s (retrying would get the same answer): %w", status, asynq.SkipRetry)
	}
}

// ParseRetryAfter reads a Retry-After header value: delay-seconds or an
// HTTP date relative to now. It returns RetryAfterDefault when the value is
// absent, unreadable or not in the future, and at most RetryAfterMax.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	d := time.Duration(0)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n > int64(RetryAfterMax/time.Second) {
			return RetryAfterMax
		}
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	if d <= 0 {
		return RetryAfterDefault
	}
	return min(d, RetryAfterMax)
}

// SleepHandler handles "sleep" tasks: it waits the payload's ms (a
// stand-in for work in trials and load tests), or until the job's context
// ends.
func SleepHandler(ctx context.Context, task *asynq.Task) error {
	var req SleepRequest
	if err := json.Unmarshal(task.Payload(), &req); err != nil {
		return fmt.Errorf("sleep task: payload is not {\"ms\":N} JSON: %v: %w", err, asynq.SkipRetry)
	}
	if req.MS < 0 {
		return fmt.Errorf("sleep task: ms %d must not be negative: %w", req.MS, asynq.SkipRetry)
	}
	t := time.NewTimer(time.Duration(req.MS) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Mux is where handlers are registered: *Server and *asynq.ServeMux.
type Mux interface {
	Handle(pattern string, h asynq.Handler)
}

// RegisterBuiltins registers the built-in handlers on mux: "http" and
// "sleep". The http handler uses client, or when it is nil a client that
// keeps up to maxConns idle connections per host (0: 100), so a worker
// running many calls to one API reuses its connections.
func RegisterBuiltins(mux Mux, client *http.Client, maxConns int) {
	if client == nil {
		client = NewHTTPClient(maxConns)
	}
	mux.Handle(TypeHTTP, &HTTPHandler{Client: client})
	mux.Handle(TypeSleep, asynq.HandlerFunc(SleepHandler))
}

// NewHTTPClient returns a client for the http handler that keeps up to
// maxConns idle connections per host (0: 100).
func NewHTTPClient(maxConns int) *http.Client {
	if maxConns <= 0 {
		maxConns = 100
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = max(t.MaxIdleConns, maxConns)
	t.MaxIdleConnsPerHost = maxConns
	return &http.Client{Transport: t}
}
