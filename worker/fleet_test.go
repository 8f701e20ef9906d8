package worker_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
)

// TestFleet runs sluice workers as separate processes (the program in
// internal/testworker) against a private Redis each, the way a fleet runs
// them, and checks what the handlers themselves recorded. Its subtests run
// one after the other, before the package's parallel tests, so their
// timings are not disturbed by them. In the Cluster pass they run on the
// shared Cluster at smaller sizes (the whole pass is meant to take a couple
// of minutes); a worker crash is tested in faults_test.go.
func TestFleet(t *testing.T) {
	bin := buildTestWorker(t)
	t.Run("NoLoss", func(t *testing.T) {
		per := 200
		if redistest.ClusterMode() && !*full {
			per = 100
		}
		testNoLoss(t, bin, per)
	})
	t.Run("Smoothness", func(t *testing.T) {
		if *full {
			testSmoothness(t, bin, 50, 1, 2000)
			testSmoothness(t, bin, 20, 3, 600)
			return
		}
		// A lower rate in CI: with burst 1 every scheduling delay of a
		// start beyond the limiter's 2 ms tolerance is lost for good, so a
		// busy shared CI machine costs a high rate more than a low one.
		n := 400
		if redistest.ClusterMode() {
			n = 200
		}
		testSmoothness(t, bin, 25, 1, n)
	})
	t.Run("NoisyNeighbour", func(t *testing.T) {
		n := 5000
		switch {
		case *full:
			n = 50_000
		case redistest.ClusterMode():
			n = 2000
		}
		on := testNoisyNeighbour(t, bin, n, true)
		off := testNoisyNeighbour(t, bin, n, false)
		t.Logf("noisy neighbour, %d jobs of A at once: B's start latency with A's burst in the waiting room p50 %s p99 %s; in asynq's pending list p50 %s p99 %s",
			n, on[0], on[1], off[0], off[1])
		require.LessOrEqual(t, on[1], time.Second, "with the waiting room, B's jobs start within 1 s (p99)")
	})
}

// buildTestWorker compiles the test worker program once for TestFleet. It
// is built without the race detector even under -race: the fleet tests
// measure timing, and three instrumented processes would take the CPU the
// measurements need (the in-process tests cover the same code under -race).
func buildTestWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testworker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/sluicehq/sluice/worker/internal/testworker").CombinedOutput()
	require.NoError(t, err, "go build testworker: %s", out)
	return bin
}

// fleet is a set of worker processes sharing a private Redis, or the
// shared Cluster in the Cluster pass.
type fleet struct {
	bin    string
	url    string            // the Redis the workers use (redis+cluster:// in the Cluster pass)
	server *redistest.Server // the private server; nil on the Cluster
	client redis.UniversalClient
	env    *env
	// events is the list the workers' handlers record in, on eventsClient:
	// the Redis under test unless eventsURL names another.
	events       string
	eventsURL    string
	eventsClient redis.UniversalClient
	// args are extra testworker flags for every worker started.
	args []string

	mu    sync.Mutex
	procs []*proc
}

type proc struct {
	cmd    *exec.Cmd
	pid    int
	exited chan struct{}
	stderr *clitest.SyncBuffer
}

func newFleet(t *testing.T, bin string) *fleet {
	t.Helper()
	if redistest.ClusterMode() {
		e := setup(t, nil)
		f := &fleet{bin: bin, url: redistest.ClusterURL(t), client: e.client, env: e, events: e.prefix + ":events", eventsClient: e.client}
		t.Cleanup(func() { f.stopAll(t) })
		return f
	}
	return newFleetOn(t, bin, redistest.NewServer(t, nil), false)
}

// newFleetOn is a fleet on server; with eventsApart the handlers record on
// a private Redis of their own, which survives what a test does to server.
func newFleetOn(t *testing.T, bin string, server *redistest.Server, eventsApart bool) *fleet {
	t.Helper()
	client := server.Client(t)
	f := &fleet{bin: bin, url: server.URL(), server: server, client: client, env: setup(t, client), events: "events", eventsClient: client}
	if eventsApart {
		events := redistest.NewServer(t, nil)
		f.eventsURL, f.eventsClient = events.URL(), events.Client(t)
	}
	t.Cleanup(func() { f.stopAll(t) })
	return f
}

// start launches a worker process and waits until it takes jobs.
func (f *fleet) start(t *testing.T) *proc {
	t.Helper()
	return f.startWith(t, nil)
}

// startWith is start with env added to the worker's environment.
func (f *fleet) startWith(t *testing.T, env []string) *proc {
	t.Helper()
	args := []string{"-redis", f.url, "-prefix", f.env.prefix, "-queue", f.env.queue, "-events", f.events, "-concurrency", "200"}
	if f.eventsURL != "" {
		args = append(args, "-events-redis", f.eventsURL)
	}
	cmd := exec.Command(f.bin, append(args, f.args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p := &proc{cmd: cmd, exited: make(chan struct{}), stderr: &clitest.SyncBuffer{}}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	p.pid = cmd.Process.Pid
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("testworker exited at start: %s", p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("testworker not ready after 30s: %s", p.stderr.String())
	}
	return p
}

// kill stops a worker at once, as a crash would.
func (f *fleet) kill(t *testing.T, p *proc) time.Time {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	at := time.Now()
	<-p.exited
	return at
}

// stopAll shuts every worker down gracefully (SIGTERM), killing those that
// do not exit in time.
func (f *fleet) stopAll(t *testing.T) {
	f.mu.Lock()
	procs := f.procs
	f.procs = nil
	f.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			t.Errorf("testworker %d did not exit 20s after SIGTERM; killing it", p.pid)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if p.cmd.ProcessState != nil && !p.cmd.ProcessState.Success() && !p.killed() {
			t.Errorf("testworker %d exited with %s: %s", p.pid, p.cmd.ProcessState, p.stderr.String())
		}
	}
}

func (p *proc) killed() bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// event is one record of the test worker's handler.
type event struct {
	start    bool
	id       string // the job's identity (its first task id)
	taskID   string
	tenant   string
	pid      int
	at       time.Time
	admitted time.Time // Redis time of the admission; zero without one
	decided  time.Time // the slot of the room's decision it started on (a ticket); zero when the gate decided
	ticket   time.Time // the slot of the ticket it carried, started on or not; zero without one
	retried  int
	matched  bool
	end      time.Time // for a start: when its handler ended (or was killed)
	finished bool
}

func (f *fleet) records(t *testing.T) []*event {
	t.Helper()
	raw, err := f.eventsClient.LRange(context.Background(), f.events, 0, -1).Result()
	require.NoError(t, err)
	out := make([]*event, 0, len(raw))
	for _, r := range raw {
		p := strings.Split(r, "|")
		require.GreaterOrEqual(t, len(p), 6, r)
		pid, _ := strconv.Atoi(p[4])
		us, _ := strconv.ParseInt(p[5], 10, 64)
		e := &event{start: p[0] == "S", id: p[1], taskID: p[2], tenant: p[3], pid: pid, at: time.UnixMicro(us)}
		if e.start {
			e.retried, _ = strconv.Atoi(p[6])
			if us, _ := strconv.ParseInt(p[7], 10, 64); us > 0 {
				e.admitted = time.UnixMicro(us)
			}
			if len(p) > 9 {
				if us, _ := strconv.ParseInt(p[8], 10, 64); us > 0 {
					e.decided = time.UnixMicro(us)
				}
				if us, _ := strconv.ParseInt(p[9], 10, 64); us > 0 {
					e.ticket = time.UnixMicro(us)
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// runs pairs each start with its end on the same process; a start on a
// process killed before the end gets the kill time as its end.
func runs(evs []*event, killedAt map[int]time.Time) []*event {
	var starts []*event
	open := map[string][]*event{}
	key := func(e *event) string { return e.taskID + "|" + strconv.Itoa(e.pid) }
	sorted := append([]*event(nil), evs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].at.Before(sorted[j].at) })
	for _, e := range sorted {
		if e.start {
			starts = append(starts, e)
			open[key(e)] = append(open[key(e)], e)
			continue
		}
		if q := open[key(e)]; len(q) > 0 {
			q[0].end, q[0].finished = e.at, true
			open[key(e)] = q[1:]
		}
	}
	for _, s := range starts {
		if !s.finished {
			if at, ok := killedAt[s.pid]; ok {
				s.end = at
			}
		}
	}
	return starts
}

// maxConcurrent is the most runs of tenant in progress at once, from the
// handlers' own records; an end at the same instant as a start counts first.
func maxConcurrent(starts []*event, tenant string) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, s := range starts {
		if tenant != "" && s.tenant != tenant {
			continue
		}
		end := s.end
		if end.IsZero() {
			end = time.Now()
		}
		edges = append(edges, edge{s.at, 1}, edge{end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].at.Before(edges[j].at)
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// jobRuns merges the runs of one job (one task id) that overlap into one:
// a copy of a job delivered again while it still runs (asynq recovering a
// job whose completion it could not record) shares the job's concurrency
// slot, which the limiter holds per job. It returns the merged runs and how
// many runs started while another run of the same job was in progress.
func jobRuns(starts []*event) ([]*event, int) {
	byJob := map[string][]*event{}
	var order []string
	for _, s := range starts {
		if _, ok := byJob[s.taskID]; !ok {
			order = append(order, s.taskID)
		}
		byJob[s.taskID] = append(byJob[s.taskID], s)
	}
	var out []*event
	copies := 0
	for _, id := range order {
		runs := byJob[id]
		sort.Slice(runs, func(i, j int) bool { return runs[i].at.Before(runs[j].at) })
		var cur *event
		for _, r := range runs {
			end := r.end
			if end.IsZero() {
				end = time.Now()
			}
			if cur != nil && r.at.Before(cur.end) {
				copies++
				if end.After(cur.end) {
					cur.end = end
				}
				continue
			}
			c := *r
			c.end = end
			cur = &c
			out = append(out, cur)
		}
	}
	return out, copies
}

// waitFinished waits until n jobs have finished, each once. It polls the
// length of the record list, which is cheap, so that the test process takes
// little of the CPU the workers' timing depends on.
func (f *fleet) waitFinished(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	poll(t, timeout, 100*time.Millisecond, func() bool {
		l, err := f.eventsClient.LLen(context.Background(), f.events).Result()
		require.NoError(t, err)
		return l >= int64(2*n) && len(f.finishedIDs(t)) == n
	}, "all %d jobs done", n)
}

func (f *fleet) finishedIDs(t *testing.T) map[string]int {
	t.Helper()
	done := map[string]int{}
	for _, e := range f.records(t) {
		if !e.start {
			done[e.id]++
		}
	}
	return done
}

func (f *fleet) enqueueBatch(t *testing.T, tenant string, n int, payload string, opts ...asynq.Option) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for len(ids) < n {
		jobs := make([]queue.Job, min(1000, n-len(ids)))
		for i := range jobs {
			jobs[i] = queue.Job{Tenant: tenant, Task: asynq.NewTask("rec", []byte(payload)),
				Options: append([]asynq.Option{asynq.Queue(f.env.queue)}, opts...)}
		}
		for _, r := range f.env.q.EnqueueBatch(context.Background(), jobs) {
			require.NoError(t, r.Err)
			ids = append(ids, r.Info.ID)
		}
	}
	return ids
}

func testNoLoss(t *testing.T, bin string, per int) {
	f := newFleet(t, bin)
	f.env.policy(t, "t1", "rate=40/s burst=2 backlog=1000")
	f.env.policy(t, "t2", "rate=20/s concurrency=3 lease=5s")
	f.env.policy(t, "*", "rate=30/s")
	for i := 0; i < 3; i++ {
		f.start(t)
	}
	var ids []string
	for _, tenant := range []string{"t1", "t2", "t3"} {
		ms := `{"ms":5}`
		if tenant == "t2" {
			ms = `{"ms":50}`
		}
		// Every third job is at its retry limit from the start.
		ids = append(ids, f.enqueueBatch(t, tenant, per/3, ms, asynq.MaxRetry(0))...)
		ids = append(ids, f.enqueueBatch(t, tenant, per-per/3, ms)...)
	}
	f.waitFinished(t, len(ids), 60*time.Second)

	starts := runs(f.records(t), nil)
	count := map[string]int{}
	for _, s := range starts {
		count[s.id]++
		require.Zero(t, s.retried, "job %s used a retry", s.id)
	}
	for _, id := range ids {
		require.Equal(t, 1, count[id], "job %s started once", id)
	}
	info := f.env.queueInfo(t)
	require.Zero(t, info.Archived)
	require.Zero(t, info.Pending+info.Scheduled+info.Retry+info.Active)
	require.LessOrEqual(t, maxConcurrent(starts, "t2"), 3)
	for tenant, rate := range map[string]float64{"t1": 40, "t2": 20, "t3": 30} {
		burst := 1
		if tenant == "t1" {
			burst = 2
		}
		require.Zero(t, beyond(t, starts, tenant, rate, burst+1), "tenant %s", tenant)
	}
	st, err := f.env.lim.Stats(context.Background(), "t1")
	require.NoError(t, err)
	require.Zero(t, st.Waiting, "no job is left waiting in its line")
	t.Logf("no loss: %d jobs over 3 tenants and 3 workers, each started once, none archived, no retry used", len(ids))
}

func testSmoothness(t *testing.T, bin string, rate float64, burst, n int) {
	f := newFleet(t, bin)
	f.env.policy(t, "acme", fmt.Sprintf("rate=%d/s burst=%d", int(rate), burst))
	for i := 0; i < 3; i++ {
		f.start(t)
	}
	ids := f.enqueueBatch(t, "acme", n, `{"ms":1}`)
	timeout := time.Duration(float64(n)/rate*float64(time.Second)) + 30*time.Second
	f.waitFinished(t, n, timeout)

	starts := runs(f.records(t), nil)
	require.Len(t, starts, len(ids), "each job started once")
	sort.Slice(starts, func(i, j int) bool { return starts[i].at.Before(starts[j].at) })
	at := make([]time.Time, len(starts))
	for i, s := range starts {
		at[i] = s.at
		require.Zero(t, s.retried)
	}
	// The limiter's own record: the Redis times of the admissions.
	admitted := make([]time.Time, len(starts))
	var lag time.Duration // the longest a handler started after its admission
	for i, s := range starts {
		admitted[i] = s.admitted
		lag = max(lag, s.at.Sub(s.admitted))
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Before(admitted[j]) })
	require.Zero(t, nonConforming(admitted, rate, burst+1), "admissions")
	bad := nonConforming(at, rate, burst+1)
	if bad > 0 {
		// Show the starts around each refused one, for diagnosis.
		for _, i := range nonConformingAt(at, rate, burst+1) {
			for k := max(0, i-4); k <= min(len(at)-1, i+1); k++ {
				t.Logf("start %d: +%s pid %d task %s", k, starts[k].at.Sub(at[0]), starts[k].pid, starts[k].taskID)
			}
		}
	}
	span := at[len(at)-1].Sub(at[0])
	achieved := float64(n-burst) / span.Seconds()
	// Time lost to starts later than one interval after the previous one:
	// with burst 1 it is never made up, so a machine that stalls the
	// workers shows here.
	interval := time.Duration(float64(time.Second) / rate)
	var lost, worst time.Duration
	for i := 1; i < len(at); i++ {
		late := at[i].Sub(at[i-1]) - interval
		lost += max(0, late)
		worst = max(worst, late)
	}
	// The steady stream: the jobs the room promotes, past the first few,
	// which arrive straight on reservations the gate decides.
	const first = 10
	steady := at[first:]
	skipped := 0 // whole intervals no job started in
	for i := 1; i < len(steady); i++ {
		skipped += max(0, int((steady[i].Sub(steady[i-1])-interval/2)/interval))
	}
	// A worker that wakes later than its ticket's window (the tolerance,
	// 2 ms) cannot start the job there: the next job's start would follow
	// too closely. The gate decides it anew, on a ticket for the next free
	// slot, and the slot of its first ticket stays empty: the machine's
	// stall costs one slot (or two when the worker is late again for the
	// second ticket), not a reservation that the jobs promoted after it
	// pass, nor anything unexplained.
	lateWakes := 0
	for _, s := range starts[first:] {
		if !s.ticket.IsZero() && s.decided.IsZero() {
			lateWakes++
		}
	}
	t.Logf("smoothness rate=%v/s burst=%d, %d jobs, 3 workers: %d non-conforming handler starts against GCRA(%v/s, %d); achieved %.2f/s (%.2f%% of the limit) over %s; %s lost to late starts, the worst %s late; past the first %d starts, %d intervals empty and %d jobs late for their tickets; handlers started at most %s after admission",
		rate, burst, n, bad, rate, burst+1, achieved, 100*achieved/rate, span.Round(time.Millisecond), lost.Round(time.Millisecond), worst.Round(time.Millisecond), first, skipped, lateWakes, lag.Round(time.Microsecond))
	require.LessOrEqual(t, skipped, lateWakes+lateWakes/2+2, "intervals left empty beyond those of jobs late for their tickets")
	require.LessOrEqual(t, lateWakes, n/4, "jobs that came late for their tickets")
	tau := time.Duration(float64(time.Second) / rate * float64(burst))
	if bad > 0 && !*full && lag > tau {
		// A worker process stalled between an admission and its handler
		// longer than the reference's slack: the handlers' clock, not the
		// limiter, put those starts too close (the admissions conform).
		t.Logf("%d handler starts too close after a worker stalled %s between admission and handler (slack %s); not counted on a shared CI machine", bad, lag.Round(time.Millisecond), tau)
	} else {
		require.Zero(t, bad)
	}
	// The design asks for 2%. The full run (a quiet machine) holds the
	// whole stream to it as it came. CI runs on shared machines whose
	// stalls make workers wake late for their tickets; the steady stream
	// less one slot for each such job holds to 2%.
	if *full {
		require.InEpsilon(t, rate, achieved, 0.02)
	} else {
		held := float64(len(steady)-1) / (steady[len(steady)-1].Sub(steady[0]) - time.Duration(lateWakes)*interval).Seconds()
		require.InEpsilon(t, rate, held, 0.02, "the steady stream less the %d slots of jobs that came late for their tickets", lateWakes)
	}
}

// testNoisyNeighbour returns the p50 and p99 of B's start latency, with
// A's burst enqueued through queue.Client (the waiting room) or with
// asynq's own client (every job in the pending list).
func testNoisyNeighbour(t *testing.T, bin string, n int, room bool) [2]time.Duration {
	f := newFleet(t, bin)
	f.env.policy(t, "a", "rate=100/s")
	for i := 0; i < 3; i++ {
		f.start(t)
	}
	if room {
		f.enqueueBatch(t, "a", n, `{"ms":1}`)
	} else {
		ac := asynq.NewClientFromRedisClient(f.env.asynq)
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += 16 {
					task := asynq.NewTaskWithHeaders("rec", []byte(`{"ms":1}`), map[string]string{taskspec.TenantHeader: "a"})
					_, err := ac.Enqueue(task, asynq.Queue(f.env.queue))
					require.NoError(t, err)
				}
			}()
		}
		wg.Wait()
	}
	enqueued := map[string]time.Time{}
	for i := 0; i < 50; i++ {
		at := time.Now()
		info, err := f.env.q.Enqueue(context.Background(), "b", asynq.NewTask("rec", []byte(`{"ms":1}`)), asynq.Queue(f.env.queue))
		require.NoError(t, err)
		enqueued[info.ID] = at
		time.Sleep(40 * time.Millisecond)
	}
	var lat []time.Duration
	poll(t, 120*time.Second, 100*time.Millisecond, func() bool {
		lat = lat[:0]
		for _, e := range f.records(t) {
			if e.start && e.tenant == "b" {
				lat = append(lat, e.at.Sub(enqueued[e.id]))
			}
		}
		return len(lat) == len(enqueued)
	}, "B's 50 jobs started")
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(time.Millisecond) }
	return [2]time.Duration{pct(0.5), pct(0.99)}
}
