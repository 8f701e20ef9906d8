package asynqroom

import (
	"sort"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/waitroom"
	"google.golang.org/protobuf/encoding/protowire"
)

// Task is a new task as asynq v0.26's client would write it: the fields
// of its task message (asynq's internal TaskMessage) that a task enqueued
// without Unique or Group has, and the options it was given, resolved as
// asynq resolves them.
type Task struct {
	ID, Queue, Type string
	Payload         []byte
	Headers         map[string]string
	// MaxRetry, Timeout, Deadline and Retention as asynq.Client composes
	// them (NewTask's defaults applied: see Compose).
	MaxRetry  int
	Timeout   time.Duration
	Deadline  time.Time // zero: none
	Retention time.Duration
}

// asynq v0.26's defaults (client.go): a task given neither a timeout nor a
// deadline gets 30 minutes of timeout.
const (
	defaultMaxRetry = 25
	defaultTimeout  = 30 * time.Minute
)

// Compose is the task asynq.Client would make of these parts and options
// (MaxRetry, Timeout, Deadline and Retention read from opts, later ones
// winning, as asynq composes them; other options are the caller's to
// handle). It reports false for an option whose task asynq would write
// otherwise than Encode does (Unique, Group): such a task is enqueued by
// asynq's client.
func Compose(id, queue, typ string, payload []byte, headers map[string]string, opts []asynq.Option) (Task, bool) {
	t := Task{ID: id, Queue: queue, Type: typ, Payload: payload, Headers: headers, MaxRetry: defaultMaxRetry}
	for _, o := range opts {
		switch o.Type() {
		case asynq.MaxRetryOpt:
			n, _ := o.Value().(int)
			t.MaxRetry = n
		case asynq.TimeoutOpt:
			t.Timeout, _ = o.Value().(time.Duration)
		case asynq.DeadlineOpt:
			t.Deadline, _ = o.Value().(time.Time)
		case asynq.RetentionOpt:
			t.Retention, _ = o.Value().(time.Duration)
		case asynq.UniqueOpt, asynq.GroupOpt:
			return Task{}, false
		}
	}
	if t.Deadline.IsZero() && t.Timeout == 0 {
		t.Timeout = defaultTimeout
	}
	return t, true
}

// Encode is the task's message as asynq's client encodes it (protobuf, the
// fields of asynq's internal/proto TaskMessage, zero values left out), so
// that asynq's servers and inspector read it as their own.
// TestEncodeMatchesAsynq pins it against asynq's own client.
func (t Task) Encode() []byte {
	var b []byte
	str := func(num protowire.Number, s string) {
		if s != "" {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, s)
		}
	}
	i64 := func(num protowire.Number, v int64) {
		if v != 0 {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	str(1, t.Type)
	if len(t.Payload) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, t.Payload)
	}
	str(3, t.ID)
	str(4, t.Queue)
	i64(5, int64(int32(t.MaxRetry)))
	i64(8, int64(t.Timeout.Seconds()))
	if !t.Deadline.IsZero() {
		i64(9, t.Deadline.Unix())
	}
	i64(12, int64(t.Retention.Seconds()))
	names := make([]string, 0, len(t.Headers))
	for k := range t.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, t.Headers[k])
		b = protowire.AppendTag(b, 15, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// Info is the asynq.TaskInfo asynq's client returns for the task, parked
// in the schedule until at.
// (its durations in whole seconds and its deadline to the second, as
// asynq's message keeps them).
func (t Task) Info(at time.Time) *asynq.TaskInfo {
	var deadline time.Time
	if !t.Deadline.IsZero() {
		deadline = time.Unix(t.Deadline.Unix(), 0)
	}
	return &asynq.TaskInfo{
		ID: t.ID, Queue: t.Queue, Type: t.Type, Payload: t.Payload, Headers: t.Headers,
		State: asynq.TaskStateScheduled, MaxRetry: int(int32(t.MaxRetry)), Timeout: t.Timeout.Truncate(time.Second), Deadline: deadline,
		Retention: t.Retention.Truncate(time.Second), NextProcessAt: at,
	}
}

// EngineTaskOf is the task as waitroom.Room.Park writes it into asynq's
// schedule.
func EngineTaskOf(t Task) waitroom.EngineTask {
	return waitroom.EngineTask{TaskKey: TaskKey(t.Queue, t.ID), ScheduleKey: ScheduledKey(t.Queue), QueuesKey: QueuesKey,
		Queue: t.Queue, ID: t.ID, Msg: t.Encode()}
}

// ScheduledKey is the sorted set of a queue's tasks scheduled for later.
func ScheduledKey(queue string) string { return queuePrefix(queue) + "scheduled" }

// QueuesKey is the set of every queue's name asynq's servers and
// inspector know of.
const QueuesKey = "asynq:queues"
