package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// The states sluice jobs lists, in the order it lists them. waiting is a
// job in its tenant's line (sluice's waiting room), kept in asynq's
// scheduled set until it is admitted.
var jobStates = []string{"active", "pending", "waiting", "scheduled", "retry", "archived"}

// jobsLimitDefault is how many jobs sluice jobs lists unless --limit says.
const jobsLimitDefault = 50

// jobsPageSize is how many tasks each listing round trip reads.
const jobsPageSize = 500

// waitingIDs returns the jobs waiting in tenant's line ("" for every
// tenant's), from sluice's waiting room, by waitingKey, with their levels
// in the line: asynq holds them in its schedule, parked, until a worker
// promotes them.
var waitingIDs = func(ctx context.Context, cn *conn, tenant string, queues []string) (map[string]taskspec.Priority, error) {
	room := waitroom.Of(cn.limiter)
	tenants := []string{tenant}
	if tenant == "" {
		lines, err := room.Lines(ctx, queues...)
		if err != nil {
			return nil, err
		}
		tenants = tenants[:0]
		seen := map[string]bool{}
		for _, l := range lines {
			if !seen[l.Tenant] {
				seen[l.Tenant] = true
				tenants = append(tenants, l.Tenant)
			}
		}
	}
	out := map[string]taskspec.Priority{}
	for _, t := range tenants {
		ws, err := room.WaitingIDs(ctx, t, 0)
		if err != nil {
			return nil, err
		}
		for _, w := range ws {
			out[waitingKey(w.Queue, w.ID)] = taskspec.Priority(w.Priority)
		}
	}
	return out, nil
}

// waitingKey names a task in a queue.
func waitingKey(queue, id string) string { return queue + "\x00" + id }

// jobJSON is one job of `jobs --json`.
type jobJSON struct {
	ID            string     `json:"id"`
	Queue         string     `json:"queue"`
	State         string     `json:"state"`
	Tenant        string     `json:"tenant"`
	Type          string     `json:"type"`
	Retried       int        `json:"retried"`
	MaxRetry      int        `json:"max_retry"`
	LastError     string     `json:"last_error"`
	LastFailedAt  *time.Time `json:"last_failed_at"`
	NextProcessAt *time.Time `json:"next_process_at"`
	Payload       string     `json:"payload"`
	// ExpectedStart and HeldBy are, for a waiting job, when it is
	// expected to start and what holds it (sluice jobs explain).
	ExpectedStart *time.Time `json:"expected_start,omitempty"`
	HeldBy        string     `json:"held_by,omitempty"`
	// Priority is, for a waiting job, its level in its tenant's line:
	// "high", "normal" or "low" (the line's, which sluice jobs prioritize
	// changes, not the level the job was enqueued with).
	Priority string `json:"priority,omitempty"`
}

type jobsDoc struct {
	Now  time.Time `json:"now"`
	Jobs []jobJSON `json:"jobs"`
	// More is set when jobs matched beyond --limit.
	More bool `json:"more"`
}

// job is one listed task.
type job struct {
	info  *asynq.TaskInfo
	state string
	// priority is a waiting job's level in its line
	priority taskspec.Priority
	// expect explains a waiting job (explain.go); nil for the others
	expect *throttle.Explanation
}

func (j job) tenant() string { return j.info.Headers[taskspec.TenantHeader] }

// parseStates reads --state: a comma-separated list, or all.
func parseStates(c *command, s string) ([]string, error) {
	if s == "" || s == "all" {
		return jobStates, nil
	}
	var out []string
	for _, st := range strings.Split(s, ",") {
		st = strings.TrimSpace(st)
		if !slices.Contains(jobStates, st) {
			return nil, usagef(c, "--state %q: want %s, several of them separated by commas, or all", st, strings.Join(jobStates, ", "))
		}
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return slices.Index(jobStates, a) - slices.Index(jobStates, b) })
	return out, nil
}

func jobs(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 1, ""); err != nil {
		return err
	}
	tenant := ""
	var notTenant error // TENANT is no tenant's name; it may be a job's id
	if len(args) == 1 {
		tenant = args[0]
		notTenant = names.Tenant(tenant)
	}
	states, err := parseStates(c, o.state)
	if err != nil {
		return err
	}
	if o.limit < 0 {
		return usagef(c, "--limit %d: must be 0 (every job) or more", o.limit)
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	in := asynq.NewInspectorFromRedisClient(cn.client)
	queues, err := jobQueues(in, o.queue)
	if err != nil {
		return err
	}
	var (
		list []job
		more bool
	)
	if notTenant == nil {
		var waiting map[string]taskspec.Priority
		if slices.Contains(states, "waiting") || slices.Contains(states, "scheduled") {
			if waiting, err = waitingIDs(a.ctx, cn, tenant, queues); err != nil {
				return err
			}
		}
		limit := o.limit
		if limit == 0 {
			limit = -1
		}
		if list, more, err = listJobs(in, queues, states, tenant, waiting, limit); err != nil {
			return err
		}
	}
	if tenant != "" && len(list) == 0 {
		// sluice jobs order-17: a job's id where a tenant goes
		if list, err = jobsByID(a.ctx, cn, in, queues, tenant); err != nil {
			return err
		}
		switch {
		case len(list) > 0:
			fmt.Fprintf(a.stderr, "no jobs of tenant %s, but %s is a job's id: the job is listed (sluice jobs explain %s says what holds it)\n", human.Text(tenant), human.Text(tenant), human.Text(tenant))
		case notTenant != nil:
			return usagef(c, "%v; nor is it a job's id in %s (sluice jobs lists the jobs)", notTenant, queuesText(queues))
		}
	}
	if err := explainWaiting(a.ctx, cn, list); err != nil {
		return err
	}
	if o.json {
		doc := jobsDoc{Now: time.Now().UTC(), Jobs: make([]jobJSON, 0, len(list)), More: more}
		for _, j := range list {
			doc.Jobs = append(doc.Jobs, j.json())
		}
		return writeJSON(a.stdout, doc)
	}
	if len(list) == 0 {
		fmt.Fprintf(a.stderr, "no %s jobs%s in %s\n", strings.Join(states, ", "), forTenant(tenant), queuesText(queues))
		return nil
	}
	if err := writeJobs(a, list, time.Now()); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(a.stderr, "only the first %d are listed: --limit N lists more (0: all); --state or a TENANT narrows them\n", len(list))
	}
	return nil
}

func forTenant(tenant string) string {
	if tenant == "" {
		return ""
	}
	return " of tenant " + tenant
}

func queuesText(queues []string) string {
	switch len(queues) {
	case 0:
		return "any queue (none exists yet)"
	case 1:
		return "queue " + queues[0]
	}
	return "queues " + strings.Join(queues, ", ")
}

// jobQueues is --queue, checked, or every queue asynq knows.
func jobQueues(in *asynq.Inspector, queue string) ([]string, error) {
	all, err := in.Queues()
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	sort.Strings(all)
	if queue == "" {
		return all, nil
	}
	if !slices.Contains(all, queue) {
		return nil, fmt.Errorf("no queue %q; the queues are: %s", queue, strings.Join(all, ", "))
	}
	return []string{queue}, nil
}

// listJobs lists the jobs of the queues in the states (of tenant, "" for
// all), at most limit of them (-1: all); more reports that some matching
// jobs were left out.
func listJobs(in *asynq.Inspector, queues, states []string, tenant string, waiting map[string]taskspec.Priority, limit int) ([]job, bool, error) {
	var out []job
	for _, st := range states {
		for _, q := range queues {
			list := stateList(in, st)
			for page := 1; ; page++ {
				infos, err := list(q, asynq.Page(page), asynq.PageSize(jobsPageSize))
				if errors.Is(err, asynq.ErrQueueNotFound) {
					break
				}
				if err != nil {
					return nil, false, fmt.Errorf("list %s jobs of queue %s: %w", st, q, err)
				}
				for _, info := range infos {
					p, inLine := waiting[waitingKey(info.Queue, info.ID)]
					j := job{info: info, state: st, priority: p}
					if (tenant != "" && j.tenant() != tenant) || (st == "waiting") != inLine {
						continue
					}
					if limit >= 0 && len(out) == limit {
						return out, true, nil
					}
					out = append(out, j)
				}
				if len(infos) < jobsPageSize {
					break
				}
			}
		}
	}
	return out, false, nil
}

// stateList is the inspector's listing of a state; waiting jobs are among
// the scheduled ones.
func stateList(in *asynq.Inspector, state string) func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error) {
	switch state {
	case "active":
		return in.ListActiveTasks
	case "pending":
		return in.ListPendingTasks
	case "retry":
		return in.ListRetryTasks
	case "archived":
		return in.ListArchivedTasks
	}
	return in.ListScheduledTasks
}

func (j job) json() jobJSON {
	i := j.info
	out := jobJSON{
		ID: i.ID, Queue: i.Queue, State: j.state, Tenant: j.tenant(), Type: i.Type,
		Retried: i.Retried, MaxRetry: i.MaxRetry, LastError: i.LastErr, Payload: string(i.Payload),
		LastFailedAt: timePtr(i.LastFailedAt),
	}
	if j.state != "archived" && j.state != "active" {
		out.NextProcessAt = timePtr(i.NextProcessAt)
	}
	if x := j.expect; x != nil {
		out.ExpectedStart, out.HeldBy = timePtr(x.Expected), x.HeldBy
	}
	if j.state == "waiting" {
		out.Priority = j.priority.String()
	}
	return out
}

// priorityTag marks a waiting job's state with its priority when it is
// not normal: "waiting (high)".
func priorityTag(p taskspec.Priority) string {
	if p == taskspec.PriorityNormal {
		return ""
	}
	return " (" + p.String() + ")"
}

// lastErrorWidth is how much of a job's last error the table shows.
const lastErrorWidth = 80

func writeJobs(a *app, list []job, now time.Time) error {
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "ID\tTENANT\tTYPE\tQUEUE\tSTATE\tRETRIED\tNEXT RUN\tLAST ERROR")
	for _, j := range list {
		i := j.info
		tenant := j.tenant()
		if tenant == "" {
			tenant = "-"
		}
		lastErr := "-"
		if i.LastErr != "" {
			lastErr = human.Line(i.LastErr, lastErrorWidth)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", human.Text(i.ID), human.Text(tenant), human.Text(i.Type), human.Text(i.Queue), j.state+priorityTag(j.priority), i.Retried, i.MaxRetry, nextRun(j, now), lastErr)
	}
	return tw.Flush()
}

// nextRun says when asynq runs the job next: a waiting job when it is
// expected to start (asynq's time is only its fallback).
func nextRun(j job, now time.Time) string {
	switch j.state {
	case "active":
		return "running"
	case "pending":
		return "now"
	case "waiting":
		return expectedRun(j)
	case "archived":
		return "-"
	}
	if d := j.info.NextProcessAt.Sub(now); d > 0 {
		return "in " + short(d)
	}
	return "now"
}

// jobsByID are the jobs with task id id in queues, in whatever state.
func jobsByID(ctx context.Context, cn *conn, in *asynq.Inspector, queues []string, id string) ([]job, error) {
	found, err := tasksNamed(in, queues, id)
	if err != nil {
		return nil, err
	}
	var out []job
	for _, info := range found {
		j := job{info: info, state: info.State.String()}
		if tenant := j.tenant(); info.State == asynq.TaskStateScheduled && names.Tenant(tenant) == nil {
			waiting, err := waitingIDs(ctx, cn, tenant, queues)
			if err != nil {
				return nil, err
			}
			if p, ok := waiting[waitingKey(info.Queue, info.ID)]; ok {
				j.state, j.priority = "waiting", p
			}
		}
		out = append(out, j)
	}
	return out, nil
}

// tasksNamed are the tasks with id in queues (one, unless a producer gave
// the same id in several queues).
func tasksNamed(in *asynq.Inspector, queues []string, id string) ([]*asynq.TaskInfo, error) {
	var found []*asynq.TaskInfo
	for _, q := range queues {
		info, err := in.GetTaskInfo(q, id)
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look for task %s in queue %s: %w", id, q, err)
		}
		found = append(found, info)
	}
	return found, nil
}

// findTask finds the task id in --queue or in every queue.
func findTask(c *command, in *asynq.Inspector, queue, id string) (*asynq.TaskInfo, error) {
	queues, err := jobQueues(in, queue)
	if err != nil {
		return nil, err
	}
	found, err := tasksNamed(in, queues, id)
	if err != nil {
		return nil, err
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no task %s in %s (a job that finished is gone); sluice jobs lists the jobs", human.Text(id), queuesText(queues))
	case 1:
		return found[0], nil
	}
	var qs []string
	for _, f := range found {
		qs = append(qs, f.Queue)
	}
	return nil, usagef(c, "task %s is in queues %s: give the one you mean with --queue", id, strings.Join(qs, ", "))
}

// describeTask names a task in one line.
func describeTask(i *asynq.TaskInfo) string {
	tenant := i.Headers[taskspec.TenantHeader]
	if tenant == "" {
		tenant = "-"
	}
	return fmt.Sprintf("task %s (type %s, tenant %s, queue %s)", human.Text(i.ID), human.Text(i.Type), human.Text(tenant), human.Text(i.Queue))
}

func jobsRun(a *app, c *command, o *opts, args []string) error {
	return withTask(a, c, o, args, func(cn *conn, in *asynq.Inspector, info *asynq.TaskInfo) error {
		switch info.State {
		case asynq.TaskStatePending:
			fmt.Fprintf(a.stdout, "%s is pending already: a worker takes it next; nothing changed\n", describeTask(info))
			return nil
		case asynq.TaskStateActive:
			return fmt.Errorf("%s is running now; nothing changed", describeTask(info))
		}
		was := info.State.String()
		if tenant := info.Headers[taskspec.TenantHeader]; info.State == asynq.TaskStateScheduled && names.Tenant(tenant) == nil {
			if waiting, err := waitingIDs(a.ctx, cn, tenant, nil); err == nil {
				if _, ok := waiting[waitingKey(info.Queue, info.ID)]; ok {
					was = "waiting in its tenant's line"
				}
			}
		}
		if err := in.RunTask(info.Queue, info.ID); err != nil {
			return fmt.Errorf("run %s: %w", describeTask(info), err)
		}
		fmt.Fprintf(a.stdout, "%s was %s; now pending: a worker takes it next (it still passes its tenant's limits)\n", describeTask(info), was)
		return nil
	})
}

func jobsDelete(a *app, c *command, o *opts, args []string) error {
	return withTask(a, c, o, args, func(cn *conn, in *asynq.Inspector, info *asynq.TaskInfo) error {
		if info.State == asynq.TaskStateActive {
			return fmt.Errorf("%s is running now and cannot be deleted; nothing changed (run sluice jobs again when it ends)", describeTask(info))
		}
		if err := in.DeleteTask(info.Queue, info.ID); err != nil {
			return fmt.Errorf("delete %s: %w", describeTask(info), err)
		}
		// A job waiting in its tenant's line leaves its entry behind: the
		// pump drops it, and counts it, when it reaches the head.
		fmt.Fprintf(a.stdout, "deleted %s (it was %s)\n", describeTask(info), info.State)
		return nil
	})
}

// withTask finds the task of the command line's ID and calls f with it.
func withTask(a *app, c *command, o *opts, args []string, f func(*conn, *asynq.Inspector, *asynq.TaskInfo) error) error {
	if err := wantArgs(c, args, 1, 1, "ID"); err != nil {
		return err
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	in := asynq.NewInspectorFromRedisClient(cn.client)
	info, err := findTask(c, in, o.queue, args[0])
	if err != nil {
		return err
	}
	return f(cn, in, info)
}
