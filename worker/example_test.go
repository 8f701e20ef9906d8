package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

func ExampleServer() {
	rdb, prefix, queueName, done := exampleEnv("ExampleServer")
	defer done()
	ctx := context.Background()

	// The fleet-wide limits of tenant "acme": 20 jobs/s, 2 at a time.
	limiter, err := throttle.NewLimiter(rdb, &throttle.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer limiter.Close()
	policy, _ := throttle.ParsePolicy("rate=20/s concurrency=2")
	if err := limiter.Policies().Set(ctx, "acme", policy); err != nil {
		panic(err)
	}

	srv, err := worker.New(rdb, &worker.Config{
		Limiter: limiter,
		Asynq:   asynq.Config{Queues: map[string]int{queueName: 1}, LogLevel: asynq.ErrorLevel},
	})
	if err != nil {
		panic(err)
	}
	var running, most atomic.Int64
	var wg sync.WaitGroup
	wg.Add(10)
	srv.HandleFunc("report", func(ctx context.Context, t *asynq.Task) error {
		// the job's work: here, counting how many run at once
		defer wg.Done()
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		return nil
	})
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	producer, err := queue.New(rdb, &queue.Config{Limiter: limiter})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	for i := 0; i < 10; i++ {
		if _, err := producer.Enqueue(ctx, "acme", asynq.NewTask("report", nil), asynq.Queue(queueName)); err != nil {
			panic(err)
		}
	}
	wg.Wait()
	fmt.Println("jobs done: 10")
	fmt.Println("at most 2 at once:", most.Load() <= 2)
	// Output:
	// jobs done: 10
	// at most 2 at once: true
}

// An application that already runs asynq adopts sluice in a few lines: the
// gate goes first on its ServeMux, and Configure wraps its asynq.Config
// hooks so that deferrals are neither failures nor reported as errors.
func ExampleGate() {
	rdb, prefix, queueName, done := exampleEnv("ExampleGate")
	defer done()
	ctx := context.Background()

	limiter, err := throttle.NewLimiter(rdb, &throttle.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer limiter.Close()
	policy, _ := throttle.ParsePolicy("rate=5/s")
	if err := limiter.Policies().Set(ctx, "acme", policy); err != nil {
		panic(err)
	}

	// The application's own asynq set-up, with its error reporting.
	var reported atomic.Int64
	cfg := asynq.Config{
		Queues:       map[string]int{queueName: 1},
		LogLevel:     asynq.ErrorLevel,
		ErrorHandler: asynq.ErrorHandlerFunc(func(context.Context, *asynq.Task, error) { reported.Add(1) }),
	}
	mux := asynq.NewServeMux()

	// sluice: a gate, its hooks, and its middleware first.
	gate, err := worker.NewGate(limiter, rdb, nil)
	if err != nil {
		panic(err)
	}
	gate.Configure(&cfg)
	mux.Use(gate.Middleware())

	var wg sync.WaitGroup
	wg.Add(10)
	mux.HandleFunc("email", func(ctx context.Context, t *asynq.Task) error {
		wg.Done()
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := srv.Start(mux); err != nil {
		panic(err)
	}

	// 10 jobs at once, 5/s allowed: each goes to asynq at its slot, from
	// acme's line in the waiting room (the pump Configure started hands it
	// over) unless it could go straight; MaxRetry(0) or not, none is
	// archived or lost.
	producer, err := queue.New(rdb, &queue.Config{Limiter: limiter})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	for i := 0; i < 10; i++ {
		if _, err := producer.Enqueue(ctx, "acme", asynq.NewTask("email", nil), asynq.Queue(queueName), asynq.MaxRetry(0)); err != nil {
			panic(err)
		}
	}
	wg.Wait()
	gate.Stop()
	srv.Shutdown()
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(queueName)
	if err != nil {
		panic(err)
	}
	fmt.Println("archived:", info.Archived, "errors reported:", reported.Load())
	// Output:
	// archived: 0 errors reported: 0
}

func ExampleRetryAfter() {
	rdb, prefix, queueName, done := exampleEnv("ExampleRetryAfter")
	defer done()
	ctx := context.Background()

	srv, err := worker.New(rdb, &worker.Config{
		Prefix: prefix,
		Asynq:  asynq.Config{Queues: map[string]int{queueName: 1}, LogLevel: asynq.ErrorLevel},
	})
	if err != nil {
		panic(err)
	}
	finished := make(chan struct{})
	var calls atomic.Int64
	srv.HandleFunc("sync", func(ctx context.Context, t *asynq.Task) error {
		retried, _ := asynq.GetRetryCount(ctx)
		if calls.Add(1) == 1 {
			fmt.Println("attempt 1: the downstream says 429, retry in 300ms")
			// Pauses tenant "acme" and defers this job, without using a retry.
			return worker.RetryAfter(300*time.Millisecond, errors.New("429 Too Many Requests"))
		}
		fmt.Println("attempt 2: done, retries used:", retried)
		close(finished)
		return nil
	})
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	producer, err := queue.New(rdb, &queue.Config{Limiter: srv.Limiter()})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	if _, err := producer.Enqueue(ctx, "acme", asynq.NewTask("sync", nil), asynq.Queue(queueName), asynq.MaxRetry(0)); err != nil {
		panic(err)
	}
	<-finished
	// Output:
	// attempt 1: the downstream says 429, retry in 300ms
	// attempt 2: done, retries used: 0
}

func ExampleRegisterBuiltins() {
	rdb, prefix, queueName, done := exampleEnv("ExampleRegisterBuiltins")
	defer done()
	ctx := context.Background()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	defer api.Close()

	srv, err := worker.New(rdb, &worker.Config{
		Prefix: prefix,
		Asynq:  asynq.Config{Queues: map[string]int{queueName: 1}, LogLevel: asynq.ErrorLevel},
	})
	if err != nil {
		panic(err)
	}
	worker.RegisterBuiltins(srv, nil, 0) // "http" and "sleep"
	results := make(chan string, 2)
	srv.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			err := next.ProcessTask(ctx, t)
			results <- fmt.Sprintf("%s: %v", t.Type(), err)
			return err
		})
	})
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	producer, err := queue.New(rdb, &queue.Config{Limiter: srv.Limiter()})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	call, _ := json.Marshal(worker.HTTPRequest{Method: "POST", URL: api.URL, Body: `{"id":1}`, TimeoutMS: 5000})
	nap, _ := json.Marshal(worker.SleepRequest{MS: 10})
	for _, task := range []*asynq.Task{asynq.NewTask(worker.TypeHTTP, call), asynq.NewTask(worker.TypeSleep, nap)} {
		if _, err := producer.Enqueue(ctx, "acme", task, asynq.Queue(queueName)); err != nil {
			panic(err)
		}
		fmt.Println(<-results)
	}
	// Output:
	// http: <nil>
	// sleep: <nil>
}

func ExampleParseSignal() {
	h := http.Header{}
	h.Set("RateLimit-Policy", `"default";q=100;w=60`)
	h.Set("RateLimit", `"default";r=0;t=10`)
	h.Set("X-RateLimit-Remaining", "lots") // malformed: ignored, counted
	sig := worker.ParseSignal(http.StatusOK, h, time.Now())
	fmt.Println(sig.Limit, sig.Window, sig.LimitFrom)
	fmt.Println(sig.Remaining, sig.Reset, sig.Exhausted())
	fmt.Println(sig.Malformed)

	h = http.Header{}
	h.Set("Retry-After", "120")
	fmt.Println(worker.ParseSignal(http.StatusTooManyRequests, h, time.Now()).RetryDelay())
	// Output:
	// 100 1m0s RateLimit-Policy
	// 0 10s true
	// [X-RateLimit-Remaining: lots]
	// 2m0s
}

func ExampleObserve() {
	rdb, prefix, queueName, done := exampleEnv("ExampleObserve")
	defer done()
	ctx := context.Background()
	// An API that allows 40 requests a second and says so on every answer.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("RateLimit-Policy", `"default";q=40;w=1`)
		w.Header().Set("RateLimit", `"default";r=39;t=1`)
		w.WriteHeader(http.StatusOK)
	}))
	defer api.Close()

	srv, err := worker.New(rdb, &worker.Config{
		Prefix: prefix,
		Asynq:  asynq.Config{Queues: map[string]int{queueName: 1}, LogLevel: asynq.ErrorLevel},
	})
	if err != nil {
		panic(err)
	}
	if err := srv.Limiter().Policies().Set(ctx, "acme", &throttle.Policy{Rates: []throttle.Rate{{Limit: 100, Period: time.Second, Burst: 5}}}); err != nil {
		panic(err)
	}
	seen := make(chan worker.Signal, 1)
	// A handler of its own: it calls the API and gives sluice the answer.
	srv.HandleFunc("sync", func(ctx context.Context, t *asynq.Task) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		sig := worker.Observe(ctx, resp) // acts for acme, fleet-wide
		seen <- sig
		if resp.StatusCode == http.StatusTooManyRequests {
			return worker.RetryAfter(sig.RetryDelay(), errors.New(resp.Status))
		}
		return nil
	})
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	producer, err := queue.New(rdb, &queue.Config{Limiter: srv.Limiter()})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	if _, err := producer.Enqueue(ctx, "acme", asynq.NewTask("sync", nil), asynq.Queue(queueName)); err != nil {
		panic(err)
	}
	sig := <-seen
	fmt.Println("declared:", sig.Limit, "per", sig.Window)
	st, err := srv.Limiter().Stats(ctx, "acme")
	if err != nil {
		panic(err)
	}
	fmt.Println("policy:", st.Rules, "| learned:", st.Learned.Rate(), "as", st.Learned.Rule)
	// Output:
	// declared: 40 per 1s
	// policy: rate=100/s burst=5 | learned: 40/s as rate[1]
}

// Tokens of an LLM API, per minute and per day: a job is admitted on an
// estimate of its tokens (queue.Cost) and settled to what the API says it
// used (usage.total_tokens), so the budgets count the tokens spent.
func ExampleHTTPHandler_usage() {
	rdb, prefix, queueName, done := exampleEnv("ExampleHTTPHandler_usage")
	defer done()
	ctx := context.Background()
	// an LLM API: each answer says how many tokens the call used
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"choices": [], "usage": {"total_tokens": %s}}`, r.URL.Query().Get("used"))
	}))
	defer api.Close()

	limiter, err := throttle.NewLimiter(rdb, &throttle.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer limiter.Close()
	// tokens=: a rate and a quota counted in tokens
	policy, _ := throttle.ParsePolicy("rate=90000/min burst=20000 quota=1000000/day")
	if err := limiter.Policies().Set(ctx, "acme", policy); err != nil {
		panic(err)
	}
	srv, err := worker.New(rdb, &worker.Config{
		Limiter: limiter,
		Asynq:   asynq.Config{Queues: map[string]int{queueName: 1}, LogLevel: asynq.ErrorLevel},
	})
	if err != nil {
		panic(err)
	}
	// the actual cost of each call is its answer's usage.total_tokens
	srv.Handle(worker.TypeHTTP, &worker.HTTPHandler{UsageJSON: "usage.total_tokens"})
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	client, err := queue.New(rdb, &queue.Config{Limiter: limiter})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	for _, used := range []int{1200, 350, 2900} {
		payload, _ := json.Marshal(worker.HTTPRequest{Method: "POST", URL: fmt.Sprintf("%s/v1/chat/completions?used=%d", api.URL, used)})
		// admitted on an estimate of 4,000 tokens
		if _, err := client.Enqueue(ctx, "acme", asynq.NewTask(worker.TypeHTTP, payload), asynq.Queue(queueName), queue.Cost(4000)); err != nil {
			panic(err)
		}
	}

	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := limiter.Stats(ctx, "acme"); err == nil && st.Quota != nil && st.Quota.Used == 4450 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := limiter.Stats(ctx, "acme")
	if err != nil {
		panic(err)
	}
	fmt.Println("tokens counted today:", st.Quota.Used)
	fmt.Println("refunded:", st.Refunded)
	// Output:
	// tokens counted today: 4450
	// refunded: 7550
}
