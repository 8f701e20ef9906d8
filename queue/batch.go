package queue

import (
	"context"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// Job is one item of EnqueueBatch: the arguments of one Enqueue call.
type Job struct {
	Tenant  string
	Task    *asynq.Task
	Options []asynq.Option
}

// Result is the outcome of one Job: the task's info, or the error Enqueue
// would have returned for it.
type Result struct {
	Info *asynq.TaskInfo
	Err  error
}

// EnqueueBatch enqueues jobs and returns one Result per job, in order; a
// job that fails never stops the others, and none is left without a result.
//
// The sluice side shares round trips: the jobs' arrivals at the waiting
// room are decided concurrently, so the limiter runs many in one script
// call, and each tenant's waiting jobs join its line in one call, in
// batch order (the first jobs are taken until a backlog cap). asynq v0.26
// has no batch enqueue, so the tasks are enqueued one by one,
// BatchConcurrency at a time.
func (c *Client) EnqueueBatch(ctx context.Context, jobs []Job) []Result {
	res := make([]Result, len(jobs))
	prepared := make([]*job, len(jobs))
	now := time.Now()
	type key struct{ queue, id string }
	seen := map[key]int{}
	byTenant := map[string][]int{}
	var tenants []string
	for i, jb := range jobs {
		j, err := c.prepare(jb.Tenant, jb.Task, jb.Options, now)
		if err != nil {
			res[i].Err = err
			continue
		}
		if j.opts.taskID != "" {
			k := key{j.opts.queue, j.id}
			if first, dup := seen[k]; dup {
				res[i].Err = &InvalidError{Field: "option", Value: asynq.TaskID(j.id).String(), Reason: fmt.Sprintf("jobs[%d] of the batch already has this task id in queue %q; give each job its own id, or leave TaskID unset", first, j.opts.queue)}
				continue
			}
			seen[k] = i
		}
		prepared[i] = j
		if _, ok := byTenant[j.tenant]; !ok {
			tenants = append(tenants, j.tenant)
		}
		byTenant[j.tenant] = append(byTenant[j.tenant], i)
	}

	// every tenant's policies, resolved once for all its jobs
	c.parallel(len(tenants), func(t int) {
		idx := byTenant[tenants[t]]
		if err := c.resolve(ctx, prepared[idx[0]]); err != nil {
			for _, i := range idx {
				res[i].Err, prepared[i] = err, nil
			}
			return
		}
		for _, i := range idx[1:] {
			prepared[i].policies = prepared[idx[0]].policies
		}
	})

	// arrivals, and the tasks to asynq: straight, scheduled or parked
	c.parallel(len(jobs), func(i int) {
		j := prepared[i]
		if j == nil {
			return
		}
		var err error
		j.skipRoom = !c.roomOn(ctx)
		if j.later() {
			res[i].Info, err = c.sendLater(ctx, j)
		} else if err = c.arrive(ctx, j, c.gauge.Take(ctx, j.opts.queue)); err == nil {
			if j.arrived.Straight {
				res[i].Info, err = c.sendStraight(ctx, j)
			} else {
				res[i].Info, err = c.park(ctx, j)
			}
		}
		if err != nil || j.later() || j.arrived.Straight {
			res[i].Err, prepared[i] = err, nil
		}
	})

	// the parked jobs join their lines, each tenant's line of a queue in
	// batch order
	type line struct{ tenant, queue string }
	var lines []line
	byLine := map[line][]int{}
	for _, tenant := range tenants {
		for _, i := range byTenant[tenant] {
			if j := prepared[i]; j != nil {
				l := line{tenant, j.opts.queue}
				if _, ok := byLine[l]; !ok {
					lines = append(lines, l)
				}
				byLine[l] = append(byLine[l], i)
			}
		}
	}
	c.parallel(len(lines), func(n int) {
		idx := byLine[lines[n]]
		waiters := make([]waitroom.Waiter, len(idx))
		for k, i := range idx {
			waiters[k] = prepared[i].waiter()
		}
		joined, _, err := c.room.JoinArrived(ctx, lines[n].tenant, prepared[idx[0]].arrived.Backlog, waiters...)
		for k, i := range idx {
			if k >= joined {
				res[i].Info, res[i].Err = nil, c.unpark(ctx, prepared[i], err)
			}
		}
	})
	return res
}

// parallel calls fn(0..n-1) with at most BatchConcurrency calls at once.
func (c *Client) parallel(n int, fn func(i int)) {
	workers := min(n, c.cfg.BatchConcurrency)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}
