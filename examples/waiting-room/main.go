// Command waiting-room shows sluice's waiting room against a noisy
// neighbour: a noisy tenant enqueues a large burst at once, and a small
// tenant's jobs, enqueued just after, wait behind it, or, with the waiting
// room, do not.
//
// Enqueued with asynq's own client, the whole burst sits in asynq's pending
// list, first in line; the workers must take every one of those jobs out,
// ask the gate, and defer it to its slot before they reach the small
// tenant's job. Enqueued with queue.Client, the burst waits in its tenant's
// line in Redis, and the pending list holds only jobs that may start now.
//
//	go run ./examples/waiting-room [--short] [--redis URL]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
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
	short := flag.Bool("short", false, "a smaller burst")
	redisURL := flag.String("redis", "", "use this Redis instead of an embedded one")
	flag.Parse()
	res, err := run(context.Background(), *redisURL, *short, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "waiting-room:", err)
		os.Exit(1)
	}
	if !res.ok() {
		os.Exit(1)
	}
}

// phase is one half of the demo: the same traffic, enqueued one way.
type phase struct {
	room    bool // through queue.Client and its waiting room
	pending int  // bulk jobs in the pending list when tiny's first job came
	waits   []time.Duration
}

func (p phase) median() time.Duration { return p.waits[len(p.waits)/2] }
func (p phase) worst() time.Duration  { return p.waits[len(p.waits)-1] }

type result struct{ plain, room phase }

// ok: with the waiting room the small tenant waits at most half as long.
func (r result) ok() bool { return r.room.median()*2 < r.plain.median() }

// sizes of the demo.
type sizes struct {
	bulk      int           // jobs of the noisy tenant's burst
	tiny      int           // jobs of the small tenant
	tinyEvery time.Duration // between the small tenant's jobs
}

func run(ctx context.Context, redisURL string, short bool, out io.Writer) (result, error) {
	sz := sizes{bulk: 2000, tiny: 10, tinyEvery: 200 * time.Millisecond}
	if redisURL != "" {
		// A real Redis serves the workers faster than the embedded one: it
		// takes a larger burst to show the queueing.
		sz.bulk = 20000
	}
	if short {
		sz = sizes{bulk: 1500, tiny: 5, tinyEvery: 200 * time.Millisecond}
	}
	var res result
	fmt.Fprintf(out, "The noisy tenant \"bulk\" (rate=50/s) enqueues %d jobs at once; right after, the small\n", sz.bulk)
	fmt.Fprintf(out, "tenant \"tiny\" (no limit) enqueues a job every %s. How long does tiny wait to start?\n\n", sz.tinyEvery)
	var err error
	for i, room := range []bool{false, true} {
		p, perr := runPhase(ctx, redisURL, room, sz, i)
		if perr != nil {
			return res, perr
		}
		how := "asynq's own client:"
		if room {
			res.room, how = p, "queue.Client:"
		} else {
			res.plain = p
		}
		fmt.Fprintf(out, "enqueued with %-19s tiny waited %5.2fs (median), %5.2fs (worst); bulk jobs in the pending list: %d\n",
			how, p.median().Seconds(), p.worst().Seconds(), p.pending)
	}
	fmt.Fprintln(out)
	if res.ok() {
		fmt.Fprintln(out, "Through queue.Client, bulk's jobs waited in their own line in Redis instead of in asynq's")
		fmt.Fprintln(out, "pending list, so tiny's jobs were next in line as soon as they were enqueued.")
	} else {
		fmt.Fprintln(out, "UNEXPECTED: the waiting room did not halve tiny's median wait.")
	}
	return res, err
}

func runPhase(ctx context.Context, redisURL string, room bool, sz sizes, n int) (phase, error) {
	ph := phase{room: room}
	env, err := demo.Start(ctx, redisURL, fmt.Sprintf("room%d", n))
	if err != nil {
		return ph, err
	}
	defer env.Close()
	rdb := env.Client()
	lim, err := throttle.NewLimiter(rdb, &throttle.Config{Prefix: env.Prefix})
	if err != nil {
		return ph, err
	}
	defer lim.Close()
	p, err := throttle.ParsePolicy("rate=50/s")
	if err != nil {
		return ph, err
	}
	if err := lim.Policies().Set(ctx, "bulk", p); err != nil {
		return ph, err
	}

	// One worker; tiny's jobs record how long they waited.
	var (
		mu       sync.Mutex
		enqueued = map[string]time.Time{}
		done     = make(chan struct{})
	)
	srv, err := worker.New(rdb, &worker.Config{
		Limiter: lim,
		Asynq:   asynq.Config{Queues: map[string]int{env.Queue: 1}, LogLevel: asynq.FatalLevel},
		Gate:    worker.GateConfig{Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		return ph, err
	}
	srv.HandleFunc("bulk", func(context.Context, *asynq.Task) error { return nil })
	srv.HandleFunc("tiny", func(ctx context.Context, t *asynq.Task) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		ph.waits = append(ph.waits, now.Sub(enqueued[string(t.Payload())]))
		if len(ph.waits) == sz.tiny {
			close(done)
		}
		return nil
	})
	if err := srv.Start(); err != nil {
		return ph, err
	}
	defer srv.Shutdown()

	producer, err := queue.New(rdb, &queue.Config{Limiter: lim})
	if err != nil {
		return ph, err
	}
	defer producer.Close()
	if room {
		jobs := make([]queue.Job, sz.bulk)
		for i := range jobs {
			jobs[i] = queue.Job{Tenant: "bulk", Task: asynq.NewTask("bulk", nil), Options: []asynq.Option{asynq.Queue(env.Queue)}}
		}
		for _, r := range producer.EnqueueBatch(ctx, jobs) {
			if r.Err != nil {
				return ph, r.Err
			}
		}
	} else {
		// an application's own producer: asynq's client and the tenant
		// header, 16 enqueues at a time as EnqueueBatch sends them
		ac := asynq.NewClientFromRedisClient(rdb)
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < sz.bulk; i += 16 {
					task := asynq.NewTaskWithHeaders("bulk", nil, map[string]string{taskspec.TenantHeader: "bulk"})
					if _, err := ac.EnqueueContext(ctx, task, asynq.Queue(env.Queue)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return ph, err
		}
	}
	if info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(env.Queue); err == nil {
		ph.pending = info.Pending
	}
	for i := 0; i < sz.tiny; i++ {
		id := fmt.Sprint(i)
		mu.Lock()
		enqueued[id] = time.Now()
		mu.Unlock()
		if _, err := producer.Enqueue(ctx, "tiny", asynq.NewTask("tiny", []byte(id)), asynq.Queue(env.Queue)); err != nil {
			return ph, err
		}
		time.Sleep(sz.tinyEvery)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return ph, errors.New("tiny's jobs did not all run within 2 minutes")
	}
	mu.Lock()
	sort.Slice(ph.waits, func(i, j int) bool { return ph.waits[i] < ph.waits[j] })
	mu.Unlock()
	return ph, nil
}
