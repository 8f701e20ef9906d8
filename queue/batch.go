package queue

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/throttle"
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
// The sluice side shares round trips: each tenant's backlog is counted in
// one call for all its jobs of the batch (the first jobs in batch order are
// taken until the cap), and shaping reservations are made concurrently, so
// the limiter pipelines them. asynq v0.26 has no batch enqueue, so the tasks
// are enqueued one by one, BatchConcurrency at a time. Shaped jobs of one
// tenant get distinct slots, not necessarily in batch order.
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

	plans := make([]plan, len(tenants))
	c.parallel(len(tenants), func(t int) {
		tenant := tenants[t]
		p := c.plan(ctx, tenant)
		plans[t] = p
		if p.err != nil {
			for _, i := range byTenant[tenant] {
				res[i].Err, prepared[i] = p.err, nil
			}
			return
		}
		var ids []string
		var idx []int
		for _, i := range byTenant[tenant] {
			if err := p.checkCost(tenant, prepared[i].opts.cost); err != nil {
				res[i].Err, prepared[i] = err, nil
				continue
			}
			ids, idx = append(ids, prepared[i].id), append(idx, i)
		}
		if p.backlog == 0 || len(ids) == 0 {
			return
		}
		n, count, err := c.lim.AddBacklog(ctx, tenant, p.backlog, ids...)
		if err != nil {
			err = fmt.Errorf("enqueue batch for tenant %q: %w", tenant, err)
			for _, i := range idx {
				res[i].Err, prepared[i] = err, nil
			}
			return
		}
		for k, i := range idx {
			if k < n {
				prepared[i].counted = true
				continue
			}
			res[i].Err, prepared[i] = &throttle.BacklogError{Tenant: tenant, Backlog: count, Limit: p.backlog}, nil
		}
	})
	planOf := make(map[string]plan, len(tenants))
	for t, tenant := range tenants {
		planOf[tenant] = plans[t]
	}

	c.parallel(len(jobs), func(i int) {
		j := prepared[i]
		if j == nil {
			return
		}
		res[i].Info, res[i].Err = c.send(ctx, j, planOf[j.tenant])
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
