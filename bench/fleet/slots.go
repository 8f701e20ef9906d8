package main

import (
	"context"
	"slices"
	"sync"
	"time"
)

// A slot's cycle: how an asynq slot of a worker process spends its time
// from one task to the next. asynq hands a task to the handler chain
// (BaseContext is called then), the chain runs (a set-up's middleware,
// then the handler), and when it returns asynq marks the task done and
// the slot dequeues its next task, or waits for one. The worker process
// records, per job, the hand-over and the handler's start and end; what
// is left of the slots' time in a window is the time between a handler's
// end and the slot's next task: the middleware's work after the handler
// (sluice's release), asynq's done and dequeue, and any wait for a task.

// slotClock records the times of a worker process's jobs.
type slotClock struct {
	mu   sync.Mutex
	jobs []slotJob
}

// slotJob is one job's times in a worker process (unix ns).
type slotJob struct {
	handed, began, ended int64
}

type handedKey struct{}

// handed is the BaseContext of a worker process's asynq server: it marks
// when the task was handed to the handler chain.
func (c *slotClock) handed() context.Context {
	return context.WithValue(context.Background(), handedKey{}, time.Now().UnixNano())
}

// began marks a handler's start; the func it returns marks its end.
func (c *slotClock) began(ctx context.Context) func() {
	h, ok := ctx.Value(handedKey{}).(int64)
	b := time.Now().UnixNano()
	return func() {
		if !ok {
			return
		}
		e := time.Now().UnixNano()
		c.mu.Lock()
		c.jobs = append(c.jobs, slotJob{handed: h, began: b, ended: e})
		c.mu.Unlock()
	}
}

// stats sums the cycles of the slots of a process of conc slots.
func (c *slotClock) stats(conc int) slotStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slotCycle(c.jobs, conc)
}

// slotStats is a worker process's slots over the middle of its run: the
// window from the hand-over of its jobs' 20th percentile to that of their
// 80th, away from the run's ramp-up and its tail. Times in seconds.
type slotStats struct {
	Slots   int     `json:"slots"`   // the process's asynq Concurrency
	Window  float64 `json:"window"`  // the window's length
	Jobs    int64   `json:"jobs"`    // jobs handed over in the window
	Busy    float64 `json:"busy"`    // slot-seconds in the window from a job's hand-over to its handler's end
	Before  float64 `json:"before"`  // the window's jobs' time from their hand-over to their handler's start, summed
	Handler float64 `json:"handler"` // the window's jobs' handlers, summed
}

// slotCycle measures jobs of a process of conc slots (slotStats).
func slotCycle(jobs []slotJob, conc int) slotStats {
	st := slotStats{Slots: conc}
	if len(jobs) < 10 || conc < 1 {
		return st
	}
	handed := make([]int64, len(jobs))
	for i, j := range jobs {
		handed[i] = j.handed
	}
	slices.Sort(handed)
	a, b := handed[len(handed)/5], handed[len(handed)*4/5]
	if b <= a {
		return st
	}
	st.Window = float64(b-a) / 1e9
	for _, j := range jobs {
		if lo, hi := max(j.handed, a), min(j.ended, b); hi > lo {
			st.Busy += float64(hi-lo) / 1e9
		}
		if j.handed >= a && j.handed < b {
			st.Jobs++
			st.Before += float64(j.began-j.handed) / 1e9
			st.Handler += float64(j.ended-j.began) / 1e9
		}
	}
	return st
}

// slotSum is the sum of a fleet's processes' slots (saved with the run:
// its fields are exported for gob).
type slotSum struct {
	SlotTime              float64 // slot-seconds: each process's window times its slots
	Jobs                  int64
	Busy, Before, Handler float64
}

// add sums a process's slots.
func (s *slotSum) add(o slotStats) {
	if o.Jobs == 0 {
		return
	}
	s.SlotTime += o.Window * float64(o.Slots)
	s.Jobs += o.Jobs
	s.Busy += o.Busy
	s.Before += o.Before
	s.Handler += o.Handler
}

// slotCycleOf is a fleet's slots: the share of their time busy, and per
// job the time before the handler, in it, and between its end and the
// slot's next task.
type slotCycleOf struct {
	busy                     float64
	before, handler, between time.Duration
}

// cycle reads the sum; false when no process measured any.
func (s slotSum) cycle() (slotCycleOf, bool) {
	if s.Jobs == 0 || s.SlotTime <= 0 {
		return slotCycleOf{}, false
	}
	n := float64(s.Jobs)
	per := func(sec float64) time.Duration { return time.Duration(sec / n * 1e9) }
	return slotCycleOf{busy: s.Busy / s.SlotTime, before: per(s.Before), handler: per(s.Handler), between: per(s.SlotTime - s.Busy)}, true
}
