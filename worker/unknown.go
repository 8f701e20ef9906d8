package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// Failing jobs in sight: a job of a type no handler is registered for, and
// a handler's error, are logged with what identifies the job, and counted.

// ErrNoHandler is matched (errors.Is) by the error a Server gives asynq for
// a job of a type none of its handlers is registered for.
var ErrNoHandler = errors.New("no handler for the task's type")

// NoHandlerError is the error a Server gives asynq for a job of a type none
// of its handlers takes. Unless Config.RetryUnknownTypes is set it also
// matches asynq.SkipRetry, so asynq archives the job at once with this
// message as its last error, instead of retrying it for days.
type NoHandlerError struct {
	Type string
	// Handled lists the patterns the server's handlers are registered for.
	Handled []string
	// TaskID is the job's task id.
	TaskID string
	// Retry is Config.RetryUnknownTypes: asynq retries the job as usual.
	Retry bool
}

func (e *NoHandlerError) Error() string {
	s := fmt.Sprintf("no handler for task type %q on this worker (it handles %s)", e.Type, handledText(e.Handled))
	if e.Retry {
		return s + "; asynq retries the job"
	}
	return s + ": archived at once, not retried; fix the type and enqueue the job again, or once a worker handles it: sluice jobs run " + e.TaskID
}

// Unwrap returns ErrNoHandler, and asynq.SkipRetry unless Retry is set.
func (e *NoHandlerError) Unwrap() []error {
	if e.Retry {
		return []error{ErrNoHandler}
	}
	return []error{ErrNoHandler, asynq.SkipRetry}
}

func handledText(patterns []string) string {
	if len(patterns) == 0 {
		return "no type: no handler is registered"
	}
	out := make([]string, len(patterns))
	for i, p := range patterns {
		if strings.HasSuffix(p, ":") {
			p += "*" // asynq's prefix patterns
		}
		out[i] = p
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// maxTypeLabels bounds the type label of the unknown-types metric: types
// come from producers, so past this many the rest count as "(other)".
const maxTypeLabels = 100

// failures watches the jobs of a Server whose type it has no handler for,
// and the errors its handlers return.
type failures struct {
	mux     *asynq.ServeMux
	handled func() []string
	retry   bool
	log     *slog.Logger
	m       *metrics
	// giveBack releases what a job the waiting room promoted holds (its
	// concurrency slot), for a job that never reaches the gate
	giveBack func(ctx context.Context, task *asynq.Task)

	mu sync.Mutex
	// unknown holds the types seen without a handler (logged once each),
	// true for those with their own metric label
	unknown map[string]bool
	errLog  map[string]*errLogState
}

// errLogState limits the error lines of one task type.
type errLogState struct {
	last       time.Time
	suppressed int
}

func newFailures(mux *asynq.ServeMux, handled func() []string, retry bool, log *slog.Logger, m *metrics, giveBack func(context.Context, *asynq.Task)) *failures {
	return &failures{mux: mux, handled: handled, retry: retry, log: log, m: m, giveBack: giveBack, unknown: map[string]bool{}, errLog: map[string]*errLogState{}}
}

// unknownTypes returns next behind a check, before the gate (a job nobody
// can run takes no throttle slot), that the job's type has a handler.
func (f *failures) unknownTypes(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if _, pattern := f.mux.Handler(task); pattern != "" {
			return next.ProcessTask(ctx, task)
		}
		id, _ := asynq.GetTaskID(ctx)
		err := &NoHandlerError{Type: task.Type(), Handled: f.handled(), TaskID: id, Retry: f.retry}
		if f.giveBack != nil {
			f.giveBack(ctx, task)
		}
		typ := task.Type()
		f.mu.Lock()
		labeled, seen := f.unknown[typ]
		remembered := seen || len(f.unknown) < 10*maxTypeLabels
		if !seen && remembered {
			labeled = len(f.unknown) < maxTypeLabels
			f.unknown[typ] = labeled
		}
		f.mu.Unlock()
		logIt := !seen
		if !remembered {
			// too many types to remember: at most a line a second for them
			_, logIt = f.allowErrLog("\x00unknown")
		}
		label := typ
		if !labeled {
			label = "(other)"
		}
		f.m.unknownTypes.WithLabelValues(label).Inc()
		if logIt {
			jobs := "archived"
			if f.retry {
				jobs = "retried" // RetryUnknownTypes
			}
			f.log.Error("no handler for task type", "type", typ, "handles", handledText(err.Handled), "task", id, "jobs", jobs)
		}
		return err
	})
}

// handlerErrors returns next (the handlers, behind the gate) with each
// error it returns logged: the task's id, type, tenant and queue, its
// retries, and the error; at most one line a second per task type, saying
// how many were left out. Deferrals by the gate never get here; a cooldown
// (RetryAfter) is logged at debug level.
func (f *failures) handlerErrors(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		err := next.ProcessTask(ctx, task)
		if err == nil || errors.Is(err, asynq.RevokeTask) {
			return err
		}
		id, _ := asynq.GetTaskID(ctx)
		q, _ := asynq.GetQueueName(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		maxRetry, _ := asynq.GetMaxRetry(ctx)
		a, _ := AdmissionFrom(ctx)
		attrs := []any{"task", id, "type", task.Type(), "tenant", a.Tenant, "queue", q, "retried", retried, "max_retry", maxRetry}
		var ra *RetryAfterError
		if errors.As(err, &ra) {
			f.log.Debug("handler paused tenant; job deferred", append(attrs, "retry_after", ra.Delay, "err", err)...)
			return err
		}
		suppressed, ok := f.allowErrLog(task.Type())
		if !ok {
			return err
		}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed", suppressed)
		}
		attrs = append(attrs, "err", err.Error())
		if errors.Is(err, asynq.SkipRetry) || retried >= maxRetry {
			f.log.Error("job failed for good", attrs...)
		} else {
			f.log.Warn("job failed; will retry", attrs...)
		}
		return err
	})
}

// allowErrLog reports whether an error of a job of type typ may be logged
// now, and how many were left out since the last one that was.
func (f *failures) allowErrLog(typ string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.errLog[typ]
	if st == nil {
		if len(f.errLog) >= 10*maxTypeLabels {
			clear(f.errLog)
		}
		st = &errLogState{}
		f.errLog[typ] = st
	}
	now := time.Now()
	if now.Sub(st.last) < time.Second {
		st.suppressed++
		return 0, false
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	return n, true
}
