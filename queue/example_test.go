package queue_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

func ExampleClient_Enqueue() {
	rdb, prefix, queueName, done := exampleEnv("ExampleClient_Enqueue")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	// A job for tenant "acme" that counts as 3 requests against its limits
	// (a cost must fit the tenant's burst: see ExampleCost); asynq's
	// options pass through. No worker serves the queue yet, so the job
	// waits in acme's line until it may start.
	info, err := client.Enqueue(ctx, "acme", asynq.NewTask("email:send", []byte(`{"to":"ana@example.com"}`)),
		asynq.Queue(queueName), asynq.MaxRetry(5), queue.Cost(3))
	if err != nil {
		panic(err)
	}
	fmt.Println(info.State, info.MaxRetry)
	fmt.Println(info.Headers[taskspec.TenantHeader], info.Headers[taskspec.CostHeader])
	stats, err := client.Limiter().Stats(ctx, "acme")
	if err != nil {
		panic(err)
	}
	fmt.Println("waiting:", stats.Waiting)

	// Bad input is refused before anything is written.
	_, err = client.Enqueue(ctx, "", asynq.NewTask("email:send", nil))
	fmt.Println(errors.Is(err, queue.ErrInvalid))
	// Output:
	// scheduled 5
	// acme 3
	// waiting: 1
	// true
}

func ExampleClient_Enqueue_backlog() {
	rdb, prefix, queueName, done := exampleEnv("ExampleClient_Enqueue_backlog")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// backlog=2: at most two of acme's jobs wait in its line.
	policy, _ := throttle.ParsePolicy("rate=10/s backlog=2")
	if err := client.Limiter().Policies().Set(ctx, "acme", policy); err != nil {
		panic(err)
	}

	for i := 0; i < 3; i++ {
		_, err := client.Enqueue(ctx, "acme", asynq.NewTask("report", nil), asynq.Queue(queueName))
		if errors.Is(err, throttle.ErrBacklogFull) {
			fmt.Println("job", i, "refused:", err)
			continue
		}
		fmt.Println("job", i, "waiting")
	}
	// Output:
	// job 0 waiting
	// job 1 waiting
	// job 2 refused: tenant "acme": backlog full (2 waiting, cap 2): retry later or raise backlog= in its policy
}

func ExampleClient_EnqueueBatch() {
	rdb, prefix, queueName, done := exampleEnv("ExampleClient_EnqueueBatch")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	jobs := []queue.Job{
		{Tenant: "acme", Task: asynq.NewTask("email", nil), Options: []asynq.Option{asynq.Queue(queueName)}},
		{Tenant: "", Task: asynq.NewTask("email", nil)},
		{Tenant: "globex", Task: asynq.NewTask("email", nil), Options: []asynq.Option{asynq.Queue(queueName), queue.Cost(2)}},
	}
	for i, r := range client.EnqueueBatch(ctx, jobs) {
		if r.Err != nil {
			fmt.Println(i, "failed:", errors.Is(r.Err, queue.ErrInvalid))
			continue
		}
		fmt.Println(i, r.Info.State, r.Info.Headers[taskspec.TenantHeader])
	}
	// Output:
	// 0 scheduled acme
	// 1 failed: true
	// 2 scheduled globex
}

func ExamplePriority() {
	rdb, prefix, queueName, done := exampleEnv("ExamplePriority")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	// Four of acme's jobs wait in its line (no worker serves the queue
	// yet): the one of high priority leaves it first, the low one last,
	// each level in the order the jobs came.
	for _, j := range []struct {
		id       string
		priority taskspec.Priority
	}{{"report-1", queue.Normal}, {"report-2", queue.Low}, {"report-3", queue.Normal}, {"urgent", queue.High}} {
		_, err := client.Enqueue(ctx, "acme", asynq.NewTask("report", nil),
			asynq.Queue(queueName), asynq.TaskID(j.id), queue.Priority(j.priority))
		if err != nil {
			panic(err)
		}
	}
	line, err := client.Limiter().ExplainLine(ctx, "acme", queueName, 0)
	if err != nil {
		panic(err)
	}
	for _, x := range line {
		fmt.Println(x.ID, taskspec.Priority(x.Priority), x.Ahead)
	}

	// A level that does not exist is refused before anything is written.
	_, err = client.Enqueue(ctx, "acme", asynq.NewTask("report", nil), asynq.Queue(queueName), queue.Priority(5))
	fmt.Println(errors.Is(err, queue.ErrInvalid))
	// Output:
	// urgent high 0
	// report-1 normal 1
	// report-3 normal 2
	// report-2 low 3
	// true
}

func ExamplePools() {
	rdb, prefix, queueName, done := exampleEnv("ExamplePools")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// Every tenant's calls to one provider share its limit: a pool.
	pool, _ := throttle.ParsePolicy("rate=60/min concurrency=10")
	if err := client.Limiter().Policies().Set(ctx, "@openai", pool); err != nil {
		panic(err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		info, err := client.Enqueue(ctx, tenant, asynq.NewTask("summarize", nil),
			asynq.Queue(queueName), queue.Pools("@openai"))
		if err != nil {
			panic(err)
		}
		// the job goes to asynq at once; the workers' gate decides it on
		// its tenant's rules and the pool's together
		fmt.Println(tenant, info.State, info.Headers[taskspec.PoolsHeader])
	}

	// A pool's name starts with @: anything else is refused before
	// anything is written.
	_, err = client.Enqueue(ctx, "acme", asynq.NewTask("summarize", nil), asynq.Queue(queueName), queue.Pools("openai"))
	fmt.Println(errors.Is(err, queue.ErrInvalid))
	// Output:
	// acme pending @openai
	// globex pending @openai
	// true
}

func ExampleKey() {
	rdb, prefix, queueName, done := exampleEnv("ExampleKey")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// acme may start 100 jobs a second in all, each of its users one.
	for name, text := range map[string]string{"acme": "rate=100/s burst=100", "acme/*": "rate=1/s burst=1"} {
		p, _ := throttle.ParsePolicy(text)
		if err := client.Limiter().Policies().Set(ctx, name, p); err != nil {
			panic(err)
		}
	}
	for i, user := range []string{"user-42", "user-42", "user-7"} {
		info, err := client.Enqueue(ctx, "acme", asynq.NewTask("report", nil),
			asynq.Queue(queueName), queue.Key(user), asynq.TaskID(fmt.Sprintf("r%d", i)))
		if err != nil {
			panic(err)
		}
		fmt.Println(info.ID, info.Headers[taskspec.KeyHeader])
	}
	// No worker serves the queue yet: the jobs wait in acme's line. The
	// second of user-42 waits for its key's rate; user-7's only for its
	// turn, not behind user-42's.
	for _, id := range []string{"r1", "r2"} {
		x, err := client.Limiter().Explain(ctx, "acme", queueName, id)
		if err != nil {
			panic(err)
		}
		fmt.Println(id, x.HeldBy, x.Expected.Sub(x.Now).Round(time.Second))
	}
	// Output:
	// r0 user-42
	// r1 user-42
	// r2 user-7
	// r1 user-42 rate[0] 1s
	// r2 turn 0s
}

func ExampleCost() {
	rdb, prefix, queueName, done := exampleEnv("ExampleCost")
	defer done()
	ctx := context.Background()

	client, err := queue.New(rdb, &queue.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	// A job's cost must fit every rule it passes: rate=2/s lets one job
	// start at once (its burst is 1), so a job of cost 3 could never
	// start. It is refused, and nothing is written.
	policy, _ := throttle.ParsePolicy("rate=2/s")
	if err := client.Limiter().Policies().Set(ctx, "acme", policy); err != nil {
		panic(err)
	}
	_, err = client.Enqueue(ctx, "acme", asynq.NewTask("report", nil), asynq.Queue(queueName), queue.Cost(3))
	var ce *throttle.CostError
	fmt.Println(errors.As(err, &ce), ce.Max)
	fmt.Println(err)

	// A burst of 3 lets it in.
	policy, _ = throttle.ParsePolicy("rate=2/s burst=3")
	if err := client.Limiter().Policies().Set(ctx, "acme", policy); err != nil {
		panic(err)
	}
	_, err = client.Enqueue(ctx, "acme", asynq.NewTask("report", nil), asynq.Queue(queueName), queue.Cost(3))
	fmt.Println(err)
	// Output:
	// true 1
	// tenant "acme": a job of cost 3 can never start: acme rate[0] (2/s) admits at most 1 at once, and a job's cost must fit its burst; give that rate burst=3 or more (rate=2/s burst=3), or split the job into jobs of cost 1 or less
	// <nil>
}
