package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// sluice jobs explain ID: a job's state and, when it waits in its tenant's
// line, what holds it and when it is expected to start
// (throttle.Limiter.Explain).

func jobsExplain(a *app, c *command, o *opts, args []string) error {
	return withTask(a, c, o, args, func(cn *conn, _ *asynq.Inspector, info *asynq.TaskInfo) error {
		doc, x, err := explainTask(a.ctx, cn, info)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(a.stdout, doc)
		}
		return writeExplain(a.stdout, doc, x)
	})
}

// explainTask is the explanation of the task info: its state in asynq
// and, when it waits in its tenant's line, Limiter.Explain's.
func explainTask(ctx context.Context, cn *conn, info *asynq.TaskInfo) (explainDoc, *throttle.Explanation, error) {
	tenant := info.Headers[taskspec.TenantHeader]
	doc := explainDoc{ID: info.ID, Queue: info.Queue, Tenant: tenant, Key: info.Headers[taskspec.KeyHeader], Type: info.Type, State: info.State.String(),
		Retried: info.Retried, MaxRetry: info.MaxRetry, LastError: info.LastErr}
	if info.State != asynq.TaskStateArchived && info.State != asynq.TaskStateActive && info.State != asynq.TaskStateCompleted {
		doc.NextProcessAt = timePtr(info.NextProcessAt)
	}
	if names.Tenant(tenant) != nil {
		return doc, nil, nil
	}
	x, err := cn.limiter.Explain(ctx, tenant, info.Queue, info.ID)
	if err != nil && !errors.Is(err, throttle.ErrNotWaiting) {
		return doc, nil, err
	}
	if x != nil && x.Waiting {
		doc.State = "waiting"
		doc.fill(x)
	}
	doc.Text = explainState(doc, x)
	return doc, x, nil
}

// explainDoc is the output of jobs explain --json.
type explainDoc struct {
	ID            string     `json:"id"`
	Queue         string     `json:"queue"`
	Tenant        string     `json:"tenant"`
	Key           string     `json:"key,omitempty"`
	Type          string     `json:"type"`
	State         string     `json:"state"`
	Retried       int        `json:"retried"`
	MaxRetry      int        `json:"max_retry"`
	LastError     string     `json:"last_error"`
	NextProcessAt *time.Time `json:"next_process_at"`
	// Text says where the job stands, in words.
	Text string `json:"text"`
	// For a job waiting in its tenant's line (state "waiting"):
	Now           *time.Time `json:"now,omitempty"`
	Ahead         int64      `json:"ahead"`
	CostAhead     int64      `json:"cost_ahead"`
	Cost          int64      `json:"cost,omitempty"`
	Lined         *time.Time `json:"lined,omitempty"`
	ExpectedStart *time.Time `json:"expected_start,omitempty"`
	ExpectedInMS  float64    `json:"expected_in_ms"`
	HeldBy        string     `json:"held_by,omitempty"`
	// Priority is its level in the line: "high", "normal" or "low" (the
	// line's, which sluice jobs prioritize changes; the job's
	// sluice-priority header keeps the level it was enqueued with).
	Priority     string       `json:"priority,omitempty"`
	RunningFirst int64        `json:"running_first"`
	Holds        []holdJSON   `json:"holds,omitempty"`
	Learned      *learnedJSON `json:"learned,omitempty"`
}

type holdJSON struct {
	Rule  string     `json:"rule"`
	Until *time.Time `json:"until"`
	Why   string     `json:"why"`
}

func (d *explainDoc) fill(x *throttle.Explanation) {
	d.Now, d.Ahead, d.CostAhead, d.Cost = timePtr(x.Now), x.Ahead, x.CostAhead, x.Cost
	d.Lined, d.ExpectedStart, d.ExpectedInMS = timePtr(x.Lined), timePtr(x.Expected), ms(x.Expected.Sub(x.Now))
	d.HeldBy, d.RunningFirst, d.Key = x.HeldBy, x.RunningFirst, x.Key
	d.Priority = taskspec.Priority(x.Priority).String()
	for _, h := range x.Holds {
		d.Holds = append(d.Holds, holdJSON{Rule: h.Rule, Until: timePtr(h.Until), Why: h.Why})
	}
	if l := x.Learned; l != nil {
		d.Learned = &learnedJSON{Limit: l.Limit, WindowMS: ms(l.Window), Rate: l.Rate().String(), Rule: l.Rule, Note: l.Note,
			Source: l.Source, From: l.From, Learned: l.Learned.UTC(), Until: l.Until.UTC()}
	}
}

func writeExplain(w io.Writer, d explainDoc, x *throttle.Explanation) error {
	tenant := d.Tenant
	if tenant == "" {
		tenant = "-"
	}
	if d.Key != "" {
		tenant += ", key " + d.Key
	}
	fmt.Fprintf(w, "job %s (type %s, tenant %s, queue %s): %s\n", human.Text(d.ID), human.Text(d.Type), human.Text(tenant), human.Text(d.Queue), explainState(d, x))
	if x == nil || !x.Waiting {
		if d.LastError != "" {
			fmt.Fprintf(w, "last error: %s\n", human.Line(d.LastError, 200))
		}
		return nil
	}
	tw := newTable(w)
	for _, h := range x.Holds {
		when := "-"
		if !h.Until.IsZero() {
			when = "in " + short(h.Until.Sub(x.Now))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", h.Rule, when, h.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "The estimate is what the tenant's meters promise if the line ahead is served without pause; a cooldown, a learned limit or a policy change moves it, and a fleet without room or a concurrency cap delays it.")
	return nil
}

// explainState says in words where the job stands.
func explainState(d explainDoc, x *throttle.Explanation) string {
	if x != nil && x.Waiting {
		s := fmt.Sprintf("waiting in its tenant's line%s, %d ahead of it, for %s; ", atPriority(taskspec.Priority(x.Priority)), x.Ahead, short(x.Now.Sub(x.Lined)))
		switch x.HeldBy {
		case "turn":
			return s + "every rule lets it start now: it waits for its turn (a pump, room in the fleet)"
		case "concurrency":
			return s + fmt.Sprintf("held by the concurrency cap: %d of the tenant's running jobs must end first", x.RunningFirst)
		case x.Key + " concurrency":
			return s + fmt.Sprintf("held by its key's concurrency cap: running jobs of key %s must end first", x.Key)
		}
		held := x.HeldBy
		if x.Learned != nil && x.Learned.Rule != "" && x.Learned.Rule == held {
			held += " (learned from the downstream)"
		}
		return s + fmt.Sprintf("expected to start in %s (%s), held by %s", short(x.Expected.Sub(x.Now)), x.Expected.UTC().Format(time.RFC3339Nano), held)
	}
	switch d.State {
	case "active":
		return "running"
	case "pending":
		return "pending: a worker takes it next"
	case "archived":
		return "archived (it will not run unless sluice jobs run brings it back)"
	case "scheduled", "retry":
		if d.NextProcessAt != nil {
			return fmt.Sprintf("%s: asynq brings it back in %s (a job the gate deferred waits in asynq for its slot)", d.State, short(time.Until(*d.NextProcessAt)))
		}
	}
	return d.State
}

// atPriority names a level other than normal: " at high priority".
func atPriority(p taskspec.Priority) string {
	if p == taskspec.PriorityNormal {
		return ""
	}
	return " at " + p.String() + " priority"
}

// explainLineMax bounds how much of a line sluice jobs reads to explain
// the waiting jobs it lists; jobs further back say "its turn".
const explainLineMax = 10_000

// explainWaiting explains the waiting jobs of list, reading each line
// they wait in once.
func explainWaiting(ctx context.Context, cn *conn, list []job) error {
	type line struct{ tenant, queue string }
	var xs map[line]map[string]*throttle.Explanation
	for i := range list {
		j := &list[i]
		if j.state != "waiting" {
			continue
		}
		l := line{j.tenant(), j.info.Queue}
		if xs == nil {
			xs = map[line]map[string]*throttle.Explanation{}
		}
		byID, ok := xs[l]
		if !ok {
			all, err := cn.limiter.ExplainLine(ctx, l.tenant, l.queue, explainLineMax)
			if err != nil {
				return err
			}
			byID = map[string]*throttle.Explanation{}
			for k := range all {
				byID[all[k].ID] = &all[k]
			}
			xs[l] = byID
		}
		j.expect = byID[j.info.ID]
	}
	return nil
}

// expectedRun is a waiting job's NEXT RUN: when it is expected to start
// and what holds it.
func expectedRun(j job) string {
	x := j.expect
	switch {
	case x == nil, x.HeldBy == "turn":
		return "its turn"
	case x.HeldBy == "concurrency":
		return fmt.Sprintf("after %d end (concurrency)", x.RunningFirst)
	}
	return fmt.Sprintf("in %s (%s)", short(x.Expected.Sub(x.Now)), x.HeldBy)
}
