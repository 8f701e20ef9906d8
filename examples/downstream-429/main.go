// Command downstream-429 shows sluice respecting a downstream's own limits:
// an HTTP API answers 429 Too Many Requests with Retry-After when a tenant
// goes over its limit, and sluice's built-in http handler turns that into a
// cooldown: the whole tenant pauses for the Retry-After, the job is
// deferred (not failed, no retry used), and other tenants carry on.
//
//	go run ./examples/downstream-429 [--short] [--redis URL]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/examples/internal/demo"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

func main() {
	demo.Quiet()
	short := flag.Bool("short", false, "fewer jobs")
	redisURL := flag.String("redis", "", "use this Redis instead of an embedded one")
	flag.Parse()
	res, err := run(context.Background(), *redisURL, *short, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "downstream-429:", err)
		os.Exit(1)
	}
	if !res.ok() {
		os.Exit(1)
	}
}

// apiLimit is what the API really allows acme: requests per one-second
// window. sluice's policy says 10/s: the API's limit is lower than the
// operator thought.
const apiLimit = 2

// call is one request the API answered.
type call struct {
	at         time.Duration
	tenant     string
	status     int
	retryAfter int // seconds, on a 429
}

// api answers 429 with Retry-After once a tenant has made apiLimit requests
// in the current one-second window (other tenants are not limited). A
// tenant's windows are counted from its first request, so how late the
// first job starts does not decide whether the limit is reached.
type api struct {
	start time.Time
	mu    sync.Mutex
	calls []call
	first map[string]time.Duration // tenant → its first request
	count map[string]int64         // tenant and window → requests
	done  map[string]bool          // job ids answered 200
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant, job := r.Header.Get("X-Tenant"), r.Header.Get("X-Job")
	a.mu.Lock()
	defer a.mu.Unlock()
	at := time.Since(a.start)
	first, ok := a.first[tenant]
	if !ok {
		first = at
		a.first[tenant] = at
	}
	window := int64((at - first) / time.Second)
	key := tenant + "@" + strconv.FormatInt(window, 10)
	if tenant == "acme" && a.count[key] >= apiLimit {
		left := first + time.Duration(window+1)*time.Second - at
		ra := int(math.Ceil(left.Seconds()))
		a.calls = append(a.calls, call{at: at, tenant: tenant, status: http.StatusTooManyRequests, retryAfter: ra})
		w.Header().Set("Retry-After", strconv.Itoa(ra))
		http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
		return
	}
	a.count[key]++
	a.done[job] = true
	a.calls = append(a.calls, call{at: at, tenant: tenant, status: http.StatusOK})
	w.WriteHeader(http.StatusOK)
}

type result struct {
	acme, other       int // jobs
	acmeDone, oDone   int
	rejected          int // 429s
	duringPause       int // acme requests the API saw while acme should have been paused
	archived, retried int
	otherLast         time.Duration // when other's last job ran
	acmeLast          time.Duration
}

func (r result) ok() bool {
	return r.acmeDone == r.acme && r.oDone == r.other && r.rejected > 0 && r.duringPause == 0 && r.archived == 0 && r.retried == 0
}

func run(ctx context.Context, redisURL string, short bool, out io.Writer) (result, error) {
	res := result{acme: 15, other: 10}
	if short {
		res.acme, res.other = 7, 4
	}
	env, err := demo.Start(ctx, redisURL, "downstream-429")
	if err != nil {
		return res, err
	}
	defer env.Close()
	rdb := env.Client()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	a := &api{first: map[string]time.Duration{}, count: map[string]int64{}, done: map[string]bool{}}
	hs := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	defer http.DefaultClient.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/v1/sync"

	lim, err := throttle.NewLimiter(rdb, &throttle.Config{Prefix: env.Prefix})
	if err != nil {
		return res, err
	}
	defer lim.Close()
	p, err := throttle.ParsePolicy("rate=10/s")
	if err != nil {
		return res, err
	}
	if err := lim.Policies().Set(ctx, "acme", p); err != nil {
		return res, err
	}

	srv, err := worker.New(rdb, &worker.Config{
		Limiter: lim,
		Asynq:   asynq.Config{Queues: map[string]int{env.Queue: 1}, LogLevel: asynq.FatalLevel},
		Gate:    worker.GateConfig{Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		return res, err
	}
	worker.RegisterBuiltins(srv, nil, 0)
	var retried sync.Map
	srv.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			n, _ := asynq.GetRetryCount(ctx)
			if n > 0 {
				retried.Store(t.Headers()[taskspec.TenantHeader]+string(t.Payload()), n)
			}
			return next.ProcessTask(ctx, t)
		})
	})
	if err := srv.Start(); err != nil {
		return res, err
	}
	defer srv.Shutdown()

	producer, err := queue.New(rdb, &queue.Config{Limiter: lim})
	if err != nil {
		return res, err
	}
	defer producer.Close()
	fmt.Fprintf(out, "The API allows acme %d requests per second and answers 429 with Retry-After past that;\n", apiLimit)
	fmt.Fprintf(out, "sluice's policy for acme says rate=10/s. %d jobs for acme and %d for other, all at once,\n", res.acme, res.other)
	fmt.Fprintf(out, "with MaxRetry(0), on %s. Requests as the API saw them:\n\n", env.Where)
	var jobs []queue.Job
	for i := 0; i < max(res.acme, res.other); i++ {
		for _, t := range []struct {
			tenant string
			n      int
		}{{"acme", res.acme}, {"other", res.other}} {
			if i >= t.n {
				continue
			}
			payload, _ := json.Marshal(worker.HTTPRequest{Method: http.MethodPost, URL: url, TimeoutMS: 5000,
				Headers: map[string]string{"X-Tenant": t.tenant, "X-Job": fmt.Sprintf("%s-%d", t.tenant, i)}})
			jobs = append(jobs, queue.Job{Tenant: t.tenant, Task: asynq.NewTask(worker.TypeHTTP, payload),
				Options: []asynq.Option{asynq.Queue(env.Queue), asynq.MaxRetry(0)}})
		}
	}
	a.mu.Lock()
	a.start = time.Now()
	a.mu.Unlock()
	for _, r := range producer.EnqueueBatch(ctx, jobs) {
		if r.Err != nil {
			return res, r.Err
		}
	}

	deadline := time.Now().Add(time.Minute)
	for {
		a.mu.Lock()
		n := len(a.done)
		a.mu.Unlock()
		if n == res.acme+res.other {
			break
		}
		if time.Now().After(deadline) {
			return res, errors.New("the jobs did not all run within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv.Shutdown()
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(env.Queue)
	if err != nil {
		return res, err
	}
	res.archived = info.Archived
	retried.Range(func(any, any) bool { res.retried++; return true })

	a.mu.Lock()
	calls := append([]call(nil), a.calls...)
	a.mu.Unlock()
	sort.Slice(calls, func(i, j int) bool { return calls[i].at < calls[j].at })
	var pauseFrom, pauseUntil time.Duration
	for _, c := range calls {
		switch {
		case c.tenant == "other":
			res.oDone++
			res.otherLast = c.at
			continue
		case c.status == http.StatusTooManyRequests:
			res.rejected++
			fmt.Fprintf(out, "  %5.2fs  acme   429, Retry-After: %d  -> sluice pauses acme for %ds\n", c.at.Seconds(), c.retryAfter, c.retryAfter)
			// The pause starts as the worker reads the answer, a moment
			// after the API sent it.
			pauseFrom, pauseUntil = c.at+50*time.Millisecond, c.at+time.Duration(c.retryAfter)*time.Second
			continue
		case c.at > pauseFrom && c.at < pauseUntil:
			res.duringPause++
		}
		res.acmeDone++
		res.acmeLast = c.at
		fmt.Fprintf(out, "  %5.2fs  acme   200\n", c.at.Seconds())
	}
	fmt.Fprintf(out, "\nacme:  %d jobs done by %.1fs; the API answered 429 %d times, and acme sent %d requests while paused\n", res.acmeDone, res.acmeLast.Seconds(), res.rejected, res.duringPause)
	fmt.Fprintf(out, "other: %d jobs done by %.2fs, never paused\n", res.oDone, res.otherLast.Seconds())
	fmt.Fprintf(out, "archived: %d; retries used: %d (a deferral after a 429 is not a failure)\n", res.archived, res.retried)
	if !res.ok() {
		fmt.Fprintln(out, "UNEXPECTED: see above")
	}
	return res, nil
}
