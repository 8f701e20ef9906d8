// Command testproducer is a sluice producer for the worker package's
// crash tests: it enqueues -n jobs of one tenant through queue.Client, one
// at a time, and prints each job's task id once Enqueue has returned it (the
// job is acknowledged). A test kills it at a crash point (package
// internal/crashpoint) to see what a producer dying mid-enqueue leaves.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/redisurl"
	"github.com/sluicehq/sluice/queue"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testproducer:", err)
		os.Exit(1)
	}
}

func run() error {
	redisURL := flag.String("redis", "", "Redis URL")
	prefix := flag.String("prefix", "", "sluice key prefix")
	qname := flag.String("queue", "default", "queue")
	tenant := flag.String("tenant", "acme", "tenant")
	n := flag.Int("n", 10, "jobs to enqueue")
	payload := flag.String("payload", `{"ms":10}`, "the rec handler's payload")
	fallback := flag.Duration("fallback", 0, "queue.Config.Fallback (0: its default)")
	idPrefix := flag.String("id", "", "task ids ID-0, ID-1, … (empty: asynq's own)")
	from := flag.Int("from", 0, "the first job (with -id: a retry of jobs from this one on)")
	flag.Parse()
	u, err := redisurl.Parse(*redisURL)
	if err != nil {
		return err
	}
	rdb := u.NewClient()
	defer rdb.Close()
	q, err := queue.New(rdb, &queue.Config{Prefix: *prefix, Fallback: *fallback})
	if err != nil {
		return err
	}
	defer q.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := *from; i < *n; i++ {
		opts := []asynq.Option{asynq.Queue(*qname)}
		if *idPrefix != "" {
			opts = append(opts, asynq.TaskID(fmt.Sprintf("%s-%d", *idPrefix, i)))
		}
		info, err := q.Enqueue(ctx, *tenant, asynq.NewTask("rec", []byte(*payload)), opts...)
		if err != nil {
			return err
		}
		fmt.Println(info.ID)
	}
	return nil
}
