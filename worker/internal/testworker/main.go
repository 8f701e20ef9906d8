// Command testworker is a sluice worker for the worker package's
// multi-process tests. It runs the gate in front of one handler, "rec",
// which records when each job starts and ends in a Redis list, so the tests
// can check rates and concurrency as the handlers saw them, across
// processes and across a SIGKILL.
//
// Each event is one list element, fields separated by "|":
//
//	S|identity|task id|tenant|pid|unix µs|retried|admitted (Redis time, µs; 0 without a decision)|decided|ticket
//	E|identity|task id|tenant|pid|unix µs
//
// decided is the slot (Redis time, µs) of the waiting room's decision the
// job started on, carried in its headers (a ticket), and 0 when the gate
// decided it: a ticket is made by a script run, before the job's task
// reached a worker. ticket is the slot of the ticket the job carried,
// whether or not it started on it (0: none, or one that only holds a
// reservation): a job with a ticket and no decided came late for it and
// was decided anew by the gate.
//
// The "rec" payload is {"ms": N}: the job sleeps N ms between its events.
// The program prints "ready" once it takes jobs, and on SIGTERM or SIGINT
// shuts down gracefully and exits 0.
//
// Every Redis flag takes the URLs of internal/redisurl (redis://, and
// redis+cluster:// for a Cluster, on which asynq gets
// asynq.RedisClusterClientOpt's client). -events-redis keeps the records
// on a Redis of their own, so that tests which stop, freeze or restart the
// Redis under test lose none.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisurl"
	"github.com/sluicehq/sluice/taskspec"
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
	eventsURL := flag.String("events-redis", "", "Redis URL of the -events list when apart from -redis")
	prefix := flag.String("prefix", "", "sluice key prefix")
	qname := flag.String("queue", "default", "queue to process")
	events := flag.String("events", "", "Redis list (on -redis, or -events-redis) the handler records its events in")
	concurrency := flag.Int("concurrency", 100, "asynq concurrency")
	retryDelay := flag.Duration("retry-delay", time.Second, "delay before a failed job is retried")
	backoffMax := flag.Duration("backoff-max", 0, "the gate's BackoffMax (0: its default)")
	recoverLease := flag.Duration("recover-lease", 0, "the worker's RecoverLease (0: its default)")
	clusterReload := flag.Duration("cluster-reload", 0, "on a Cluster, how often the clients reload the slot map (0: go-redis's default, 60s, and asynq's client from asynq.RedisClusterClientOpt)")
	flag.Parse()
	if *redisURL == "" || *events == "" {
		return fmt.Errorf("-redis and -events are required")
	}
	rdb, err := connect("-redis", *redisURL, true, *clusterReload)
	if err != nil {
		return err
	}
	defer rdb.Close()
	sluice := rdb
	if *sluiceURL != "" {
		if sluice, err = connect("-sluice-redis", *sluiceURL, false, *clusterReload); err != nil {
			return err
		}
		defer sluice.Close()
	}
	eventsRedis := rdb
	if *eventsURL != "" {
		if eventsRedis, err = connect("-events-redis", *eventsURL, false, *clusterReload); err != nil {
			return err
		}
		defer eventsRedis.Close()
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := worker.New(sluice, &worker.Config{
		Prefix:       *prefix,
		AsynqRedis:   rdb,
		RecoverLease: *recoverLease,
		Gate:         worker.GateConfig{Logger: logger, BackoffMax: *backoffMax},
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
	worker.RegisterBuiltins(srv, nil, 0)
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
		if v := t.Headers()[taskspec.IDHeader]; v != "" {
			id = v
		}
		tenant := t.Headers()[taskspec.TenantHeader]
		ev := func(kind string, extra ...string) error {
			f := append([]string{kind, id, taskID, tenant, fmt.Sprint(pid), fmt.Sprint(time.Now().UnixMicro())}, extra...)
			return eventsRedis.RPush(context.WithoutCancel(ctx), *events, strings.Join(f, "|")).Err()
		}
		admitted, decided, ticket := int64(0), int64(0), int64(0)
		if a, ok := worker.AdmissionFrom(ctx); ok && !a.FailOpen {
			admitted = a.Decision.Now.UnixMicro()
			// a ticket's text is "1:SLOT:…"; the job started on it when its
			// admission is at that slot
			if f := strings.Split(t.Headers()[taskspec.DecidedHeader], ":"); len(f) > 2 && f[0] == "1" && f[2] != "-2" {
				if slot, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					ticket = slot
					if !a.Decision.Slot.IsZero() && a.Decision.Slot.UnixMicro() == slot {
						decided = slot
					}
				}
			}
		}
		if err := ev("S", fmt.Sprint(retried), fmt.Sprint(admitted), fmt.Sprint(decided), fmt.Sprint(ticket)); err != nil {
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

// connect returns a client for url; for asynq's queues on a Cluster, the
// one asynq.RedisClusterClientOpt makes, as an asynq application has. With
// reload, a Cluster client reloads its slot map that often instead (go-redis
// otherwise keeps sending a failed master's slots to it for up to a minute,
// and asynq.RedisClusterClientOpt cannot change that).
func connect(flagName, url string, forAsynq bool, reload time.Duration) (redis.UniversalClient, error) {
	u, err := redisurl.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	if u.Kind == redisurl.KindCluster && reload > 0 {
		o := u.UniversalOptions().Cluster()
		o.ClusterStateReloadInterval = reload
		if !forAsynq {
			o.PoolSize = 64
		}
		return redis.NewClusterClient(o), nil
	}
	if forAsynq && u.Kind == redisurl.KindCluster {
		c, ok := u.AsynqOpt().MakeRedisClient().(redis.UniversalClient)
		if !ok {
			return nil, fmt.Errorf("%s: asynq's cluster option made no go-redis client", flagName)
		}
		return c, nil
	}
	u.PoolSize = 64
	return u.NewClient(), nil
}
