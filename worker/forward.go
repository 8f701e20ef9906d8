package worker

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/asynqroom"
)

// forwardQueuesEvery is how often the forwarder reads again which queues
// the fleet serves.
const forwardQueuesEvery = 5 * time.Second

const errForward = "forward"

// forwards moves the fleet's due scheduled and deferred jobs to their
// pending lists every DelayedTaskCheckIntervalDefault, while this process holds the fleet's
// lock (the recoverer's leader), for every queue a worker of the fleet
// serves: one process of the fleet polls asynq's schedule often, so that a
// deferred job comes back before its slot, while each worker's own asynq
// forwarder polls at asynq's default (5 s), which then costs Redis the
// same whatever the fleet's size. When the holder dies, the next takes
// the lock within its life (lockTTL); meanwhile asynq's forwarders bring
// deferred jobs back at most their interval late.
func (r *recoverer) forwards(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var queues []string
	var read time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.leader.Load() {
			queues = nil
			continue
		}
		// asynq's keys are written only once their layout is known
		if ok, err := r.g.layout.Checked(); !ok || err != nil {
			continue
		}
		if queues == nil || time.Since(read) > forwardQueuesEvery {
			cctx, cancel := context.WithTimeout(ctx, r.g.cfg.CallTimeout)
			qs, err := r.fleet.Queues(cctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					r.g.m.err(errForward)
					r.g.warn(errForward, "sluice: could not read the fleet's queues to move their due jobs; asynq's own forwarders move them meanwhile", "err", err)
				}
				continue
			}
			queues, read = append(qs[:0:0], r.queues...), time.Now()
			for _, q := range qs {
				if !slices.Contains(queues, q) {
					queues = append(queues, q)
				}
			}
		}
		for _, q := range queues {
			cctx, cancel := context.WithTimeout(ctx, r.g.cfg.CallTimeout)
			_, err := asynqroom.Forward(cctx, r.asynq, q, time.Now())
			cancel()
			if err != nil && ctx.Err() == nil {
				r.g.m.err(errForward)
				r.g.warn(errForward, "sluice: could not move a queue's due jobs to its pending list; asynq's own forwarders move them meanwhile", "queue", q, "err", err)
			}
		}
	}
}
