package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/queue"
)

// cron enqueues the job(s) of the flags every time the schedule fires,
// until ctx ends (SIGINT or SIGTERM); it then says how many it enqueued.
func (e *enqueuer) cron(ctx context.Context) int {
	o := e.o
	next := o.schedule.Next(time.Now())
	if next.IsZero() {
		fmt.Fprintf(e.stderr, "enqueue: --cron %q never fires\n", o.cronSpec)
		return exitFailure
	}
	fmt.Fprintf(e.stderr, "enqueue: on schedule %q until SIGINT or SIGTERM (Ctrl-C); first run at %s\n", o.cronSpec, next.Format(time.RFC3339))
	var runs, done, failed int
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(e.stdout, "stopped: enqueued %s in %s%s\n", human.Count(done, "job", "jobs"), human.Count(runs, "run", "runs"), failedNote(failed))
			if failed > 0 {
				return exitFailure
			}
			return exitOK
		case <-timer.C:
		}
		runs++
		jobs := make([]queue.Job, o.count)
		for i := range jobs {
			jobs[i] = e.flagJob()
		}
		ok := 0
		for i, r := range e.client.EnqueueBatch(context.WithoutCancel(ctx), jobs) {
			if r.Err != nil {
				failed++
				fmt.Fprintf(e.stderr, "enqueue: run %d, job %d: %s\n", runs, i+1, explain(r.Err))
				continue
			}
			ok++
			if o.count == 1 {
				fmt.Fprintf(e.stdout, "%s %s\n", time.Now().UTC().Format(time.RFC3339), describe(r.Info, o.tenant, o.priority, o.in))
			}
		}
		done += ok
		if o.count > 1 {
			fmt.Fprintf(e.stdout, "%s enqueued %d of %s for tenant %s\n", time.Now().UTC().Format(time.RFC3339), ok, human.Count(o.count, "job", "jobs"), o.tenant)
		}
		next = o.schedule.Next(time.Now())
		timer.Reset(time.Until(next))
	}
}
