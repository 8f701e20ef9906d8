package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// cli runs the enqueue binary against the test's Redis, prefix and queue.
type cli struct {
	bin    string
	url    string
	prefix string
	queue  string // asynq's keys cannot be prefixed: each test has its own queue
}

type result struct {
	code           int
	stdout, stderr string
}

// TestCLI builds the binary once and runs its tests against a private Redis.
func TestCLI(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "enqueue")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	for name, fn := range map[string]func(*testing.T, *cli){
		"Help":          testHelp,
		"BadUsage":      testBadUsage,
		"Unreachable":   testUnreachable,
		"One":           testOne,
		"Count":         testCount,
		"File":          testFile,
		"FileRerun":     testFileRerun,
		"Stdin":         testStdin,
		"Cron":          testCron,
		"Priority":      testPriority,
		"Pools":         testPools,
		"Keys":          testKeys,
		"CostOverBurst": testCostOverBurst,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := redistest.Prefix(t)
			fn(t, &cli{bin: bin, url: redistest.URL(t), prefix: p, queue: strings.ReplaceAll(p, ":", ".")})
		})
	}
}

// run runs enqueue with the test's Redis, prefix and queue.
func (c *cli) run(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	return c.runEnv(t, stdin, map[string]string{"SLUICE_REDIS_URL": c.url}, append([]string{"--prefix", c.prefix, "--queue", c.queue}, args...)...)
}

func (c *cli) command(ctx context.Context, t *testing.T, stdin []byte, env map[string]string, args ...string) *exec.Cmd {
	return clitest.Command(ctx, t, c.bin, stdin, env, args...)
}

func (c *cli) runEnv(t *testing.T, stdin []byte, env map[string]string, args ...string) result {
	t.Helper()
	code, stdout, stderr := clitest.Run(t, c.bin, stdin, env, args...)
	return result{code: code, stdout: stdout, stderr: stderr}
}

// tasks lists every task of the test's queue, by task id.
func (c *cli) tasks(t *testing.T) map[string]*asynq.TaskInfo {
	t.Helper()
	in := asynq.NewInspectorFromRedisClient(redistest.Client(t))
	out := map[string]*asynq.TaskInfo{}
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){in.ListPendingTasks, in.ListScheduledTasks} {
		for page := 1; ; page++ {
			infos, err := list(c.queue, asynq.Page(page), asynq.PageSize(1000))
			if errors.Is(err, asynq.ErrQueueNotFound) {
				return out
			}
			require.NoError(t, err)
			for _, i := range infos {
				out[i.ID] = i
			}
			if len(infos) < 1000 {
				break
			}
		}
	}
	return out
}

func testHelp(t *testing.T, c *cli) {
	r := c.runEnv(t, nil, nil, "--help")
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stderr)
	clitest.Golden(t, "help", r.stdout)
	require.Equal(t, r, c.runEnv(t, nil, nil, "-h"))
	v := c.runEnv(t, nil, nil, "--version")
	require.Equal(t, 0, v.code)
	require.Regexp(t, `^enqueue \S+ go1\.\S+ \w+/\w+\n$`, v.stdout)
}

func testBadUsage(t *testing.T, c *cli) {
	job := []string{"--tenant", "acme", "--type", "sleep"}
	for _, tt := range []struct {
		args []string
		env  map[string]string // replaces the test's environment when set
		want string
	}{
		{[]string{"--bogus"}, nil, "unknown flag --bogus"},
		{nil, nil, "missing --tenant: the tenant whose limits the job counts against (or --file for JSON lines)"},
		{[]string{"--tenant", "acme"}, nil, "missing --type: the job's type, e.g. http or sleep"},
		{[]string{"--tenant", "*", "--type", "sleep"}, nil, `--tenant: invalid tenant: tenant "*" is a reserved name`},
		{[]string{"--tenant", "", "--file", "x"}, nil, "--tenant: invalid tenant: the tenant is empty"},
		{[]string{"--tenant", "a\tb", "--type", "sleep"}, nil, `--tenant: invalid tenant: tenant "a\tb" has a control character (U+0009) at byte 1`},
		{[]string{"--tenant", "acme\n", "--file", "x"}, nil, `--tenant: invalid tenant: tenant "acme\n" has a control character (U+000A) at byte 4`},
		{append(job, "--payload", `{"ms":`), nil, `--payload "{\"ms\":": not valid JSON (unexpected end of JSON input at byte 6); quote it for the shell, e.g. --payload '{"ms":100}'`},
		{append(job, "--payload", `ms=100`), nil, `--payload "ms=100": not valid JSON (invalid character 'm' looking for beginning of value at byte 1)`},
		{append(job, `{"ms":1}`), nil, `unexpected argument "{\"ms\":1}"; enqueue takes only flags (quote a payload: --payload '{"ms":100}')`},
		{append(job, "--queue", " "), nil, `--queue " ": the queue name must not be blank (default "default")`},
		{append(job, "--cost", "0"), nil, "--cost 0: must be at least 1 (the default)"},
		{append(job, "--cost", "x"), nil, `invalid value "x" for flag --cost: want a whole number`},
		{append(job, "--count", "0"), nil, "--count 0: must be at least 1"},
		{append(job, "--priority", "urgent"), nil, `--priority "urgent": must be high, normal or low (default normal)`},
		{append(job, "--priority", "1"), nil, `--priority "1": must be high, normal or low (default normal)`},
		{[]string{"--file", "x", "--priority", "top"}, nil, `--priority "top": must be high, normal or low`},
		{append(job, "--in", "-1s"), nil, "--in -1s: must not be negative"},
		{append(job, "--in", "5"), nil, `invalid value "5" for flag --in: want a duration such as 30s or 5m`},
		{append(job, "--max-retry", "-1"), nil, "--max-retry -1: must be 0 or more"},
		{append(job, "--id", "a", "--count", "2"), nil, "--id names one job: it cannot be used with --count 2 or --cron"},
		{append(job, "--id", " "), nil, `--id " ": the task id must not be blank; leave --id out for a random one`},
		{append(job, "--cron", "* * *"), nil, `--cron "* * *": expected 5 to 6 fields, found 3: [* * *]; e.g. "*/5 * * * *"`},
		{append(job, "--cron", "@every 1s", "--id", "x"), nil, "--id names one job: it cannot be used with --count 1 or --cron"},
		{[]string{"--file", "x", "--payload", "{}"}, nil, "--payload cannot be used with --file: each line gives its own job"},
		{[]string{"--file", "x", "--count", "3"}, nil, "--count cannot be used with --file"},
		{[]string{"--file", "x", "--cron", "@hourly"}, nil, "--cron cannot be used with --file"},
		{append(job, "--partial"), nil, "--partial goes with --file: it says how the lines of a file are enqueued"},
		{append(job, "--random-ids"), nil, "--random-ids goes with --file"},
		{append(job, "--cron", "@hourly", "--dry-run"), nil, "--dry-run cannot be used with --cron"},
		{append(job, "--prefix", "a{b}"), nil, `--prefix "a{b}": must be non-empty and without { or }`},
		{append(job, "--redis", "redis://u:secret@h:1/x"), nil, `--redis: Redis URL "redis://u:xxxxx@h:1/x": database "x": must be a number`},
		{job, map[string]string{"SLUICE_REDIS_URL": "http://x"}, `SLUICE_REDIS_URL: Redis URL "http://x": unknown scheme "http"`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var r result
			if tt.env != nil {
				r = c.runEnv(t, nil, tt.env, append([]string{"--queue", c.queue}, tt.args...)...)
			} else {
				r = c.run(t, nil, tt.args...)
			}
			require.Equal(t, 2, r.code, r.stderr)
			require.Empty(t, r.stdout)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			require.Len(t, lines, 3, r.stderr)
			require.True(t, strings.HasPrefix(lines[0], "enqueue: "+tt.want), "got  %q\nwant %q", lines[0], "enqueue: "+tt.want)
			require.Equal(t, "usage: enqueue [--tenant T --type TYPE [--payload JSON] | --file F|-] [FLAGS]", lines[1])
			require.Equal(t, "run 'enqueue --help' for the flags", lines[2])
			require.NotContains(t, r.stderr, "secret")
			require.Empty(t, c.tasks(t), "a bad command line enqueues nothing")
		})
	}
}

func testUnreachable(t *testing.T, c *cli) {
	port, err := redistest.FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(`{"tenant":"a","type":"sleep"}`+"\n"), 0o600))
	for _, args := range [][]string{
		{"--tenant", "acme", "--type", "sleep"},
		{"--tenant", "acme", "--type", "sleep", "--count", "10"},
		{"--file", file},
		{"--cron", "@every 1s", "--tenant", "acme", "--type", "sleep"},
	} {
		r := c.runEnv(t, nil, map[string]string{"SLUICE_REDIS_URL": "redis://" + addr}, args...)
		require.Equal(t, result{code: 1, stderr: "enqueue: cannot reach Redis at " + addr + ": connection refused; is redis-server running? set --redis or SLUICE_REDIS_URL\n"}, r, "enqueue %v", args)
	}
	r := c.runEnv(t, nil, nil, "--redis", "memory://"+addr, "--tenant", "a", "--type", "sleep")
	require.Equal(t, result{code: 1, stderr: "enqueue: cannot reach Redis at " + addr + ": connection refused; is a worker started with --redis memory://" + addr + " running? set --redis or SLUICE_REDIS_URL\n"}, r)
	r = c.run(t, nil, "--file", filepath.Join(t.TempDir(), "missing.jsonl"))
	require.Equal(t, 1, r.code)
	require.Regexp(t, `^enqueue: cannot read /\S+/missing.jsonl: no such file or directory\n$`, r.stderr)
}

var oneRE = regexp.MustCompile(`^enqueued task (\S+) \(type (\S+), tenant (\S+), queue (\S+)(, due (\S+)|, waiting in its tenant's line)?\)\n$`)

func testOne(t *testing.T, c *cli) {
	r := c.run(t, nil, "--tenant", "acme", "--type", "http", "--payload", ` {"url": "http://127.0.0.1:1/x"} `, "--cost", "3", "--max-retry", "0")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr)
	m := oneRE.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	require.Equal(t, []string{"http", "acme", c.queue, ", waiting in its tenant's line"}, []string{m[2], m[3], m[4], m[5]}, "no worker serves the queue: the job waits")
	tasks := c.tasks(t)
	require.Len(t, tasks, 1)
	info := tasks[m[1]]
	require.NotNil(t, info)
	require.Equal(t, `{"url": "http://127.0.0.1:1/x"}`, string(info.Payload))
	require.Equal(t, "acme", info.Headers[taskspec.TenantHeader])
	require.Equal(t, "3", info.Headers[taskspec.CostHeader])
	require.Equal(t, 0, info.MaxRetry)

	// --id and --in: a scheduled job under a known id; the same id again is refused.
	before := time.Now()
	r = c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "order-17", "--in", "1h")
	require.Equal(t, 0, r.code, r.stderr)
	m = oneRE.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	require.Equal(t, "order-17", m[1])
	due, err := time.Parse(time.RFC3339, m[6])
	require.NoError(t, err)
	require.WithinDuration(t, before.Add(time.Hour), due, 5*time.Second)
	info = c.tasks(t)["order-17"]
	require.Equal(t, asynq.TaskStateScheduled, info.State)
	require.Empty(t, info.Payload)

	r = c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "order-17")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "enqueue: enqueue sleep task for tenant \"acme\": task ID conflicts with another task: a task with this id is already in the queue (give another --id or \"id\")\n", r.stderr)
	require.Len(t, c.tasks(t), 2)
}

// testCostOverBurst: a job whose cost does not fit its tenant's burst is
// refused every time, with the message naming the rule and the fix, and
// nothing is enqueued; once the burst fits, it is.
func testCostOverBurst(t *testing.T, c *cli) {
	lim := c.limiter(t)
	set := func(text string) {
		p, err := throttle.ParsePolicy(text)
		require.NoError(t, err)
		require.NoError(t, lim.Policies().Set(context.Background(), "acme", p))
	}
	set("rate=2/s")
	for range 2 {
		r := c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":1}`, "--cost", "3")
		require.Equal(t, result{code: 1, stderr: "enqueue: tenant \"acme\": a job of cost 3 can never start: acme rate[0] (2/s) admits at most 1 at once, and a job's cost must fit its burst; give that rate burst=3 or more (rate=2/s burst=3), or split the job into jobs of cost 1 or less\n"}, r)
		require.Empty(t, c.tasks(t))
	}
	set("rate=2/s burst=3")
	r := c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":1}`, "--cost", "3")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, c.tasks(t), 1)
}

// limiter is a limiter on the test's Redis and prefix, closed when the
// test ends.
func (c *cli) limiter(t *testing.T) *throttle.Limiter {
	t.Helper()
	lim, err := throttle.NewLimiter(redistest.Client(t), &throttle.Config{Prefix: c.prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close() })
	return lim
}

func testCount(t *testing.T, c *cli) {
	lim := c.limiter(t)
	ctx := context.Background()
	p, err := throttle.ParsePolicy("backlog=250")
	require.NoError(t, err)
	require.NoError(t, lim.Policies().Set(ctx, "acme", p))

	r := c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":1}`, "--count", "300")
	require.Equal(t, 1, r.code, r.stderr)
	require.Regexp(t, `^enqueued 250 of 300 jobs for tenant acme in \d+\.\d\ds \(\d+/s\); 50 failed \(reported above\)\n$`, r.stdout)
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	require.Len(t, lines, 50)
	for i, l := range lines {
		require.Equal(t, "enqueue: job "+strconv.Itoa(251+i)+": tenant \"acme\": backlog full (250 waiting, cap 250): retry later or raise backlog= in its policy", l)
	}
	require.Len(t, c.tasks(t), 250)
	st, err := lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.EqualValues(t, 250, st.Waiting)
}

// fileLines are the lines of testFile: good ones (with ids, to find them),
// bad ones, and blank ones.
const fileLines = `{"tenant":"acme","type":"sleep","payload":{"ms":5},"id":"j1"}

{"tenant":"acme","type":"sleep","payload":{"ms":5}
{"type":"sleep","id":"j4"}
{"tenant":"acme","type":"sleep","payload":[1,"two"],"queue":"%Q","cost":2,"id":"j5","process_in":"10m","max_retry":2}
{"tenant":"acme","type":"sleep","queueu":"x"}
{"tenant":"acme","type":"sleep","cost":"2"}
{"tenant":"acme","type":"sleep","cost":0}
{"tenant":"acme","type":"sleep","process_in":"ten minutes"}
{"tenant":"*","type":"sleep"}
["tenant","acme"]
{"tenant":"acme","type":"sleep","id":"j1"}
{"tenant":"small","id":"j13"}
{"tenant":"small","id":"j14"}
{"tenant":"acme","type":"sleep","payload":"hi","id":"j15"} {"x":1}
{"tenant":"acme","type":"sleep","payload":"hi","queue":"","id":"j16"}
  {"tenant":"other","type":"sleep","payload":null,"id":"j17"}  
`

func testFile(t *testing.T, c *cli) {
	client := redistest.Client(t)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: c.prefix})
	require.NoError(t, err)
	defer lim.Close()
	p, err := throttle.ParsePolicy("backlog=1")
	require.NoError(t, err)
	require.NoError(t, lim.Policies().Set(context.Background(), "small", p))

	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(strings.ReplaceAll(fileLines, "%Q", c.queue)), 0o600))
	badLines := `enqueue: line 3: not valid JSON: unexpected end of JSON input at byte 50
enqueue: line 4: no tenant: add "tenant" to the line or give --tenant
enqueue: line 6: unknown field "queueu"; known: tenant, type, payload, queue, cost, priority, key, pools, id, process_in, max_retry
enqueue: line 7: "cost" is a JSON string; want a whole number
enqueue: line 8: cost 0: must be at least 1 (the default)
enqueue: line 9: process_in "ten minutes": want a duration such as "90s" or "5m"
enqueue: line 10: invalid tenant: tenant "*" is a reserved name (* is the default policy, names starting with @ are sluice's); choose another
enqueue: line 11: not a JSON object; want {"tenant": …, "type": …, "payload": …}
enqueue: line 12: id "j1": line 1 already gave this task id in queue "` + c.queue + `"; task ids must be unique
enqueue: line 15: more than one JSON value on the line; put one job on each line
enqueue: line 16: queue "": the queue name must not be blank; leave "queue" out for "` + c.queue + `"
`
	// The whole file is checked first: with a bad line nothing is
	// enqueued, and every bad line is named.
	r := c.run(t, nil, "--file", file, "--type", "email")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, badLines+"enqueue: 11 of 16 lines of "+file+" are bad (reported above): nothing was enqueued; fix them and run again (--partial enqueues the good lines and reports the bad ones)\n", r.stderr)
	require.Empty(t, c.tasks(t))

	// --dry-run says the same without Redis.
	r = c.runEnv(t, nil, map[string]string{"SLUICE_REDIS_URL": "redis://127.0.0.1:1"}, "--queue", c.queue, "--file", file, "--type", "email", "--dry-run")
	require.Equal(t, 1, r.code)
	require.Equal(t, badLines, r.stderr)
	require.True(t, strings.HasSuffix(r.stdout, "dry run: 11 of 16 lines of "+file+" are bad (reported above); the other 5 are good; nothing was enqueued\n"), r.stdout)

	// --partial enqueues every good line. --type is the default of the
	// lines without one; --quiet keeps progress lines out of the comparison.
	r = c.run(t, nil, "--file", file, "--type", "email", "--quiet", "--partial")
	require.Equal(t, 1, r.code)
	require.Equal(t, badLines+`enqueue: line 14: tenant "small": backlog full (1 waiting, cap 1): retry later or raise backlog= in its policy
`, r.stderr)
	require.Regexp(t, `^enqueued 4 of 16 jobs from `+regexp.QuoteMeta(file)+` in \d+\.\d\ds \(\d+/s\); 12 failed \(reported above\)\n$`, r.stdout)

	tasks := c.tasks(t)
	require.Len(t, tasks, 4)
	require.Equal(t, `{"ms":5}`, string(tasks["j1"].Payload))
	require.Equal(t, "sleep", tasks["j1"].Type)
	j5 := tasks["j5"]
	require.Equal(t, `[1,"two"]`, string(j5.Payload))
	require.Equal(t, "2", j5.Headers[taskspec.CostHeader])
	require.Equal(t, 2, j5.MaxRetry)
	require.Equal(t, asynq.TaskStateScheduled, j5.State)
	require.WithinDuration(t, time.Now().Add(10*time.Minute), j5.NextProcessAt, 10*time.Second)
	require.Equal(t, "email", tasks["j13"].Type, "--type is the default")
	require.Equal(t, "small", tasks["j13"].Headers[taskspec.TenantHeader])
	require.Empty(t, tasks["j17"].Payload, "a null payload is no payload")
	require.Equal(t, "other", tasks["j17"].Headers[taskspec.TenantHeader])

	// Again: the jobs in the queue are not enqueued twice.
	r = c.run(t, nil, "--file", file, "--type", "email", "--quiet", "--partial")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `^enqueued 0 of 16 jobs from \S+ in \S+; 12 failed \(reported above\); 4 were in the queue already \(the same task id: enqueued before\), not enqueued again\n$`, r.stdout)
	require.Len(t, c.tasks(t), 4)
}

// testFileRerun: the story of the report. A file with a bad line enqueues
// nothing; fixed, every line is enqueued; run again, nothing is enqueued
// twice. Lines without an id get one derived from what they enqueue.
func testFileRerun(t *testing.T, c *cli) {
	dir := t.TempDir()
	write := func(lines ...string) string {
		f := filepath.Join(dir, "jobs.jsonl")
		require.NoError(t, os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
		return f
	}
	job := `{"tenant":"acme","type":"sleep","payload":{"ms":5}}`
	file := write("\xef\xbb\xbf"+job, job, `{"tenant":"acme","type":"slep"`, `{"tenant":"globex","type":"sleep"}`)
	r := c.run(t, nil, "--file", file)
	require.Equal(t, 1, r.code)
	require.Equal(t, "enqueue: line 3: not valid JSON: unexpected end of JSON input at byte 30\nenqueue: 1 of 4 lines of "+file+" is bad (reported above): nothing was enqueued; fix it and run again (--partial enqueues the good lines and reports the bad ones)\n", r.stderr)
	require.Empty(t, c.tasks(t))

	// --partial enqueues the three good lines (a leading byte order mark
	// is fine; two identical lines are two jobs) ...
	r = c.run(t, nil, "--file", file, "--partial")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `^enqueued 3 of 4 jobs from `, r.stdout)
	first := c.tasks(t)
	require.Len(t, first, 3)
	// ... the file is fixed and run again: only the fixed line is new.
	file = write(job, job, `{"tenant":"acme","type":"sleep","payload":{"ms":7}}`, `{"tenant":"globex","type":"sleep"}`)
	r = c.run(t, nil, "--file", file)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr)
	require.Regexp(t, `^enqueued 1 of 4 jobs from \S+ in \S+; 3 were in the queue already \(the same task id: enqueued before\), not enqueued again\n$`, r.stdout)
	tasks := c.tasks(t)
	require.Len(t, tasks, 4)
	for id := range first {
		require.Contains(t, tasks, id)
		require.Regexp(t, `^line-[0-9a-f]{32}$`, id)
	}
	// A line added at the top moves the others but keeps their ids.
	file = write(`{"tenant":"initech","type":"sleep"}`, job, job, `{"tenant":"acme","type":"sleep","payload":{"ms":7}}`, `{"tenant":"globex","type":"sleep"}`)
	r = c.run(t, nil, "--file", file)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^enqueued 1 of 5 jobs from \S+ in \S+; 4 were in the queue already`, r.stdout)
	require.Len(t, c.tasks(t), 5)

	// --dry-run shows each job and its id, and enqueues nothing.
	r = c.run(t, nil, "--file", file, "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 6, r.stdout)
	require.Regexp(t, `^line 2: task line-[0-9a-f]{32} \(type sleep, tenant acme, queue `+regexp.QuoteMeta(c.queue)+`\)$`, lines[1])
	require.Equal(t, "dry run: the 5 jobs of "+file+" would be enqueued; nothing was enqueued", lines[5])
	require.Len(t, c.tasks(t), 5)

	// --random-ids: every run enqueues every line again.
	r = c.run(t, nil, "--file", file, "--random-ids")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^enqueued 5 of 5 jobs from `, r.stdout)
	require.Len(t, c.tasks(t), 10)

	// A byte order mark anywhere but the start is named.
	file = write(job, "\xef\xbb\xbf"+job)
	r = c.run(t, nil, "--file", file, "--dry-run")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "enqueue: line 2: not valid JSON: the line starts with a byte order mark (U+FEFF); only the file's first line may have one\n")
}

func testStdin(t *testing.T, c *cli) {
	var b strings.Builder
	for i := 1; i <= 600; i++ {
		b.WriteString(`{"tenant":"t` + strconv.Itoa(i%7) + `","type":"sleep","payload":{"ms":1}}` + "\n")
	}
	r := c.run(t, []byte(b.String()), "--file", "-")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^enqueued 600 of 600 jobs from standard input in `, r.stdout)
	require.Len(t, c.tasks(t), 600)
}

// testCron: the job on a schedule until SIGINT, then the exact count.
func testCron(t *testing.T, c *cli) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := c.command(ctx, t, nil, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "--queue", c.queue, "--cron", "@every 1s", "--tenant", "acme", "--type", "sleep", "--count", "2")
	var stdout, stderr clitest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	deadline := time.Now().Add(20 * time.Second)
	for len(c.tasks(t)) < 4 {
		require.True(t, time.Now().Before(deadline), "two runs within 20s; stderr: %s", stderr.String())
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), stderr.String())
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	n := len(c.tasks(t))
	require.Equal(t, "stopped: enqueued "+strconv.Itoa(n)+" jobs in "+strconv.Itoa(n/2)+" runs", lines[len(lines)-1])
	require.Len(t, lines, n/2+1)
	for _, l := range lines[:n/2] {
		require.Regexp(t, `^\S+Z enqueued 2 of 2 jobs for tenant acme$`, l)
	}
	require.Regexp(t, `^enqueue: on schedule "@every 1s" until SIGINT or SIGTERM \(Ctrl-C\); first run at \S+\n$`, stderr.String())
}

// testPriority: --priority and a line's "priority" put a job at its level
// of its tenant's line (high leave first, low last); a bad level is
// refused with the fix and enqueues nothing.
func testPriority(t *testing.T, c *cli) {
	client := redistest.Client(t)
	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: c.prefix})
	require.NoError(t, err)
	defer lim.Close()

	r := c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "n1")
	require.Equal(t, result{stdout: "enqueued task n1 (type sleep, tenant acme, queue " + c.queue + ", waiting in its tenant's line)\n"}, r)
	r = c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "l1", "--priority", "low")
	require.Equal(t, result{stdout: "enqueued task l1 (type sleep, tenant acme, queue " + c.queue + ", low priority, waiting in its tenant's line)\n"}, r)

	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	write := func(lines ...string) {
		require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	}
	write(`{"tenant":"acme","type":"sleep","priority":"high","id":"h1"}`, `{"tenant":"acme","type":"sleep","priority":"urgent","id":"h2"}`, `{"tenant":"acme","type":"sleep","priority":1,"id":"h3"}`)
	r = c.run(t, nil, "--file", file)
	require.Equal(t, 1, r.code)
	require.Equal(t, `enqueue: line 2: priority "urgent": must be "high", "normal" or "low"; leave "priority" out for normal
enqueue: line 3: "priority" is a JSON number; want a string
enqueue: 2 of 3 lines of `+file+` are bad (reported above): nothing was enqueued; fix them and run again (--partial enqueues the good lines and reports the bad ones)
`, r.stderr)
	require.Len(t, c.tasks(t), 2, "a bad line enqueues nothing")

	// --priority is the default of the lines without one.
	write(`{"tenant":"acme","type":"sleep","priority":"high","id":"h1"}`, `{"tenant":"acme","type":"sleep","id":"l2"}`, `{"tenant":"acme","type":"sleep","priority":"normal","id":"n2"}`)
	r = c.run(t, nil, "--file", file, "--priority", "low", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "line 1: task h1 (type sleep, tenant acme, queue "+c.queue+", high priority)\n"+
		"line 2: task l2 (type sleep, tenant acme, queue "+c.queue+", low priority)\n"+
		"line 3: task n2 (type sleep, tenant acme, queue "+c.queue+")\n"+
		"dry run: the 3 jobs of "+file+" would be enqueued; nothing was enqueued\n", r.stdout)
	r = c.run(t, nil, "--file", file, "--priority", "low", "--quiet")
	require.Equal(t, 0, r.code, r.stderr)

	tasks := c.tasks(t)
	require.Len(t, tasks, 5)
	for id, want := range map[string]string{"h1": "high", "l1": "low", "l2": "low", "n1": "", "n2": ""} {
		require.Equal(t, want, tasks[id].Headers[taskspec.PriorityHeader], id)
	}
	line, err := lim.ExplainLine(context.Background(), "acme", c.queue, 0)
	require.NoError(t, err)
	var order []string
	for _, x := range line {
		order = append(order, x.ID+"/"+taskspec.Priority(x.Priority).String())
	}
	require.Equal(t, []string{"h1/high", "n1/normal", "n2/normal", "l1/low", "l2/low"}, order)

	r = c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--count", "3", "--priority", "high", "--dry-run")
	require.Equal(t, result{stdout: "dry run: would enqueue 3 jobs of type sleep for tenant acme in queue " + c.queue + ", high priority; nothing was enqueued\n"}, r)
}

// testPools: --pool and a line's "pools" name the shared pools a job draws
// from (taskspec.PoolsHeader); a bad name is refused, naming it, and
// nothing is enqueued.
// testKeys: --key and a line's "key" give a job its key below its tenant
// (the sluice-key header); a key that cannot be used is refused with the
// fix, nothing enqueued.
func testKeys(t *testing.T, c *cli) {
	r := c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "k1", "--key", "user-42")
	require.Equal(t, 0, r.code, r.stderr)
	r = c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "k2", "--key", "*")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `key "*" names every key in a policy's name`)

	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(`{"tenant":"acme","type":"sleep","key":"u1","id":"f1"}`+"\n"+`{"tenant":"acme","type":"sleep","key":"","id":"f2"}`+"\n"), 0o600))
	r = c.run(t, nil, "--file", file)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `enqueue: line 2: key: invalid tenant: the key is empty`)
	require.NoError(t, os.WriteFile(file, []byte(`{"tenant":"acme","type":"sleep","key":"u1","id":"f1"}`+"\n"+`{"tenant":"acme","type":"sleep","id":"f2"}`+"\n"), 0o600))
	r = c.run(t, nil, "--file", file, "--key", "u9", "--quiet")
	require.Equal(t, 0, r.code, r.stderr)
	tasks := c.tasks(t)
	require.Len(t, tasks, 3)
	for id, want := range map[string]string{"k1": "user-42", "f1": "u1", "f2": "u9"} {
		require.Equal(t, want, tasks[id].Headers[taskspec.KeyHeader], id)
	}
}

func testPools(t *testing.T, c *cli) {
	r := c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "p1", "--pool", "@api", "--pool", "@db", "--pool", "@api")
	require.Equal(t, 0, r.code, r.stderr)
	r = c.run(t, nil, "--tenant", "acme", "--type", "sleep", "--id", "p2", "--pool", "api")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `pool "api": a pool's name starts with @`)

	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(`{"tenant":"acme","type":"sleep","pools":["@api"],"id":"f1"}`+"\n"+`{"tenant":"acme","type":"sleep","pools":["@Api"],"id":"f2"}`+"\n"), 0o600))
	r = c.run(t, nil, "--file", file)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `enqueue: line 2: pools: pool "@Api": 'A' at byte 1 is not allowed`)
	require.NoError(t, os.WriteFile(file, []byte(`{"tenant":"acme","type":"sleep","pools":["@api"],"id":"f1"}`+"\n"+`{"tenant":"acme","type":"sleep","id":"f2"}`+"\n"), 0o600))
	r = c.run(t, nil, "--file", file, "--pool", "@smtp", "--quiet")
	require.Equal(t, 0, r.code, r.stderr)
	tasks := c.tasks(t)
	require.Len(t, tasks, 3)
	for id, want := range map[string]string{"p1": "@api,@db", "f1": "@api", "f2": "@smtp"} {
		require.Equal(t, want, tasks[id].Headers[taskspec.PoolsHeader], id)
	}
}
