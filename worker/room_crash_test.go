package worker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/crashpoint"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestRoomCrashPoints kills a process of the waiting room at each step of
// a job's way from its producer to a worker (a SIGKILL the process sends
// itself at the step, package internal/crashpoint) and checks that every
// job still runs, none is lost, and the tenant's cap is never exceeded.
func TestRoomCrashPoints(t *testing.T) {
	bin := buildTestWorker(t)
	producer := buildTestProducer(t)
	// A producer dies: after a job took its slot, before asynq has it (the
	// job was never acknowledged: its slot frees with its lease); after
	// asynq has a parked job, before its line does (its retry, or the
	// pumps' sweep, puts it in its line; before, it waited for its
	// fallback time).
	t.Run("queue.straight", func(t *testing.T) {
		t.Parallel()
		testProducerKilled(t, bin, producer, "queue.straight")
	})
	for _, retry := range []bool{true, false} {
		name := map[bool]string{true: "queue.parked,retried", false: "queue.parked,swept"}[retry]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testProducerKilledParked(t, bin, producer, retry)
		})
	}
	// A producer dies right after it parked a job in one call (on one
	// server): the job is in its line already.
	t.Run("queue.parked-at-once", func(t *testing.T) {
		t.Parallel()
		testProducerKilledParkedAtOnce(t, bin, producer)
	})
	// A worker dies: after its pump promoted jobs, before asynq has them
	// (on one server, where a turn hands its jobs over in its own run,
	// asynq has them already: they run once, on their tickets); after
	// asynq has them, before the handing set knows; in a release that
	// handed a freed slot on, before asynq has the job. Another worker's
	// pump hands the jobs over again after the repair age.
	for _, point := range []string{"room.promoted", "room.handed-over", "room.released"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			testWorkerKilledInRoom(t, bin, point)
		})
	}
}

// crashPolicy: a rate and a short-leased cap, so that slots a dead process
// took free themselves within the test.
const crashPolicy = "rate=50/s burst=5 concurrency=3 lease=2s"

func testProducerKilled(t *testing.T, bin, producer, point string) {
	f := newFleet(t, bin)
	f.env.policy(t, "acme", crashPolicy)
	f.start(t)
	f.start(t)
	cmd := exec.Command(producer, "-redis", f.url, "-prefix", f.env.prefix, "-queue", f.env.queue,
		"-tenant", "acme", "-n", "40", "-payload", `{"ms":100}`, "-fallback", "3s")
	// the second job sent straight (only the first few are: the rest
	// wait for their slots), or the twelfth parked
	at := map[string]string{"queue.straight": "@2", "queue.parked": "@12"}[point]
	cmd.Env = append(os.Environ(), crashpoint.Env+"="+point+at)
	out, err := cmd.Output()
	require.Error(t, err, "the producer dies at %s", point)
	acked := strings.Fields(string(out))
	require.NotEmpty(t, acked)
	require.Less(t, len(acked), 40)

	// every job asynq has, acknowledged or not, runs
	ids := append([]string(nil), acked...)
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		f.env.inspector.ListPendingTasks, f.env.inspector.ListScheduledTasks, f.env.inspector.ListActiveTasks, f.env.inspector.ListRetryTasks,
	} {
		infos, err := list(f.env.queue)
		require.NoError(t, err)
		for _, i := range infos {
			if !contains(ids, i.ID) {
				ids = append(ids, i.ID)
			}
		}
	}
	f.waitDone(t, ids, time.Now(), 30*time.Second)
	starts := runs(f.records(t), nil)
	done := f.finishedIDs(t)
	for _, id := range acked {
		require.Equal(t, 1, done[id], "acknowledged job %s ran once", id)
	}
	require.LessOrEqual(t, maxConcurrent(starts, "acme"), 3)
	require.Zero(t, f.env.queueInfo(t).Archived)
	st, err := f.env.lim.Stats(context.Background(), "acme")
	require.NoError(t, err)
	t.Logf("producer killed at %s after %d acknowledged jobs: %d jobs in asynq, each ran once; %d left waiting", point, len(acked), len(ids), st.Waiting)
	require.Zero(t, st.Waiting)
}

// testProducerKilledParked kills a producer after asynq has its twelfth
// job parked, before the job's line has it, with the fallback at its
// default (an hour). With retry the producer runs again from the job it
// died at, with the same task ids: the retry puts the parked job in its
// line and succeeds (before: asynq's "conflict"). Without, the workers
// start once the job's intent is older than the sweep's age, and their
// pumps' first sweep puts it in its line. Either way every job runs, once,
// within seconds.
func testProducerKilledParked(t *testing.T, bin, producer string, retry bool) {
	if !redistest.ClusterMode() {
		t.Skip("on one server a job that waits is parked and put in its line in one call (queue.parked-at-once); the Cluster pass takes the three steps")
	}
	f := newFleet(t, bin)
	f.env.policy(t, "acme", crashPolicy)
	ctx := context.Background()
	produce := func(from int, crash bool) ([]string, error) {
		cmd := exec.Command(producer, "-redis", f.url, "-prefix", f.env.prefix, "-queue", f.env.queue,
			"-tenant", "acme", "-n", "40", "-payload", `{"ms":100}`, "-id", "job", "-from", strconv.Itoa(from))
		if crash {
			cmd.Env = append(os.Environ(), crashpoint.Env+"=queue.parked@12")
		}
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok && !crash {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return strings.Fields(string(out)), err
	}
	if retry {
		f.start(t)
		f.start(t)
	}
	acked, err := produce(0, true)
	require.Error(t, err, "the producer dies at queue.parked")
	require.GreaterOrEqual(t, len(acked), 11, "the jobs before the twelfth parked were acknowledged")
	require.Less(t, len(acked), 40)
	orphan := fmt.Sprintf("job-%d", len(acked))
	info, err := f.env.inspector.GetTaskInfo(f.env.queue, orphan)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, info.State, "the twelfth job is parked")
	require.Greater(t, time.Until(info.NextProcessAt), 50*time.Minute, "at its fallback, an hour away")
	ids := append([]string(nil), acked...)
	if retry {
		more, err := produce(len(acked), false)
		require.NoError(t, err, "the retry from the job the producer died at")
		require.Equal(t, orphan, more[0])
		ids = append(ids, more...)
	} else {
		ids = append(ids, orphan)
		// the intent ages (Redis time) before any pump sweeps
		intents := f.env.prefix + ":{t:acme}:j"
		eventually(t, 30*time.Second, func() bool {
			zs, err := f.env.client.ZRangeWithScores(ctx, intents, 0, -1).Result()
			require.NoError(t, err)
			require.Len(t, zs, 1, "the orphan's intent")
			now, err := f.env.client.Time(ctx).Result()
			require.NoError(t, err)
			return now.Sub(time.UnixMicro(int64(zs[0].Score))) > 11*time.Second
		}, "the orphan's intent is older than the sweep's age")
		f.start(t)
		f.start(t)
	}
	start := time.Now()
	f.waitDone(t, ids, start, 30*time.Second)
	took := time.Since(start)
	done := f.finishedIDs(t)
	for _, id := range ids {
		require.Equal(t, 1, done[id], "job %s ran once", id)
	}
	require.LessOrEqual(t, maxConcurrent(runs(f.records(t), nil), "acme"), 3)
	st, err := f.env.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Waiting)
	n, err := f.env.client.Exists(ctx, f.env.prefix+":{t:acme}:j").Result()
	require.NoError(t, err)
	require.Zero(t, n, "no intent is left")
	t.Logf("producer killed at queue.parked (retried: %v): all %d jobs ran once within %s of %s, the parked job's fallback an hour away",
		retry, len(ids), took.Round(100*time.Millisecond), map[bool]string{true: "the retry", false: "the workers' start"}[retry])
}

// testProducerKilledParkedAtOnce kills a producer right after it parked
// its twelfth job (no worker runs: the fleet has no room, and each job is
// parked and put in its line in one call): the job is in its line, with
// no intent left to sweep, and once workers start every job runs once.
func testProducerKilledParkedAtOnce(t *testing.T, bin, producer string) {
	if redistest.ClusterMode() {
		t.Skip("on a Cluster a producer parks a job and puts it in its line in three steps (the queue.parked cases)")
	}
	f := newFleet(t, bin)
	f.env.policy(t, "acme", crashPolicy)
	ctx := context.Background()
	cmd := exec.Command(producer, "-redis", f.url, "-prefix", f.env.prefix, "-queue", f.env.queue,
		"-tenant", "acme", "-n", "40", "-payload", `{"ms":100}`, "-id", "job")
	cmd.Env = append(os.Environ(), crashpoint.Env+"=queue.parked-at-once@12")
	out, err := cmd.Output()
	require.Error(t, err, "the producer dies at queue.parked-at-once")
	acked := strings.Fields(string(out))
	require.Len(t, acked, 11, "the jobs before the twelfth were acknowledged")
	st, err := f.env.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(12), st.Waiting, "the twelfth job is in its line too")
	n, err := f.env.client.Exists(ctx, f.env.prefix+":{t:acme}:j").Result()
	require.NoError(t, err)
	require.Zero(t, n, "no intent was recorded")
	info, err := f.env.inspector.GetTaskInfo(f.env.queue, "job-11")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, info.State, "the twelfth job is parked")

	f.start(t)
	f.start(t)
	ids := append(acked, "job-11")
	f.waitDone(t, ids, time.Now(), 30*time.Second)
	done := f.finishedIDs(t)
	for _, id := range ids {
		require.Equal(t, 1, done[id], "job %s ran once", id)
	}
	require.LessOrEqual(t, maxConcurrent(runs(f.records(t), nil), "acme"), 3)
	st, err = f.env.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Zero(t, st.Waiting)
}

func testWorkerKilledInRoom(t *testing.T, bin, point string) {
	f := newFleet(t, bin)
	payload := `{"ms":100}`
	if point == "room.promoted" {
		// short jobs: the rate binds, and the pumps promote the line
		payload = `{"ms":10}`
		f.env.policy(t, "acme", "rate=20/s concurrency=3 lease=2s")
	} else {
		f.env.policy(t, "acme", crashPolicy)
	}
	f.args = []string{"-concurrency", "8"}
	// the victim's first promotion by its pump (most jobs here are
	// promoted by releases: the cap binds), its third hand-over or release
	at := map[string]string{"room.promoted": "@1", "room.handed-over": "@3", "room.released": "@3"}[point]
	victim := f.startWith(t, []string{crashpoint.Env + "=" + point + at})
	if point != "room.promoted" {
		// (for room.promoted the victim pumps alone until it dies: a
		// second pump, woken by the same line, may take every turn)
		f.start(t)
	}
	ids := f.enqueueBatch(t, "acme", 60, payload)
	select {
	case <-victim.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not reach %s", point)
	}
	require.True(t, victim.killed(), "the worker killed itself at %s: %s", point, victim.stderr.String())
	killedAt := map[int]time.Time{victim.pid: time.Now()}
	killed := f.openOn(t, victim.pid)
	f.start(t) // a supervisor restarts it
	orph := f.waitDone(t, ids, time.Now(), 60*time.Second)
	starts := runs(f.records(t), killedAt)
	done := f.finishedIDs(t)
	// The jobs the dead worker ran: one that ended just before the kill
	// (room.released) was not yet marked done in asynq, and the fleet's
	// recoverer gives it back with the others.
	var ranOnVictim []string
	for _, s := range starts {
		if s.pid == victim.pid {
			ranOnVictim = append(ranOnVictim, s.taskID)
		}
	}
	twice := 0
	for _, id := range ids {
		require.Positive(t, done[id], "job %s ran", id)
		if done[id] > 1 {
			twice++
			require.True(t, contains(killed, id) || contains(ranOnVictim, id) || contains(orph.ids, id), "only a job the dead worker ran runs twice: %s", id)
		}
	}
	require.LessOrEqual(t, maxConcurrent(starts, "acme"), 3)
	require.Zero(t, f.env.queueInfo(t).Archived)
	eventually(t, 10*time.Second, func() bool {
		n, err := f.env.client.ZCard(context.Background(), f.env.prefix+":{t:acme}:g").Result()
		require.NoError(t, err)
		return n == 0
	}, "the handing set emptied")
	t.Logf("worker killed at %s (running %d jobs): all %d jobs ran, %d twice (killed mid-run), %s; at most %d running at once",
		point, len(killed), len(ids), twice, orph, maxConcurrent(starts, "acme"))
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// buildTestProducer compiles the crash tests' producer program.
func buildTestProducer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testproducer")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/sluicehq/sluice/worker/internal/testproducer").CombinedOutput()
	require.NoError(t, err, "go build testproducer: %s", out)
	return bin
}
