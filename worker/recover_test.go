package worker_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	fleetreg "github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/worker"
)

// TestRecover checks that a fault costs about one lease (the worker's
// RecoverLease), not asynq's one to two minutes: the jobs a SIGKILLed
// worker ran, and those a Redis restart left in asynq's active list with
// nobody running them, run again within the lease plus a few seconds.
// Like TestFaults its subtests run one after the other, before the
// package's parallel tests; the figures are logged (go test -v -run
// TestRecover ./worker/).
func TestRecover(t *testing.T) {
	bin := buildTestWorker(t)
	t.Run("WorkerKilled", func(t *testing.T) { testRecoverWorkerKilled(t, bin) })
	t.Run("RedisRestart", func(t *testing.T) {
		redistest.SkipOnCluster(t, "kills and restarts a private single server")
		testRecoverRedisRestart(t, bin)
	})
}

// recoverSlack is what the recovery may take beyond the lease: the
// recoverer's lock passing to a survivor when the dead worker held it
// (its life is 3 s, and a survivor beats every lease/3), a check a second,
// and the dequeue and admission; more on a busy shared machine.
const recoverSlack = 5 * time.Second

// testRecoverWorkerKilled SIGKILLs the worker holding the recoverer's lock
// (the worst case: the lock must pass to a survivor first) while it runs
// jobs of a tenant whose concurrency lease (30 s) outlives the recovery,
// so that a recovered job is admitted only if it keeps its own slot.
func testRecoverWorkerKilled(t *testing.T, bin string) {
	const lease = 3 * time.Second
	f := newFleet(t, bin)
	f.args = []string{"-recover-lease", lease.String(), "-concurrency", "6"}
	const limit = 6
	f.env.policy(t, "acme", fmt.Sprintf("concurrency=%d lease=30s", limit))
	procs := []*proc{f.start(t), f.start(t), f.start(t)}
	var ids []string
	ids = append(ids, f.enqueueBatch(t, "acme", 100, `{"ms":700}`, asynq.MaxRetry(3))...)
	// At their retry limit: asynq's recoverer would archive them.
	ids = append(ids, f.enqueueBatch(t, "acme", 20, `{"ms":700}`, asynq.MaxRetry(0))...)

	// The lock holder, once it runs jobs and its records name them all (a
	// job killed before its start was recorded is the orphan check's, in
	// about 10 s: not what this test times).
	lockKey := f.env.prefix + ":{r}:recover"
	var victim *proc
	var recorded map[string]string
	poll(t, 30*time.Second, 20*time.Millisecond, func() bool {
		holder, err := f.client.Get(context.Background(), lockKey).Result()
		if err != nil {
			return false
		}
		for _, p := range procs {
			if !strings.Contains(holder, ":"+strconv.Itoa(p.pid)+":") {
				continue
			}
			open := f.openOn(t, p.pid)
			var err error
			recorded, err = f.client.HGetAll(context.Background(), f.env.prefix+":{r}:w:"+holder).Result()
			if err != nil || len(open) == 0 {
				return false
			}
			for _, id := range open {
				if _, ok := recorded[id]; !ok {
					return false
				}
			}
			victim = p
			return true
		}
		return false
	}, "the recoverer's lock holder running jobs it recorded")
	killedAt := f.kill(t, victim)
	killed := f.openOn(t, victim.pid)
	require.NotEmpty(t, killed)

	f.waitFinished(t, len(ids), 60*time.Second)
	starts := runs(f.records(t), map[int]time.Time{victim.pid: killedAt})
	var worst time.Duration
	for _, id := range killed {
		var again time.Time
		for _, s := range starts {
			if s.taskID == id && s.at.After(killedAt) && (again.IsZero() || s.at.Before(again)) {
				again = s.at
			}
		}
		require.False(t, again.IsZero(), "killed job %s ran again", id)
		if _, ok := recorded[id]; !ok {
			// it started between the look at the records and the kill
			continue
		}
		worst = max(worst, again.Sub(killedAt))
		require.LessOrEqual(t, again.Sub(killedAt), lease+recoverSlack, "killed job %s ran again within the lease (%s) and %s", id, lease, recoverSlack)
	}
	retried := 0
	for _, s := range starts {
		retried += min(s.retried, 1)
	}
	jobs, copies := jobRuns(starts)
	most := maxConcurrent(jobs, "acme")
	last := starts[0].end
	for _, s := range starts {
		if s.end.After(last) {
			last = s.end
		}
	}
	t.Logf("RecoverLease %s; the worker holding the recoverer's lock SIGKILLed while running %d job(s): each ran again at most %s after the kill (bound %s); all %d jobs done, the last %s after the kill, none archived; %d start(s) with a retry counted; at most %d running at once (cap %d, concurrency lease 30 s: the recovered jobs kept their slots); %d run(s) overlapping another of the same job",
		lease, len(killed), worst.Round(time.Millisecond), lease+recoverSlack, len(ids), last.Sub(killedAt).Round(time.Millisecond), retried, most, limit, copies)
	require.Zero(t, retried, "a give-back is not a failed attempt")
	require.LessOrEqual(t, most, limit)
	require.Zero(t, f.env.queueInfo(t).Archived)
}

// testRecoverRedisRestart kills Redis (SIGKILL, AOF) while jobs flow and
// starts it again: jobs whose completion asynq could not write while
// Redis was down stay in asynq's active list with nobody running them,
// until the recoverer finds them (their asynq lease unextended for 10 s).
func testRecoverRedisRestart(t *testing.T, bin string) {
	const lease = 3 * time.Second
	server := redistest.NewServer(t, &redistest.Options{AppendOnly: true})
	f := newFleetOn(t, bin, server, true)
	f.args = []string{"-backoff-max", "2s", "-recover-lease", lease.String()}
	const rate, conc = 20, 2
	f.env.policy(t, "acme", fmt.Sprintf("rate=%d/s burst=3", rate))
	f.env.policy(t, "beta", fmt.Sprintf("concurrency=%d lease=2s", conc))
	procs := []*proc{f.start(t), f.start(t), f.start(t)}
	var ids []string
	ids = append(ids, f.enqueueBatch(t, "acme", 200, `{"ms":300}`)...)
	ids = append(ids, f.enqueueBatch(t, "beta", 40, `{"ms":200}`)...)
	poll(t, 30*time.Second, 50*time.Millisecond, func() bool { return len(startsOf(runs(f.records(t), nil), "acme")) >= 60 }, "60 of acme's jobs started")

	down := time.Now()
	server.Kill()
	time.Sleep(2 * time.Second) // the fault itself: Redis down 2 s, as the issue measured
	require.NoError(t, server.Restart())
	up := time.Now()
	f.waitFinished(t, len(ids), 90*time.Second)
	// Done is when asynq has done with every job too: a job whose
	// completion asynq could not write while Redis was down is still in
	// its active list, and would run again when given back.
	poll(t, 150*time.Second, 100*time.Millisecond, func() bool {
		info := f.env.queueInfo(t)
		return info.Pending+info.Active+info.Scheduled+info.Retry == 0
	}, "asynq's queue empty")
	empty := time.Now()
	requireAllAlive(t, procs)

	starts := runs(f.records(t), nil)
	// What was left when Redis came back, at the tenants' limits: acme's
	// jobs at its rate, beta's at its concurrency.
	left := map[string]int{}
	for _, s := range starts {
		if !s.at.Before(up) {
			left[s.tenant]++
		}
	}
	remaining := max(time.Duration(left["acme"])*time.Second/rate, time.Duration(left["beta"])*200*time.Millisecond/conc)
	var last time.Time
	for _, s := range starts {
		if s.end.After(last) {
			last = s.end
		}
	}
	took := max(last.Sub(up), empty.Sub(up))
	// Orphans are found once their asynq lease has gone 10 s unextended.
	bound := remaining + 10*time.Second + recoverSlack
	info := f.env.queueInfo(t)
	// acme's rate once Redis was back: the first starts of its jobs that
	// had not started before (a job run again is not new work), over their
	// span
	first := map[string]time.Time{}
	for _, s := range starts {
		if f, ok := first[s.taskID]; s.tenant == "acme" && (!ok || s.at.Before(f)) {
			first[s.taskID] = s.at
		}
	}
	var after []time.Time
	for _, at := range first {
		if !at.Before(up) {
			after = append(after, at)
		}
	}
	sort.Slice(after, func(i, j int) bool { return after[i].Before(after[j]) })
	require.Greater(t, len(after), 10)
	achieved := float64(len(after)-1) / after[len(after)-1].Sub(after[0]).Seconds()
	twice := 0
	for _, n := range f.finishedIDs(t) {
		if n > 1 {
			twice++
		}
	}
	t.Logf("Redis SIGKILLed and restarted from its AOF (down %s): all %d jobs done by the same 3 workers and asynq's queue empty %s after Redis was back (the last handler ended %s after it) (%d of acme's and %d of beta's jobs started after it, %s of work at their limits; bound %s); first start %s after; acme's new jobs started at %.1f/s of its %d/s after it; none archived; %d job(s) ran twice (their completion was lost with Redis: at least once)",
		up.Sub(down).Round(time.Millisecond), len(ids), took.Round(time.Millisecond), last.Sub(up).Round(time.Millisecond), left["acme"], left["beta"], remaining.Round(time.Millisecond), bound.Round(time.Millisecond), firstStartAfter(starts, up).Sub(up).Round(time.Millisecond), achieved, rate, twice)
	require.Zero(t, info.Archived)
	require.GreaterOrEqual(t, achieved, 0.8*rate, "acme back at its rate")
	require.LessOrEqual(t, took, bound, "the run ends within the work left, the orphans' detection and %s", recoverSlack)
}

// TestRecovererRecordsRejoinsAndLeaves follows one worker's registration
// in-process: it records the job it runs, and forgets it when the job
// ends; taken for dead (its registration dropped, as the fleet does when
// its lease runs out) it counts that, registers again and records its
// running job again at its next beat; a graceful shutdown leaves the
// registry.
func TestRecovererRecordsRejoinsAndLeaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, nil)
	srv := e.server(t, func(c *worker.Config) { c.RecoverLease = time.Second; c.Admin = "127.0.0.1:9464" })
	release := make(chan struct{})
	rec := newRecorder(0)
	rec.before = func(ctx context.Context, _ string, _ int) error {
		<-release
		return nil
	}
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	fleet := fleetreg.Of(e.lim)
	members, err := fleet.Members(ctx)
	require.NoError(t, err)
	require.Len(t, members, 1, "Start registers the process")
	me := members[0]
	list, err := fleet.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "127.0.0.1:9464", list[0].Admin, "with the address of its metrics")
	require.True(t, list[0].Up())
	id := e.enqueue(t, "acme", 1, `{}`)[0]
	recorded := func() bool {
		jobs, err := fleet.Jobs(ctx, me)
		require.NoError(t, err)
		return jobs[id] == e.queue
	}
	eventually(t, 10*time.Second, recorded, "the running job recorded with its queue")

	// taken for dead: the fleet drops a lapsed process and its records
	require.NoError(t, e.client.ZRem(ctx, e.prefix+":{r}:fleet", me).Err())
	require.NoError(t, e.client.Del(ctx, e.prefix+":{r}:w:"+me).Err())
	eventually(t, 10*time.Second, func() bool {
		return metric(t, srv.Gate().Gatherer(), "sluice_worker_taken_for_dead_total", nil) == 1
	}, "the worker noticing it was taken for dead")
	eventually(t, 10*time.Second, recorded, "the running job recorded again")
	members, err = fleet.Members(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{me}, members)

	close(release)
	eventually(t, 10*time.Second, func() bool { return !recorded() }, "the job forgotten once it ended")
	srv.Shutdown()
	members, err = fleet.Members(ctx)
	require.NoError(t, err)
	require.Empty(t, members, "a graceful shutdown leaves the registry")
	n, err := e.client.Exists(ctx, e.prefix+":{r}:w:"+me, e.prefix+":{r}:recover", e.prefix+":{r}:admin").Result()
	require.NoError(t, err)
	require.Zero(t, n, "nor its records, nor the lock, nor its address")
}

// TestRecovererWritesItsRecordsInRounds: a process writes the records of
// the jobs it runs at most every RecordEvery, one pipeline for every job
// that started or ended meanwhile, and never writes a job that started
// and ended within one gap: short jobs cost Redis no record at all.
func TestRecovererWritesItsRecordsInRounds(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	counter := &recordCounter{key: e.prefix + ":{r}:w:"}
	e.client.AddHook(counter)
	srv := e.server(t, nil)
	rec := newRecorder(0)
	srv.Handle("job", rec)
	require.NoError(t, srv.Start())
	const n = 300
	began := time.Now()
	e.enqueueDirect(t, "acme", n, `{}`)
	eventually(t, 30*time.Second, func() bool { return rec.doneCount() == n }, "every job done")
	took := time.Since(began)
	members, err := fleetreg.Of(e.lim).Members(context.Background())
	require.NoError(t, err)
	require.Len(t, members, 1)
	me := members[0]
	eventually(t, 10*time.Second, func() bool {
		jobs, err := fleetreg.Of(e.lim).Jobs(context.Background(), me)
		require.NoError(t, err)
		return len(jobs) == 0
	}, "the records empty once every job ended")
	rounds, cmds := counter.counts()
	took = time.Since(began)
	t.Logf("%d jobs in %s: records written in %d round trips (%d commands)", n, took.Round(time.Millisecond), rounds, cmds)
	require.LessOrEqual(t, rounds, int(took/worker.RecordEvery)+2, "at most one round trip per RecordEvery")
	require.Less(t, cmds, n/2, "most short jobs never written")
}

// recordCounter counts the round trips and commands that write a
// process's records (keys starting with key).
type recordCounter struct {
	key          string
	mu           sync.Mutex
	rounds, cmds int
}

func (c *recordCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *recordCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (c *recordCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds)
		return next(ctx, cmds)
	}
}

func (c *recordCounter) count(cmds []redis.Cmder) {
	n := 0
	for _, cmd := range cmds {
		args := cmd.Args()
		if name := cmd.Name(); (name == "hset" || name == "hdel") && len(args) > 1 {
			if k, ok := args[1].(string); ok && strings.HasPrefix(k, c.key) {
				n++
			}
		}
	}
	if n > 0 {
		c.mu.Lock()
		c.rounds++
		c.cmds += n
		c.mu.Unlock()
	}
}

func (c *recordCounter) counts() (rounds, cmds int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rounds, c.cmds
}

// TestRecovererSparesAFleetRedisLeftWaiting: Redis down longer than the
// workers' RecoverLease (killed, restarted from its AOF) lets every lease
// lapse at once, through no fault of the workers; the lock holder waits a
// beat's interval for them to beat again rather than take them for dead,
// so no running job is given back and none runs twice.
func TestRecovererSparesAFleetRedisLeftWaiting(t *testing.T) {
	t.Parallel()
	server := redistest.NewServer(t, &redistest.Options{AppendOnly: true})
	e := setup(t, server.Client(t))
	const lease = time.Second
	var recs []*recorder
	var srvs []*worker.Server
	for i := 0; i < 3; i++ {
		srv := e.server(t, func(c *worker.Config) { c.RecoverLease = lease })
		rec := newRecorder(8 * time.Second)
		srv.Handle("job", rec)
		require.NoError(t, srv.Start())
		recs, srvs = append(recs, rec), append(srvs, srv)
	}
	ids := e.enqueue(t, "acme", 6, `{}`)
	running := func() int {
		n := 0
		for _, r := range recs {
			r.mu.Lock()
			n += r.running
			r.mu.Unlock()
		}
		return n
	}
	eventually(t, 10*time.Second, func() bool { return running() == len(ids) }, "every job running")
	server.Kill()
	time.Sleep(lease + time.Second) // the fault itself: every lease lapses
	require.NoError(t, server.Restart())
	eventually(t, 40*time.Second, func() bool {
		done := 0
		for _, r := range recs {
			done += r.doneCount()
		}
		return done == len(ids)
	}, "every job done")
	for _, r := range recs {
		r.mu.Lock()
		for id, s := range r.starts {
			require.Len(t, s, 1, "job %s started once", id)
		}
		r.mu.Unlock()
	}
	for _, srv := range srvs {
		for _, reason := range []string{"dead_worker", "orphan", "too_often"} {
			require.Zero(t, metric(t, srv.Gate().Gatherer(), "sluice_worker_recovered_total", map[string]string{"reason": reason}), reason)
		}
	}
}
