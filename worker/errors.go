package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// RetryAfterError is returned by a handler that learned its downstream is
// saturated (an HTTP 429 or 503 with Retry-After): the gate pauses the
// job's tenant for Delay (throttle.Limiter.Cooldown) and defers the job,
// which is not counted as a failure. Make one with RetryAfter.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
	// guessed: the downstream named no delay (the built-in http handler's
	// 429 or 503 without Retry-After or a used-up quota), Delay is
	// RetryAfterDefault; a tenant whose policy adapts is not paused then
	guessed bool
}

// RetryAfter returns the error a handler returns to pause its tenant for d
// and retry the job after it. err says why and may be nil.
func RetryAfter(d time.Duration, err error) error {
	return &RetryAfterError{Delay: d, Err: err}
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %s", e.Delay)
	}
	return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// Reasons a job is deferred, as found in DeferError.Reason and in the
// deferrals metric.
const (
	// ReasonThrottled: a rule of the job's policy denied it.
	ReasonThrottled = "throttled"
	// ReasonCooldown: the handler returned RetryAfter.
	ReasonCooldown = "cooldown"
	// ReasonUnavailable: the gate could not reach Redis and the policy
	// fails closed.
	ReasonUnavailable = "unavailable"
	// ReasonCost: the job costs more than its policy can ever admit; a
	// policy change may fix it, so it is deferred with backoff and logged.
	ReasonCost = "cost"
	// ReasonPolicy: a policy the job needs is stored in Redis but cannot
	// be read (not valid JSON, or rules that do not parse); it is deferred
	// with backoff and logged until the policy is replaced.
	ReasonPolicy = "policy"
	// ReasonShutdown: the worker stopped while the job waited for its slot.
	ReasonShutdown = "shutdown"
)

// DeferError is what the gate returns to asynq for a job it defers: asynq
// schedules the job again at At without counting a failure or using a
// retry (the hooks set by Gate.Configure see to it). A job at its retry
// limit cannot be retried by asynq without being archived: the gate then
// enqueues a copy for At and the error also matches asynq.RevokeTask.
type DeferError struct {
	Tenant string
	// Reason is one of the Reason constants.
	Reason string
	// Rule and Policy name what denied the job, when a rule did.
	Rule, Policy string
	// RetryAfter is how long until the job may start, as decided.
	RetryAfter time.Duration
	// At is when asynq should bring the job back.
	At time.Time
	// CopyID is the task id of the copy enqueued for a job at its retry
	// limit; empty otherwise.
	CopyID string
	// Err is the handler's error behind a cooldown, or the gate's error
	// behind ReasonUnavailable, ReasonCost and ReasonPolicy.
	Err error
}

func (e *DeferError) Error() string {
	s := fmt.Sprintf("deferred (%s) for tenant %q", e.Reason, e.Tenant)
	if e.Rule != "" {
		s += fmt.Sprintf(" by %s %s", e.Policy, e.Rule)
	}
	s += fmt.Sprintf(": retry after %s", e.RetryAfter.Round(time.Millisecond))
	if e.CopyID != "" {
		s += fmt.Sprintf(" as task %s (the task was at its retry limit)", e.CopyID)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error, and asynq.RevokeTask when a copy
// carries the job on, so asynq deletes the task instead of archiving it.
func (e *DeferError) Unwrap() []error {
	var out []error
	if e.Err != nil {
		out = append(out, e.Err)
	}
	if e.CopyID != "" {
		out = append(out, asynq.RevokeTask)
	}
	return out
}

// DropError is what the gate returns for a job its policy drops when
// denied (overflow=drop). It wraps asynq.SkipRetry, so asynq archives the
// job; its message, the archived task's last error, starts with
// "throttled".
type DropError struct {
	Tenant       string
	Rule, Policy string
	RetryAfter   time.Duration
}

func (e *DropError) Error() string {
	return fmt.Sprintf("throttled: tenant %q denied by %s %s (overflow=drop; it could start in %s)", e.Tenant, e.Policy, e.Rule, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap returns asynq.SkipRetry.
func (e *DropError) Unwrap() error { return asynq.SkipRetry }

// IsThrottled reports whether err is the gate's deferral or drop of a job
// (rather than an error of its handler).
func IsThrottled(err error) bool {
	var de *DeferError
	var dr *DropError
	return errors.As(err, &de) || errors.As(err, &dr)
}
