package worker

import (
	"context"
	"errors"
	"github.com/sluicehq/sluice/internal/waitroom"
	"runtime"
	"sort"
	"time"

	"github.com/hibiken/asynq"
)

// Configure sets the asynq.Config hooks the gate needs, keeping the
// caller's own: IsFailure says a deferral is not a failure (asynq then
// neither counts it nor uses a retry), RetryDelayFunc brings a deferred job
// back at DeferError.At, and ErrorHandler no longer sees the gate's own
// decisions (deferrals and drops), only the handlers' errors, cooldowns
// included. DelayedTaskCheckInterval and TaskCheckInterval get sluice's
// defaults when zero. Call it once, before asynq.NewServer.
//
// It also starts the waiting room's pump for cfg.Queues (see Gate.Stop):
// jobs that producers (queue.Client) parked in their tenants' lines reach
// this server when they may start and the fleet has room.
func (g *Gate) Configure(cfg *asynq.Config) {
	g.setHooks(cfg)
	// without a Server's recoverer, nothing else moves deferred jobs
	// back in time: asynq's own forwarder does it often
	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = DelayedTaskCheckIntervalDefault
	}
	concurrency := cfg.Concurrency
	if concurrency < 1 {
		concurrency = runtime.NumCPU() // asynq's default
	}
	g.startPump(queuesOf(*cfg), concurrency)
}

// queuesOf are the queues an asynq server serves.
func queuesOf(cfg asynq.Config) []string {
	queues := make([]string, 0, len(cfg.Queues))
	for q := range cfg.Queues {
		queues = append(queues, q)
	}
	if len(queues) == 0 {
		queues = []string{waitroom.DefaultQueue}
	}
	sort.Strings(queues)
	return queues
}

// setHooks is Configure without the pump (Server starts it with asynq).
func (g *Gate) setHooks(cfg *asynq.Config) {
	isFailure := cfg.IsFailure
	cfg.IsFailure = func(err error) bool {
		var de *DeferError
		if errors.As(err, &de) {
			return false
		}
		if isFailure != nil {
			return isFailure(err)
		}
		return err != nil
	}
	delay := cfg.RetryDelayFunc
	if delay == nil {
		delay = asynq.DefaultRetryDelayFunc
	}
	cfg.RetryDelayFunc = func(n int, err error, t *asynq.Task) time.Duration {
		var de *DeferError
		if errors.As(err, &de) {
			return max(0, time.Until(de.At))
		}
		return delay(n, err, t)
	}
	handler := cfg.ErrorHandler
	cfg.ErrorHandler = asynq.ErrorHandlerFunc(func(ctx context.Context, task *asynq.Task, err error) {
		var de *DeferError
		var dr *DropError
		if errors.As(err, &dr) || (errors.As(err, &de) && de.Reason != ReasonCooldown) {
			return
		}
		if handler != nil {
			handler.HandleError(ctx, task, err)
		}
	})
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = TaskCheckIntervalDefault
	}
}
