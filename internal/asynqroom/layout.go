package asynqroom

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// asynqModule is asynq's module path, as build info names it.
const asynqModule = "github.com/hibiken/asynq"

// KnownVersions are the asynq versions whose key layout this package and
// lua/handover.lua, lua/recover.lua write.
var KnownVersions = []string{"v0.26.0"}

// LayoutError says that the waiting room must not run: the asynq this
// program is built with is not a version sluice knows, or its keys are not
// laid out as sluice writes them. Jobs then skip the room: producers send
// them straight to asynq and the gate decides on them, as on jobs from
// asynq's own client.
type LayoutError struct {
	// Version is asynq's version from the build info; "" when the build
	// info does not say (a test binary, or a build without modules).
	Version string
	// Reason says what did not match.
	Reason string
}

func (e *LayoutError) Error() string {
	v := e.Version
	if v == "" {
		v = "unknown version"
	}
	return fmt.Sprintf("sluice's waiting room is off: asynq %s: %s (sluice writes the keys of asynq %s); jobs skip the room and the gate alone throttles them; use the asynq version sluice's go.mod names, or a sluice release made for this one", v, e.Reason, strings.Join(KnownVersions, ", "))
}

// simulated holds, for tests, the asynq version a client's checks report
// instead of the build info's.
var simulated sync.Map // redis.UniversalClient -> string

// SimulateVersion makes the layout checks over client report asynq
// version v, as if the program were built with it: for tests of the
// refusal; "" ends it.
func SimulateVersion(client redis.UniversalClient, v string) {
	if v == "" {
		simulated.Delete(client)
		return
	}
	simulated.Store(client, v)
}

// buildVersion is asynq's version from the build info: "" when the build
// info does not list it (test binaries do not), or when asynq is replaced
// by a directory ("(devel)"): the probe alone decides then.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range bi.Deps {
		if d.Path != asynqModule {
			continue
		}
		if d.Replace != nil {
			d = d.Replace
		}
		if d.Version == "(devel)" {
			return ""
		}
		return d.Version
	}
	return ""
}

// Layout checks, once per process part that writes asynq's keys, that
// asynq's version and key layout are the ones sluice knows. It is safe
// for concurrent use.
type Layout struct {
	client    redis.UniversalClient
	inspector *asynq.Inspector

	mu      sync.Mutex
	checked bool
	err     error // the verdict once checked: nil, or a *LayoutError
}

// NewLayout returns the checks over asynq's Redis client.
func NewLayout(client redis.UniversalClient) *Layout {
	return &Layout{client: client, inspector: asynq.NewInspectorFromRedisClient(client)}
}

// Check returns nil when the waiting room may run, a *LayoutError when it
// must not (for good: the verdict is kept), or another error when it could
// not tell (Redis could not be reached); it checks again on the next call
// then. The version is read from the build info; the layout by a probe
// (see probe).
func (l *Layout) Check(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checked {
		return l.err
	}
	v := buildVersion()
	if s, ok := simulated.Load(l.client); ok {
		v, _ = s.(string)
	}
	if v != "" && !slices.Contains(KnownVersions, v) {
		l.checked, l.err = true, &LayoutError{Version: v, Reason: "not a version sluice knows"}
		return l.err
	}
	err := l.probe(ctx)
	var le *LayoutError
	if errors.As(err, &le) {
		le.Version = v
	} else if err != nil {
		return err
	}
	l.checked, l.err = true, err
	return err
}

// Checked reports whether Check reached a verdict, and the verdict.
func (l *Layout) Checked() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checked, l.err
}

// probe enqueues a task with asynq's own client, parked an hour ahead in
// a private queue, checks that it sits where handover.lua expects it (its
// hash, with state scheduled, in the queue's schedule), hands it over with
// handover.lua, checks that asynq's Inspector sees it pending, and
// deletes it and the queue.
func (l *Layout) probe(ctx context.Context) (err error) {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	queue := "sluice-probe-" + hex.EncodeToString(b[:])
	id := "probe"
	ac := asynq.NewClientFromRedisClient(l.client)
	if _, err := ac.EnqueueContext(ctx, asynq.NewTask("sluice:probe", nil), asynq.Queue(queue), asynq.TaskID(id),
		asynq.ProcessIn(time.Hour), asynq.MaxRetry(0)); err != nil {
		return fmt.Errorf("probe asynq's layout: enqueue: %w", err)
	}
	defer func() {
		// a clean-up that fails is reported with the probe's own result
		// (a *LayoutError stays one for errors.As)
		if derr := l.inspector.DeleteTask(queue, id); derr != nil && !errors.Is(derr, asynq.ErrTaskNotFound) {
			err = errors.Join(err, fmt.Errorf("probe asynq's layout: delete the probe task %s of queue %q: %w", id, queue, derr))
		}
		if derr := l.inspector.DeleteQueue(queue, true); derr != nil && !errors.Is(derr, asynq.ErrQueueNotFound) {
			err = errors.Join(err, fmt.Errorf("probe asynq's layout: delete the probe queue %q: %w", queue, derr))
		}
	}()
	pipe := l.client.Pipeline()
	state := pipe.HGet(ctx, TaskKey(queue, id), "state")
	parked := pipe.ZScore(ctx, queuePrefix(queue)+"scheduled", id)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("probe asynq's layout: %w", err)
	}
	switch {
	case state.Err() != nil || state.Val() != "scheduled":
		return &LayoutError{Reason: fmt.Sprintf("a parked task's hash %s has no state \"scheduled\" (got %q)", TaskKey(queue, id), state.Val())}
	case parked.Err() != nil:
		return &LayoutError{Reason: fmt.Sprintf("a parked task is not in the schedule %sscheduled", queuePrefix(queue))}
	}
	res := Handover(l.client, false)(ctx, []waitroom.Promoted{{Queue: queue, ID: id}})
	if res[0] == waitroom.Failed {
		return fmt.Errorf("probe asynq's layout: the hand-over failed (Redis)")
	}
	if res[0] != waitroom.Handed {
		return &LayoutError{Reason: "the hand-over did not find the parked task where it expects it"}
	}
	info, err := l.inspector.GetTaskInfo(queue, id)
	if err != nil {
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			return &LayoutError{Reason: "asynq's Inspector cannot find the task handed over"}
		}
		return fmt.Errorf("probe asynq's layout: %w", err)
	}
	if info.State != asynq.TaskStatePending {
		return &LayoutError{Reason: fmt.Sprintf("asynq's Inspector sees the task handed over as %s, not pending", info.State)}
	}
	return nil
}
