package worker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/asynqroom"
)

// fleetQueuesEvery is how often the lock holder reads again which queues
// the fleet serves.
const fleetQueuesEvery = 5 * time.Second

const errForward = "forward"

// fleetQueues are the queues a worker of the fleet serves (the registry's
// set, read at most every fleetQueuesEvery) with this process's own: the
// lock holder moves their due jobs and samples their lines, whichever
// queues it serves itself. A read that fails keeps the last one.
type fleetQueues struct {
	mu     sync.Mutex
	queues []string
	read   time.Time
}

func (r *recoverer) fleetQueues(ctx context.Context) ([]string, error) {
	r.fq.mu.Lock()
	defer r.fq.mu.Unlock()
	if r.fq.queues != nil && time.Since(r.fq.read) < fleetQueuesEvery {
		return r.fq.queues, nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.g.cfg.CallTimeout)
	qs, err := r.fleet.Queues(cctx)
	cancel()
	if err != nil {
		if r.fq.queues != nil {
			return r.fq.queues, err
		}
		return r.queues, err
	}
	out := append(qs[:0:0], r.queues...)
	for _, q := range qs {
		if !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	r.fq.queues, r.fq.read = out, time.Now()
	return out, nil
}

// forwards moves the fleet's due scheduled and deferred jobs to their
// pending lists every interval (DelayedTaskCheckIntervalDefault), while
// this process holds the fleet's lock, for every queue a worker of the
// fleet serves: one process polls asynq's schedule often, so that a
// deferred job comes back before its slot, while each worker's own asynq
// forwarder polls at asynq's default (5 s), which then costs Redis the
// same whatever the fleet's size. When the holder dies, the next takes
// the lock within its life (lockTTL); meanwhile asynq's forwarders bring
// deferred jobs back at most their interval late.
func (r *recoverer) forwards(ctx context.Context, interval time.Duration) {
	every(ctx, interval, func() {
		if !r.leader.Load() {
			return
		}
		// asynq's keys are written only once their layout is known
		if ok, err := r.g.layout.Checked(); !ok || err != nil {
			return
		}
		queues, err := r.fleetQueues(ctx)
		if err != nil && ctx.Err() == nil {
			r.g.m.err(errForward)
			r.g.warn(errForward, "cannot list fleet queues", "err", err)
		}
		for _, q := range queues {
			cctx, cancel := context.WithTimeout(ctx, r.g.cfg.CallTimeout)
			_, err := asynqroom.Forward(cctx, r.asynq, q, time.Now())
			cancel()
			if err != nil && ctx.Err() == nil {
				r.g.m.err(errForward)
				r.g.warn(errForward, "cannot move due jobs to pending", "queue", q, "err", err)
			}
		}
	})
}

// every calls fn every interval until ctx ends, the first time an interval
// from now.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
