package main

import (
	"context"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// sample is the state of asynq's queue and of Redis at one moment of a run.
type sample struct {
	At        time.Duration // since the run's start
	Pending   int64         // tasks waiting in the pending list
	Active    int64
	Scheduled int64   // scheduled for later (parked in sluice's waiting room, or deferred)
	Retry     int64   // waiting to be retried (asynq's retry set)
	RedisCPU  float64 // used_cpu_user + used_cpu_sys, seconds since Redis started
	// CPU seconds used so far by the worker processes and by this
	// program, and by the machine's cores: busy and in all (see cpu.go)
	WorkersCPU, BenchCPU      float64
	MachineBusy, MachineTotal float64
}

// sampleEvery is how often the sampler looks.
const sampleEvery = time.Second

// Keys of asynq v0.26's "default" queue.
const (
	pendingKey   = "asynq:{default}:pending"
	activeKey    = "asynq:{default}:active"
	scheduledKey = "asynq:{default}:scheduled"
	retryKey     = "asynq:{default}:retry"
)

// sampleQueue records a sample every sampleEvery until ctx ends and
// returns them. It costs Redis four O(1) commands and an INFO a second;
// workers are the worker processes' pids.
func sampleQueue(ctx context.Context, c *redis.Client, start time.Time, workers []int) []sample {
	var out []sample
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		pipe := c.Pipeline()
		pending, active := pipe.LLen(qctx, pendingKey), pipe.LLen(qctx, activeKey)
		scheduled, retry := pipe.ZCard(qctx, scheduledKey), pipe.ZCard(qctx, retryKey)
		info := pipe.Info(qctx, "cpu")
		_, err := pipe.Exec(qctx)
		cancel()
		if err != nil {
			continue
		}
		s := sample{At: time.Since(start), Pending: pending.Val(), Active: active.Val(), Scheduled: scheduled.Val(), Retry: retry.Val()}
		sys, _ := infoField(info.Val(), "used_cpu_sys")
		user, _ := infoField(info.Val(), "used_cpu_user")
		s.RedisCPU = sys + user
		for _, pid := range workers {
			if c, err := procCPU(pid); err == nil {
				s.WorkersCPU += c
			}
		}
		s.BenchCPU, _ = procCPU(os.Getpid())
		s.MachineBusy, s.MachineTotal, _ = machineCPU()
		out = append(out, s)
	}
}

// redisBusy is the highest share of one core Redis used, averaged over
// any window of w, from the samples.
func redisBusy(samples []sample, w time.Duration) float64 {
	best := 0.0
	j := 0
	for i := range samples {
		for j < i && samples[i].At-samples[j].At > w {
			j++
		}
		if d := (samples[i].At - samples[j].At).Seconds(); d >= w.Seconds()/2 && d > 0 {
			best = max(best, (samples[i].RedisCPU-samples[j].RedisCPU)/d)
		}
	}
	return best
}

// peakPending is the longest the pending list was.
func peakPending(samples []sample) int64 {
	var most int64
	for _, s := range samples {
		most = max(most, s.Pending)
	}
	return most
}

// maxPending is the longest the pending list was in the samples from
// from to to (0 when none was taken then).
func maxPending(samples []sample, from, to time.Duration) int64 {
	var most int64
	for _, s := range samples {
		if s.At >= from && s.At <= to {
			most = max(most, s.Pending)
		}
	}
	return most
}
