package main

import (
	"errors"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// sluice jobs prioritize ID --priority P: moves a job waiting in its
// tenant's line to another level of the line (waitroom.Room.Prioritize).
//
// asynq has no way to edit a task's headers, and rewriting its encoded
// message behind asynq's back would race with asynq's own writes: the
// job's sluice-priority header keeps the level it was enqueued with, and
// the line is the truth (sluice jobs and jobs explain read the level from
// the line).

// prioritizeDoc is the output of jobs prioritize --json: the job
// explained after the move, and the level it had before.
type prioritizeDoc struct {
	explainDoc
	PreviousPriority string `json:"previous_priority"`
}

func jobsPrioritize(a *app, c *command, o *opts, args []string) error {
	if o.priority == "" {
		return usagef(c, "jobs prioritize: missing --priority: high, normal or low")
	}
	p, err := taskspec.ParsePriority(o.priority)
	if err != nil {
		return usagef(c, "--priority %q: must be high, normal or low", o.priority)
	}
	return withTask(a, c, o, args, func(cn *conn, _ *asynq.Inspector, info *asynq.TaskInfo) error {
		notWaiting := fmt.Errorf("%s is %s, not waiting in its tenant's line: only a waiting job has a place in a line to move; nothing changed", describeTask(info), info.State)
		tenant := info.Headers[taskspec.TenantHeader]
		if names.Tenant(tenant) != nil {
			return notWaiting
		}
		before, err := cn.limiter.Explain(a.ctx, tenant, info.Queue, info.ID)
		if errors.Is(err, throttle.ErrNotWaiting) {
			return notWaiting
		}
		if err != nil {
			return err
		}
		was := taskspec.Priority(before.Priority)
		if was != p {
			moved, err := waitroom.Of(cn.limiter).Prioritize(a.ctx, tenant, info.Queue, info.ID, int(p))
			if err != nil {
				return fmt.Errorf("prioritize %s: %w", describeTask(info), err)
			}
			if !moved {
				return fmt.Errorf("%s left its tenant's line before it could move (a worker took it); nothing changed", describeTask(info))
			}
		}
		doc, x, err := explainTask(a.ctx, cn, info)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(a.stdout, prioritizeDoc{explainDoc: doc, PreviousPriority: was.String()})
		}
		job := fmt.Sprintf("job %s of tenant %s", human.Text(info.ID), human.Text(tenant))
		switch {
		case x == nil || !x.Waiting:
			fmt.Fprintf(a.stdout, "%s moved to %s priority; it has left the line since (a worker took it)\n", job, p)
		case was == p:
			fmt.Fprintf(a.stdout, "%s is at %s priority already: %s ahead of it; nothing changed\n", job, p, human.Count(x.Ahead, "job", "jobs"))
		default:
			fmt.Fprintf(a.stdout, "%s moved to %s priority: %s ahead of it now (it was at %s priority)\n", job, p, human.Count(x.Ahead, "job", "jobs"), was)
		}
		return nil
	})
}
