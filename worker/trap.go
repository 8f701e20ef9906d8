package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/taskspec"
)

// copyAttempts bounds the tries to enqueue the copy of a job at its retry
// limit before the gate gives up and lets asynq archive it.
const copyAttempts = 5

// copyTaskID is the task id of the gen-th copy of job id. It is derived,
// not random, so that enqueueing the same copy twice (the task processed
// again after a crash) conflicts instead of running the job twice.
func copyTaskID(id string, gen int) string {
	return fmt.Sprintf("%s-sluice%d", id, gen)
}

// copyJob carries on a deferred job that asynq cannot retry: asynq archives
// a task at its retry limit whatever IsFailure says. The gate enqueues an
// identical copy for e.At (same type, payload, headers, queue, timeout,
// deadline and retention, the retry budget left, and the job's identity in
// IDHeader so it keeps its reservation and slot) and asks
// asynq to delete the original (asynq.RevokeTask, through e.CopyID).
func (g *Gate) copyJob(ctx context.Context, j *job, e *DeferError) error {
	gen := j.gen + 1
	id := copyTaskID(j.id, gen)
	headers := maps.Clone(j.task.Headers())
	if headers == nil {
		headers = map[string]string{}
	}
	headers[taskspec.IDHeader] = j.id
	headers[taskspec.GenHeader] = strconv.Itoa(gen)
	// the copy is scheduled for its slot, not parked in a line
	delete(headers, taskspec.ParkedHeader)
	opts := []asynq.Option{
		asynq.Queue(j.queue),
		asynq.TaskID(id),
		asynq.MaxRetry(max(0, j.maxRetry-j.retried)),
		asynq.ProcessAt(e.At),
	}
	if info, err := g.inspector.GetTaskInfo(j.queue, j.taskID); err == nil {
		if info.Timeout > 0 {
			opts = append(opts, asynq.Timeout(info.Timeout))
		}
		if !info.Deadline.IsZero() {
			opts = append(opts, asynq.Deadline(info.Deadline))
		}
		if info.Retention > 0 {
			opts = append(opts, asynq.Retention(info.Retention))
		}
	} else {
		g.warn(errCopy, "cannot read task options; copy gets default timeout", "task", j.taskID, "err", err)
	}
	task := asynq.NewTaskWithHeaders(j.task.Type(), j.task.Payload(), headers)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
		_, err := g.asynq.EnqueueContext(cctx, task, opts...)
		cancel()
		if err == nil || errors.Is(err, asynq.ErrTaskIDConflict) {
			e.CopyID = id
			return e
		}
		g.m.err(errCopy)
		if attempt == copyAttempts || !g.sleep(ctx, time.Duration(attempt)*200*time.Millisecond) {
			g.log.Error("cannot enqueue copy at retry limit; job will be archived", "task", j.taskID, "tenant", j.tenant, "copy", id, "err", err)
			return e
		}
	}
}
