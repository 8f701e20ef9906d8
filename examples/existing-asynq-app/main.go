// Command existing-asynq-app is an application that already runs asynq and
// adopts sluice's gate in a few lines: its producers add the tenant header,
// and its worker puts the gate first on its ServeMux and lets
// Gate.Configure wrap its asynq.Config hooks. Everything else (its
// handlers, its ErrorHandler, its retry delays) stays as it was.
//
//	go run ./examples/existing-asynq-app [--short] [--redis URL]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/examples/internal/demo"
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
		fmt.Fprintln(os.Stderr, "existing-asynq-app:", err)
		os.Exit(1)
	}
	if !res.ok() {
		os.Exit(1)
	}
}

// result is what the run measured.
type result struct {
	emails, reports   int
	emailSpan         time.Duration // first to last start of acme's emails
	emailRate         float64
	reportsAtOnce     int64
	archived          int
	errorsReported    int64
	retriesUsed       int
	rateLimit, concOK bool
}

func (r result) ok() bool {
	return r.rateLimit && r.concOK && r.archived == 0 && r.errorsReported == 0 && r.retriesUsed == 0
}

func run(ctx context.Context, redisURL string, short bool, out io.Writer) (result, error) {
	out = demo.SyncWriter(out)
	env, err := demo.Start(ctx, redisURL, "existing-app")
	if err != nil {
		return result{}, err
	}
	defer env.Close()
	rdb := env.Client()
	res := result{emails: 20, reports: 6}
	if short {
		res.emails, res.reports = 8, 3
	}

	// The limits, set once by an operator (sluice policy set ...).
	limiter, err := throttle.NewLimiter(rdb, &throttle.Config{Prefix: env.Prefix})
	if err != nil {
		return res, err
	}
	defer limiter.Close()
	for tenant, text := range map[string]string{"acme": "rate=5/s", "globex": "concurrency=1"} {
		p, err := throttle.ParsePolicy(text)
		if err != nil {
			return res, err
		}
		if err := limiter.Policies().Set(ctx, tenant, p); err != nil {
			return res, err
		}
	}

	// ---- The application's worker, as it was ----
	var reported atomic.Int64
	cfg := asynq.Config{
		Queues:   map[string]int{env.Queue: 1},
		LogLevel: asynq.FatalLevel,
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			reported.Add(1) // the app's error reporting
		}),
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration { return 10 * time.Second },
	}
	mux := asynq.NewServeMux()

	// ---- sluice: three lines ----
	gate, err := worker.NewGate(limiter, rdb, nil)
	if err != nil {
		return res, err
	}
	gate.Configure(&cfg)
	mux.Use(gate.Middleware())
	// ----

	start := time.Now()
	var (
		mu                sync.Mutex
		emailStarts       []time.Duration
		reports, atOnce   atomic.Int64
		retried           int
		wg                sync.WaitGroup
		emailsDone, rDone atomic.Int64
	)
	wg.Add(res.emails + res.reports)
	mux.HandleFunc("email:send", func(ctx context.Context, t *asynq.Task) error {
		defer wg.Done()
		n, _ := asynq.GetRetryCount(ctx)
		at := time.Since(start)
		mu.Lock()
		emailStarts = append(emailStarts, at)
		retried += n
		mu.Unlock()
		fmt.Fprintf(out, "  %5.2fs  acme    email #%d starts\n", at.Seconds(), emailsDone.Add(1))
		return nil
	})
	mux.HandleFunc("report:build", func(ctx context.Context, t *asynq.Task) error {
		defer wg.Done()
		n := reports.Add(1)
		defer reports.Add(-1)
		for m := atOnce.Load(); n > m && !atOnce.CompareAndSwap(m, n); m = atOnce.Load() {
		}
		fmt.Fprintf(out, "  %5.2fs  globex  report #%d starts (%d running)\n", time.Since(start).Seconds(), rDone.Add(1), n)
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := srv.Start(mux); err != nil {
		return res, err
	}

	// ---- The application's producer: the tenant goes in a header ----
	client := asynq.NewClientFromRedisClient(rdb)
	fmt.Fprintf(out, "An asynq app with sluice's gate, on %s. All at once, with MaxRetry(0):\n", env.Where)
	fmt.Fprintf(out, "%d emails for acme (policy rate=5/s) and %d reports for globex (concurrency=1).\n\n", res.emails, res.reports)
	enqueue := func(typ, tenant string) error {
		task := asynq.NewTaskWithHeaders(typ, nil, map[string]string{taskspec.TenantHeader: tenant})
		_, err := client.Enqueue(task, asynq.Queue(env.Queue), asynq.MaxRetry(0))
		return err
	}
	for i := 0; i < max(res.emails, res.reports); i++ {
		if i < res.emails {
			if err := enqueue("email:send", "acme"); err != nil {
				return res, err
			}
		}
		if i < res.reports {
			if err := enqueue("report:build", "globex"); err != nil {
				return res, err
			}
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		return res, errors.New("the jobs did not all run within 60s")
	}
	gate.Stop()
	srv.Shutdown()
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(env.Queue)
	if err != nil {
		return res, err
	}

	sort.Slice(emailStarts, func(i, j int) bool { return emailStarts[i] < emailStarts[j] })
	res.emailSpan = emailStarts[len(emailStarts)-1] - emailStarts[0]
	res.emailRate = float64(len(emailStarts)-1) / res.emailSpan.Seconds()
	res.reportsAtOnce = atOnce.Load()
	res.archived = info.Archived
	res.errorsReported = reported.Load()
	res.retriesUsed = retried
	// the limit holds: never faster than 5/s (a loaded machine, whose
	// timers wake a job a few ms past its slot, may start it later and
	// run slower; the run's rate is printed)
	res.rateLimit = res.emailRate <= 5*1.05
	res.concOK = res.reportsAtOnce == 1

	fmt.Fprintf(out, "\nacme:   %d emails in %.2fs: %.1f/s (policy 5/s)\n", res.emails, res.emailSpan.Seconds(), res.emailRate)
	fmt.Fprintf(out, "globex: at most %d report running at a time (policy concurrency=1)\n", res.reportsAtOnce)
	fmt.Fprintf(out, "archived: %d; retries used: %d; errors seen by the app's ErrorHandler: %d\n", res.archived, res.retriesUsed, res.errorsReported)
	fmt.Fprintln(out, "(jobs over their limits were held in the worker or deferred, not failed: MaxRetry(0) did not matter)")
	return res, nil
}
