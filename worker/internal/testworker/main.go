// Command testworker is a sluice worker for the worker package's
// multi-process tests. It runs the gate in front of one handler, "rec",
// which records when each job starts and ends in a Redis list, so the tests
// can check rates and concurrency as the handlers saw them, across
// processes and across a SIGKILL.
//
// Each event is one list element, fields separated by "|":
//
//	S|identity|task id|tenant|pid|unix µs|retried|admitted (Redis time, µs; 0 without a decision)
//	E|identity|task id|tenant|pid|unix µs
//
// The "rec" payload is {"ms": N}: the job sleeps N ms between its events.
// The program prints "ready" once it takes jobs, and on SIGTERM or SIGINT
// shuts down gracefully and exits 0.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/worker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testworker:", err)
		os.Exit(1)
	}
}

func run() error {
	redisURL := flag.String("redis", "", "Redis URL of asynq's queues and, unless -sluice-redis is given, sluice's keys")
	sluiceURL := flag.String("sluice-redis", "", "Redis URL of sluice's keys when apart from asynq's")
	prefix := flag.String("prefix", "", "sluice key prefix")
	qname := flag.String("queue", "default", "queue to process")
	events := flag.String("events", "", "Redis list (on -redis) the handler records its events in")
	concurrency := flag.Int("concurrency", 100, "asynq concurrency")
	retryDelay := flag.Duration("retry-delay", time.Second, "delay before a failed job is retried")
	flag.Parse()
	if *redisURL == "" || *events == "" {
		return fmt.Errorf("-redis and -events are required")
	}
	opt, err := redis.ParseURL(*redisURL)
	if err != nil {
		return fmt.Errorf("-redis %q: %w", *redisURL, err)
	}
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	sluice := rdb
	if *sluiceURL != "" {
		sopt, err := redis.ParseURL(*sluiceURL)
		if err != nil {
			return fmt.Errorf("-sluice-redis %q: %w", *sluiceURL, err)
		}
		sluice = redis.NewClient(sopt)
		defer sluice.Close()
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := worker.New(sluice, &worker.Config{
		Prefix:     *prefix,
		AsynqRedis: rdb,
		Gate:       worker.GateConfig{Logger: logger},
		Asynq: asynq.Config{
			Concurrency:    *concurrency,
			Queues:         map[string]int{*qname: 1},
			LogLevel:       asynq.ErrorLevel,
			RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return *retryDelay },
		},
	})
	if err != nil {
		return err
	}
	pid := os.Getpid()
	srv.HandleFunc("rec", func(ctx context.Context, t *asynq.Task) error {
		var p struct {
			MS int64 `json:"ms"`
		}
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return fmt.Errorf("rec payload: %v: %w", err, asynq.SkipRetry)
		}
		taskID, _ := asynq.GetTaskID(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		id := taskID
		if v := t.Headers()[queue.IDHeader]; v != "" {
			id = v
		}
		tenant := t.Headers()[queue.TenantHeader]
		ev := func(kind string, extra ...string) error {
			f := append([]string{kind, id, taskID, tenant, fmt.Sprint(pid), fmt.Sprint(time.Now().UnixMicro())}, extra...)
			return rdb.RPush(context.WithoutCancel(ctx), *events, strings.Join(f, "|")).Err()
		}
		admitted := int64(0)
		if a, ok := worker.AdmissionFrom(ctx); ok && !a.FailOpen {
			admitted = a.Decision.Now.UnixMicro()
		}
		if err := ev("S", fmt.Sprint(retried), fmt.Sprint(admitted)); err != nil {
			return err
		}
		timer := time.NewTimer(time.Duration(p.MS) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		return ev("E")
	})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if err := srv.Start(); err != nil {
		return err
	}
	fmt.Println("ready")
	<-sig
	srv.Shutdown()
	return nil
}
