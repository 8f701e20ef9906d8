package main

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/sluicehq/sluice/internal/waitroom"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{}) // as main does: tests stop servers on purpose
	redistest.Main(m)
}

// cli runs the sluice binary built once by TestCLI.
type cli struct {
	bin    string
	url    string
	prefix string
	client *redis.Client
}

type result struct {
	code           int
	stdout, stderr string
}

// TestCLI builds the binary once (into a directory removed when every
// subtest is done) and runs the binary's tests against a private Redis.
func TestCLI(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sluice")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	for name, fn := range map[string]func(*testing.T, *cli){
		"Help":                 testHelp,
		"Version":              testVersion,
		"PolicyCommands":       testPolicyCommands,
		"FlagsAnywhere":        testFlagsAnywhere,
		"BadUsage":             testBadUsage,
		"Unreachable":          testUnreachable,
		"ApplyAllOrNothing":    testApplyAllOrNothing,
		"Apply":                testApply,
		"StatsJSON":            testStatsJSON,
		"StatsTable":           testStatsTable,
		"AdmitDryRun":          testAdmitDryRun,
		"TopOnce":              testTopOnce,
		"Dashboard":            testDashboard,
		"DashboardFleet":       testDashboardFindsTheFleet,
		"DashboardHistory":     testDashboardHistoryFromPrometheus,
		"DashboardAuth":        testDashboardAuth,
		"PolicyListEmptyState": testPolicyListEmpty,
		"Cluster":              testCluster,
		"InvalidNames":         testInvalidNames,
		"RangeEdge":            testRangeEdge,
		"Jobs":                 testJobs,
		"Learned":              testLearned,
		"Adaptive":             testAdaptive,
		"JobsExplain":          testJobsExplain,
		"JobsPrioritize":       testJobsPrioritize,
		"Shadow":               testShadow,
		"Pools":                testPools,
		"Keys":                 testKeys,
		"TopSettled":           testTopSettled,
		"AsynqURLForms":        testAsynqURLForms,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, &cli{bin: bin, url: redistest.URL(t), prefix: redistest.Prefix(t), client: redistest.Client(t)})
		})
	}
}

// run runs sluice with --prefix set to the test's prefix and
// SLUICE_REDIS_URL to the test server.
func (c *cli) run(t *testing.T, args ...string) result {
	t.Helper()
	return c.runWith(t, nil, map[string]string{"SLUICE_REDIS_URL": c.url}, append([]string{"--prefix", c.prefix}, args...)...)
}

func (c *cli) runWith(t *testing.T, stdin []byte, env map[string]string, args ...string) result {
	t.Helper()
	code, stdout, stderr := clitest.Run(t, c.bin, stdin, env, args...)
	return result{code: code, stdout: stdout, stderr: stderr}
}

func (c *cli) policies(t *testing.T) map[string]string {
	t.Helper()
	h, err := c.client.HGetAll(context.Background(), c.prefix+":{p}:policies").Result()
	require.NoError(t, err)
	return h
}

func (c *cli) limiter(t *testing.T) *throttle.Limiter {
	t.Helper()
	l, err := throttle.NewLimiter(c.client, &throttle.Config{Prefix: c.prefix})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

func (c *cli) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := c.run(t, args...)
	require.Equal(t, 0, r.code, "sluice %v: %s", args, r.stderr)
	return r.stdout
}

func testHelp(t *testing.T, c *cli) {
	r := c.runWith(t, nil, nil, "--help")
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stderr)
	clitest.Golden(t, "help", r.stdout)
	for _, args := range [][]string{{"help"}, {"-h"}} {
		again := c.runWith(t, nil, nil, args...)
		require.Equal(t, r, again, "sluice %v", args)
	}

	sub := c.runWith(t, nil, nil, "help", "policy", "apply")
	require.Equal(t, 0, sub.code)
	require.True(t, strings.HasPrefix(sub.stdout, "usage: sluice policy apply -f FILE.yaml [--prune] [--dry-run]\n"), sub.stdout)
	require.Contains(t, sub.stdout, "Rules (policy set, policy apply)")
	require.Equal(t, sub, c.runWith(t, nil, nil, "policy", "apply", "--help"))

	group := c.runWith(t, nil, nil, "help", "policy")
	require.Equal(t, 0, group.code)
	require.Contains(t, group.stdout, "  sluice policy set TENANT 'RULES' [--shadow]\n")
	require.Contains(t, group.stdout, "  sluice policy delete TENANT [--shadow] | --invalid\n")
	require.Equal(t, group, c.runWith(t, nil, nil, "policy", "--help"))

	// No command at all: the usage, on stderr, exit 2.
	none := c.runWith(t, nil, nil)
	require.Equal(t, result{code: 2, stderr: "sluice: no command given\nusage: sluice [--redis URL] [--prefix PREFIX] COMMAND [ARGS]\nrun 'sluice help' for the commands and flags\n"}, none)
}

func testVersion(t *testing.T, c *cli) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := c.runWith(t, nil, nil, args...)
		require.Equal(t, 0, r.code)
		require.Regexp(t, `^sluice \S+ go1\.\S+ \w+/\w+\n$`, r.stdout)
	}
}

func testPolicyCommands(t *testing.T, c *cli) {
	require.Equal(t, "set policy acme: rate=100/s burst=20 concurrency=5\n",
		c.mustRun(t, "policy", "set", "acme", "rate=100/s burst=20 concurrency=5"))
	require.Equal(t, "set policy acme: rate=100/s burst=20 quota=1000/day concurrency=5\n  was: rate=100/s burst=20 concurrency=5\n",
		c.mustRun(t, "policy", "set", "acme", "rate=100/s burst=20 concurrency=5 quota=1000/day"))
	require.Equal(t, "set policy acme: rate=100/s burst=20 quota=1000/day concurrency=5\n  (unchanged)\n",
		c.mustRun(t, "policy", "set", "acme", "rate=100/s", "burst=20", "quota=1000/day", "concurrency=5"))
	c.mustRun(t, "policy", "set", "*", "rate=10/s")
	c.mustRun(t, "policy", "set", "@global", "rate=1000/s window=50000/min")
	c.mustRun(t, "policy", "set", "we{ird} tenant", "concurrency=1 lease=10s")
	require.Equal(t, "set policy open: (no rules: nothing is limited)\n", c.mustRun(t, "policy", "set", "open", ""))
	// A rate given twice is one rule, kept once, and the user is told.
	r := c.run(t, "policy", "set", "twice", "rate=1/s rate=1/s")
	require.Equal(t, result{code: 0, stdout: "set policy twice: rate=1/s\n", stderr: "sluice: note: a rate given twice is one rule; it is kept once\n"}, r)
	require.Equal(t, "rate=1/s\n", c.mustRun(t, "policy", "get", "twice"))
	c.mustRun(t, "policy", "delete", "twice")

	require.Equal(t, "rate=100/s burst=20 quota=1000/day concurrency=5\n", c.mustRun(t, "policy", "get", "acme"))
	require.Equal(t, "rate=1000/s window=50000/min\n", c.mustRun(t, "policy", "get", "@global"))
	require.Equal(t, "{\n  \"name\": \"acme\",\n  \"policy\": \"rate=100/s burst=20 quota=1000/day concurrency=5\"\n}\n", c.mustRun(t, "policy", "get", "--json", "acme"))

	clitest.Golden(t, "policy_list", c.mustRun(t, "policy", "list"))
	clitest.Golden(t, "policy_list_json", c.mustRun(t, "policy", "list", "--json"))
	// -o json is --json; another output is refused, naming --json
	for _, o := range [][]string{{"-o", "json"}, {"-o=json"}, {"--output", "json"}} {
		clitest.Golden(t, "policy_list_json", c.mustRun(t, append([]string{"policy", "list"}, o...)...))
	}
	r = c.run(t, "policy", "list", "-o", "yaml")
	require.Equal(t, result{code: 2, stderr: "sluice: policy list: invalid value \"yaml\" for flag --o: want json (-o json is --json; leave both out for the table)\nusage: sluice policy list [--shadow] [--json]\nrun 'sluice help policy list' for details\n"}, r)
	require.Equal(t, 2, c.run(t, "policy", "set", "acme", "rate=1/s", "-o", "json").code, "policy set prints no JSON")

	r = c.run(t, "policy", "get", "bob")
	require.Equal(t, result{code: 1, stderr: "sluice: no policy for \"bob\"; it follows the default policy *: rate=10/s\n"}, r)

	require.Equal(t, "deleted policy acme (its throttle state is kept)\n", c.mustRun(t, "policy", "delete", "acme"))
	require.Equal(t, "no policy acme; nothing deleted\n", c.mustRun(t, "policy", "delete", "acme"))
	c.mustRun(t, "policy", "delete", "*")
	r = c.run(t, "policy", "get", "acme")
	require.Equal(t, 1, r.code)
	require.Equal(t, "sluice: no policy for \"acme\" and no default policy *: its jobs are limited by @global only; set one with: sluice policy set acme 'RULES'\n", r.stderr)
	r = c.run(t, "policy", "get", "*")
	require.Equal(t, result{code: 1, stderr: "sluice: no policy *; set one with: sluice policy set '*' 'RULES'\n"}, r)
}

func testPolicyListEmpty(t *testing.T, c *cli) {
	r := c.run(t, "policy", "list")
	require.Equal(t, result{code: 0, stdout: "NAME  POLICY\n", stderr: "no policies yet; set one with: sluice policy set TENANT 'RULES'\n"}, r)
	require.Equal(t, "[]\n", c.mustRun(t, "policy", "list", "--json"))
	r = c.run(t, "stats")
	require.Equal(t, 0, r.code)
	require.Equal(t, "no tenant has a policy or throttle state yet\n", r.stderr)
	require.Equal(t, "{\n  \"now\": \"<time>\",\n  \"tenants\": []\n}\n", maskTimes(c.mustRun(t, "stats", "--json")))
}

func testFlagsAnywhere(t *testing.T, c *cli) {
	// Global flags after the command, the redis URL from the flag instead of the environment.
	r := c.runWith(t, nil, nil, "policy", "set", "acme", "rate=5/s", "--redis", c.url, "--prefix", c.prefix)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, map[string]string{"acme": ""}, keysOnly(c.policies(t)))
	// "--" ends the flags, for a tenant that starts with a dash.
	c.mustRun(t, "policy", "set", "--", "-dash", "rate=1/s")
	require.Equal(t, "rate=1/s\n", c.mustRun(t, "policy", "get", "--", "-dash"))
	// The flag wins over the environment.
	r = c.runWith(t, nil, map[string]string{"SLUICE_REDIS_URL": "redis://127.0.0.1:1"}, "--redis", c.url, "--prefix", c.prefix, "policy", "get", "acme")
	require.Equal(t, result{code: 0, stdout: "rate=5/s\n"}, r)
}

func keysOnly(m map[string]string) map[string]string {
	out := map[string]string{}
	for k := range m {
		out[k] = ""
	}
	return out
}

// dashUsage is sluice dashboard's usage line.
const dashUsage = "sluice dashboard [--listen 127.0.0.1:8080] [--metrics URL]... [--prometheus URL] [--allow-write]"

func testBadUsage(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	before := c.policies(t)
	tests := []struct {
		args    []string
		env     map[string]string // replaces the default environment when set
		wantMsg string
		usage   string // the usage line printed after the message
	}{
		{args: []string{"polcy", "list"}, wantMsg: `unknown command "polcy"; commands: policy, stats, top, dashboard, admit, jobs, version, help`, usage: "sluice [--redis URL] [--prefix PREFIX] COMMAND [ARGS]"},
		{args: []string{"--bogus", "policy", "list"}, wantMsg: "unknown flag --bogus", usage: "sluice [--redis URL] [--prefix PREFIX] COMMAND [ARGS]"},
		{args: []string{"policy"}, wantMsg: "policy needs a subcommand: set, get, list, delete, apply", usage: "sluice policy set|get|list|delete|apply ..."},
		{args: []string{"policy", "sett", "acme", "rate=1/s"}, wantMsg: `unknown subcommand "sett" of policy; use one of: set, get, list, delete, apply`, usage: "sluice policy set|get|list|delete|apply ..."},
		{args: []string{"policy", "list", "--jsn"}, wantMsg: "policy list: unknown flag --jsn", usage: "sluice policy list [--shadow] [--json]"},
		{args: []string{"policy", "list", "extra"}, wantMsg: `policy list: unexpected argument "extra"`, usage: "sluice policy list [--shadow] [--json]"},
		{args: []string{"policy", "set", "acme", "rate=abc"}, wantMsg: "policy set acme: rate=abc: ", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme", "rate=10/s bogus=1"}, wantMsg: "policy set acme: bogus=1: unknown option; known: rate burst window quota", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme", "=5"}, wantMsg: `policy set acme: "=5": no option name before =; options are written key=value`, usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme", "rate=1/s burst=10000000000000"}, wantMsg: "policy set acme: rate[0] 1/s burst 10000000000000: a full bucket spans 10000000000000 × 1s = 317098 years; the engine computes exactly only up to 2^52 µs (about 142 years): give burst 4503599627 or less", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme", "rate=1/h burst=3000000000"}, wantMsg: "policy set acme: rate[0] 1/h burst 3000000000: a full bucket spans 3000000000 × 1h = 342466 years; ", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme", "rate=1/day burst=200000000"}, wantMsg: "policy set acme: rate[0] 1/day burst 200000000: ", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme", "burst=5"}, wantMsg: "policy set acme: burst=5: burst belongs to a rate", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set"}, wantMsg: "policy set: missing TENANT", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "acme"}, wantMsg: "policy set: missing RULES (quote them: sluice policy set acme 'rate=100/s burst=20'; '' for no limits)", usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "@Foo Bar", "rate=1/s"}, wantMsg: `invalid tenant: policy name "@Foo Bar": names starting with @ are @global, shared pools`, usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "get"}, wantMsg: "policy get: missing TENANT", usage: "sluice policy get TENANT [--shadow] [--json]"},
		{args: []string{"policy", "get", "a", "b"}, wantMsg: `policy get: unexpected argument "b"`, usage: "sluice policy get TENANT [--shadow] [--json]"},
		{args: []string{"policy", "delete", strings.Repeat("x", 300)}, wantMsg: "invalid tenant: tenant", usage: "sluice policy delete TENANT [--shadow] | --invalid"},
		{args: []string{"policy", "delete", "acme", "--invalid"}, wantMsg: "policy delete: give TENANT (with --shadow for its shadow) or --invalid, not both", usage: "sluice policy delete TENANT [--shadow] | --invalid"},
		{args: []string{"policy", "set", "a\nb", "rate=1/s"}, wantMsg: `invalid tenant: tenant "a\nb" has a control character (U+000A) at byte 1`, usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "set", "tab\there", "rate=1/s"}, wantMsg: `invalid tenant: tenant "tab\there" has a control character (U+0009)`, usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"policy", "get", "\x1b[31mred"}, wantMsg: `invalid tenant: tenant "\x1b[31mred" has a control character (U+001B) at byte 0`, usage: "sluice policy get TENANT [--shadow] [--json]"},
		{args: []string{"stats", "a\u0085"}, wantMsg: `invalid tenant: tenant "a\u0085" has a control character (U+0085)`, usage: "sluice stats [TENANT] [--json]"},
		{args: []string{"admit", "a\x7f", "--dry-run"}, wantMsg: `invalid tenant: tenant "a\x7f" has a control character (U+007F)`, usage: "sluice admit TENANT --dry-run [--cost N] [--id JOB] [--json]"},
		{args: []string{"policy", "apply"}, wantMsg: "policy apply: missing -f FILE.yaml (- reads standard input)", usage: "sluice policy apply -f FILE.yaml [--prune] [--dry-run]"},
		{args: []string{"policy", "apply", "-f"}, wantMsg: "policy apply: flag --f needs a value", usage: "sluice policy apply -f FILE.yaml [--prune] [--dry-run]"},
		{args: []string{"stats", "a", "b"}, wantMsg: `stats: unexpected argument "b"`, usage: "sluice stats [TENANT] [--json]"},
		{args: []string{"stats", "*"}, wantMsg: "* is the default policy, not a tenant", usage: "sluice stats [TENANT] [--json]"},
		{args: []string{"admit", "acme"}, wantMsg: "admit needs --dry-run", usage: "sluice admit TENANT --dry-run [--cost N] [--id JOB] [--json]"},
		{args: []string{"admit", "--dry-run"}, wantMsg: "admit: missing TENANT", usage: "sluice admit TENANT --dry-run [--cost N] [--id JOB] [--json]"},
		{args: []string{"admit", "acme", "--dry-run", "--cost", "0"}, wantMsg: "--cost 0: must be at least 1", usage: "sluice admit TENANT --dry-run [--cost N] [--id JOB] [--json]"},
		{args: []string{"admit", "acme", "--dry-run", "--cost", "abc"}, wantMsg: `admit: invalid value "abc" for flag --cost`, usage: "sluice admit TENANT --dry-run [--cost N] [--id JOB] [--json]"},
		{args: []string{"top", "--interval", "0"}, wantMsg: `top: invalid value "0" for flag --interval: want a positive duration such as 1s or 500ms`, usage: "sluice top [--once] [--interval 1s] [--limit N] [--json]"},
		{args: []string{"top", "--limit", "-1"}, wantMsg: "--limit -1: must be 0 (as many as fit) or more", usage: "sluice top [--once] [--interval 1s] [--limit N] [--json]"},
		{args: []string{"dashboard", "--listen", "0.0.0.0:8080"}, wantMsg: `--listen "0.0.0.0:8080": not a loopback address; the dashboard serves 127.0.0.1 or localhost only unless --public is given (and with --allow-write, a credential: --auth-file)`, usage: dashUsage},
		{args: []string{"dashboard", "--listen", ":8080"}, wantMsg: `--listen ":8080": not a loopback address`, usage: dashUsage},
		{args: []string{"dashboard", "--listen", "8080"}, wantMsg: `--listen "8080": want HOST:PORT such as 127.0.0.1:8080 (port 0 picks a free one)`, usage: dashUsage},
		{args: []string{"dashboard", "--listen", "0.0.0.0:8080", "--public", "--allow-write"}, wantMsg: `--public with --allow-write: whoever reaches 0.0.0.0:8080 could pause queues and delete tasks; give a credential with --auth-file FILE or SLUICE_DASHBOARD_AUTH (USER:PASSWORD for basic auth, or a token), or drop --allow-write`, usage: dashUsage},
		{args: []string{"dashboard", "--auth-file", "/nonexistent/auth"}, wantMsg: `--auth-file /nonexistent/auth: no such file or directory`, usage: dashUsage},
		{args: []string{"dashboard", "--prometheus", "prometheus:9090"}, wantMsg: `--prometheus "prometheus:9090": want the URL of a Prometheus server that scrapes the workers, such as http://127.0.0.1:9090 (its API is below it, at /api/v1/)`, usage: dashUsage},
		{args: []string{"dashboard", "--metrics", "127.0.0.1:9464"}, wantMsg: `--metrics "127.0.0.1:9464": want a worker's metrics URL such as http://127.0.0.1:9464/metrics (its --admin address)`, usage: dashUsage},
		{args: []string{"dashboard", "--interval", "2s", "--history", "1s"}, wantMsg: "--history 1s: must be at least --interval (2s)", usage: dashUsage},
		{args: []string{"dashboard", "--interval", "10ms"}, wantMsg: "--interval 10ms: must be at least 100ms (each sample reads every followed tenant's state)", usage: dashUsage},
		{args: []string{"dashboard", "--max-tenants", "0"}, wantMsg: "--max-tenants 0: must be at least 1 (default 500)", usage: dashUsage},
		{args: []string{"dashboard", "extra"}, wantMsg: `dashboard: unexpected argument "extra"`, usage: dashUsage},
		{args: []string{"version", "extra"}, wantMsg: `version takes no arguments, got "extra"`, usage: "sluice version"},
		{args: []string{"help", "nope"}, wantMsg: `no command "nope"`, usage: "sluice [--redis URL] [--prefix PREFIX] COMMAND [ARGS]"},
		{args: []string{"--redis", "foo", "policy", "list"}, wantMsg: `--redis: Redis URL "foo": no scheme; write it as a URL, e.g. redis://foo; accepted forms: redis://[USER:PASSWORD@]HOST:PORT[/DB], `, usage: "sluice policy list [--shadow] [--json]"},
		{args: []string{"--redis", "redis://u:secret@h:1/x", "policy", "set", "acme", "rate=1/s"}, wantMsg: `--redis: Redis URL "redis://u:xxxxx@h:1/x": database "x": must be a number`, usage: "sluice policy set TENANT 'RULES' [--shadow]"},
		{args: []string{"--prefix", "a{b}", "policy", "list"}, wantMsg: `--prefix "a{b}": must not contain { or }`, usage: "sluice policy list [--shadow] [--json]"},
		{args: []string{"policy", "list"}, env: map[string]string{"SLUICE_REDIS_URL": "http://x"}, wantMsg: `SLUICE_REDIS_URL: Redis URL "http://x": unknown scheme "http"`, usage: "sluice policy list [--shadow] [--json]"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var r result
			if tt.env != nil {
				r = c.runWith(t, nil, tt.env, append([]string{"--prefix", c.prefix}, tt.args...)...)
			} else {
				r = c.run(t, tt.args...)
			}
			require.Equal(t, 2, r.code, r.stderr)
			require.Empty(t, r.stdout)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			require.Len(t, lines, 3, r.stderr)
			require.True(t, strings.HasPrefix(lines[0], "sluice: "+tt.wantMsg), "got %q\nwant prefix %q", lines[0], "sluice: "+tt.wantMsg)
			require.Equal(t, "usage: "+tt.usage, lines[1])
			require.True(t, strings.HasPrefix(lines[2], "run 'sluice help"), lines[2])
			require.NotContains(t, r.stderr, "secret")
			require.Equal(t, before, c.policies(t), "a bad command line changes nothing")
		})
	}
}

func testUnreachable(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	before := c.policies(t)
	port, err := redistest.FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	file := filepath.Join(t.TempDir(), "p.yaml")
	require.NoError(t, os.WriteFile(file, []byte("acme: rate=1/s\n"), 0o600))
	want := "sluice: cannot reach Redis at " + addr + ": connection refused; is redis-server running? set --redis or SLUICE_REDIS_URL\n"
	for _, args := range [][]string{
		{"policy", "set", "acme", "rate=1/s"},
		{"policy", "get", "acme"},
		{"policy", "list"},
		{"policy", "delete", "acme"},
		{"policy", "apply", "-f", file},
		{"stats"},
		{"stats", "acme", "--json"},
		{"top", "--once"},
		{"admit", "acme", "--dry-run"},
		{"dashboard", "--listen", "127.0.0.1:0"},
	} {
		start := time.Now()
		r := c.runWith(t, nil, map[string]string{"SLUICE_REDIS_URL": "redis://" + addr}, append([]string{"--prefix", c.prefix}, args...)...)
		require.Equal(t, result{code: 1, stderr: want}, r, "sluice %v", args)
		require.Less(t, time.Since(start), 10*time.Second, "a refused connection is reported at once")
	}
	r := c.runWith(t, nil, nil, "--redis", "memory://"+addr, "policy", "list")
	require.Equal(t, result{code: 1, stderr: "sluice: cannot reach Redis at " + addr + ": connection refused; is a worker started with --redis memory://" + addr + " running? set --redis or SLUICE_REDIS_URL\n"}, r)
	require.Equal(t, before, c.policies(t))
}

func testApplyAllOrNothing(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	c.mustRun(t, "policy", "set", "old", "concurrency=2")
	before := c.policies(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}
	tests := []struct {
		name, text, wantMsg string
	}{
		{"bad-rate.yaml", "acme: rate=20/s\nnew: rate=5/s\nbroken:\n  rate: 10/fortnight\n", `policy file line 4, "broken": `},
		{"bad-field.yaml", "acme: rate=20/s\nbroken:\n  rate: 10/s\n  burts: 5\n", `policy file line 3, "broken": line 4: unknown field "burts"`},
		{"bad-name.yaml", "acme: rate=20/s\n\"@No pe\": rate=1/s\n", `policy file line 2: invalid tenant: policy name "@No pe"`},
		{"ctl-name.yaml", "acme: rate=20/s\n\"a\\tb\": rate=1/s\n", `policy file line 2: invalid tenant: tenant "a\tb" has a control character (U+0009) at byte 1`},
		{"nul-name.yaml", "\"a\\0b\": rate=1/s\n", `policy file line 1: invalid tenant: tenant "a\x00b" has a control character (U+0000) at byte 1`},
		{"dup.yaml", "acme: rate=20/s\nacme: rate=30/s\n", `policy file line 2: "acme" is given twice`},
		{"not-yaml.yaml", "acme: [rate\n", "policy file: not valid YAML"},
		{"list.yaml", "- acme\n", "policy file line 1: want a mapping of policy name to policy"},
	}
	for _, tt := range tests {
		path := write(tt.name, tt.text)
		for _, extra := range [][]string{nil, {"--prune"}} {
			r := c.run(t, append([]string{"policy", "apply", "-f", path}, extra...)...)
			require.Equal(t, 1, r.code, "%s: %s", tt.name, r.stderr)
			require.Empty(t, r.stdout)
			require.True(t, strings.HasPrefix(r.stderr, "sluice: "+path+": "+tt.wantMsg), "%s: %s", tt.name, r.stderr)
			require.True(t, strings.HasSuffix(r.stderr, "; nothing was changed\n"), r.stderr)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
			require.Equal(t, before, c.policies(t), "%s changed the policies", tt.name)
		}
	}
	r := c.run(t, "policy", "apply", "-f", filepath.Join(dir, "missing.yaml"))
	require.Equal(t, result{code: 1, stderr: "sluice: cannot read the policy file " + filepath.Join(dir, "missing.yaml") + ": no such file or directory\n"}, r)
	empty := write("empty.yaml", "# nothing\n")
	r = c.run(t, "policy", "apply", "-f", empty, "--prune")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "lists no policies: with --prune that would delete every policy; nothing was changed")
	require.Equal(t, before, c.policies(t))
}

func testApply(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	c.mustRun(t, "policy", "set", "same", "concurrency=2")
	c.mustRun(t, "policy", "set", "old", "concurrency=3")
	file := filepath.Join(t.TempDir(), "policies.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`"*": rate=10/s concurrency=2
"@global":
  rate: 1000/s
acme:
  rate: [100/s burst 20, 5000/h]
  quota: 10000/day
  tz: America/Los_Angeles
  concurrency: 5
same: concurrency=2
`), 0o600))
	before := c.policies(t)
	out := c.mustRun(t, "policy", "apply", "-f", file, "--dry-run")
	require.Equal(t, before, c.policies(t), "--dry-run changes nothing")
	require.True(t, strings.HasSuffix(out, "dry run, nothing was changed: "+file+" would be 2 created, 1 updated, 1 unchanged; 1 other policies kept (--prune deletes them)\n"), out)

	out = c.mustRun(t, "policy", "apply", "-f", file)
	require.Equal(t, `created    *        rate=10/s concurrency=2
created    @global  rate=1000/s
updated    acme     rate=100/s burst=20 rate=5000/h quota=10000/day tz=America/Los_Angeles concurrency=5 (was: rate=10/s)
unchanged  same     concurrency=2
applied `+file+`: 2 created, 1 updated, 1 unchanged; 1 other policies kept (--prune deletes them)
`, out)
	require.Equal(t, "rate=100/s burst=20 rate=5000/h quota=10000/day tz=America/Los_Angeles concurrency=5\n", c.mustRun(t, "policy", "get", "acme"))
	require.Equal(t, "concurrency=3\n", c.mustRun(t, "policy", "get", "old"))

	// --prune from standard input.
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	r := c.runWith(t, data, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "policy", "apply", "-f", "-", "--prune")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "deleted    old")
	require.True(t, strings.HasSuffix(r.stdout, "applied -: 0 created, 0 updated, 4 unchanged, 1 deleted\n"), r.stdout)
	require.Equal(t, map[string]string{"*": "", "@global": "", "acme": "", "same": ""}, keysOnly(c.policies(t)))
}

var (
	timeRE  = regexp.MustCompile(`"\d{4}-\d\d-\d\dT[^"]*"`)
	aheadRE = regexp.MustCompile(`"((started_)?ahead_ms)": [0-9.]+`)
)

// maskTimes replaces what depends on the clock in JSON output.
func maskTimes(s string) string {
	s = timeRE.ReplaceAllString(s, `"<time>"`)
	return aheadRE.ReplaceAllString(s, `"$1": "<duration>"`)
}

// seedState gives a few tenants throttle state through the Go API.
func seedState(t *testing.T, c *cli) {
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "acme", "rate=1/h burst=5 concurrency=3 quota=1000/day tz=UTC backlog=100")
	c.mustRun(t, "policy", "set", "quiet", "window=10/min")
	c.mustRun(t, "policy", "set", "@global", "rate=1/h burst=1000")
	l := c.limiter(t)
	for _, id := range []string{"job-1", "job-2"} {
		d, err := l.Admit(ctx, "acme", id)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	_, _, err := waitroom.Of(l).Join(ctx, "acme", 100, waitroom.Waiter{ID: "job-3"}, waitroom.Waiter{ID: "job-4"}, waitroom.Waiter{ID: "job-5"})
	require.NoError(t, err)
	_, err = l.Cooldown(ctx, "cooling", time.Hour)
	require.NoError(t, err)
}

func testStatsJSON(t *testing.T, c *cli) {
	seedState(t, c)
	clitest.Golden(t, "stats_json", maskTimes(c.mustRun(t, "stats", "--json")))
	one := maskTimes(c.mustRun(t, "stats", "acme", "--json"))
	require.Contains(t, one, `"tenant": "acme"`)
	require.NotContains(t, one, `"tenant": "quiet"`)
}

func testStatsTable(t *testing.T, c *cli) {
	seedState(t, c)
	out := c.mustRun(t, "stats")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 5, out)
	require.Regexp(t, `^TENANT\s+POLICY\s+STARTED\s+RATE \(FREE/BURST\)\s+WINDOW\s+QUOTA\s+IN FLIGHT\s+RESERVED\s+COOLDOWN\s+WAITING$`, lines[0])
	require.Regexp(t, `^@global\s+@global\s+2\s+998/1000 of 1/h\s+-\s+-\s+-\s+0\s+-\s+0$`, lines[1])
	require.Regexp(t, `^acme\s+acme\s+2\s+3/5 of 1/h\s+-\s+2 of 1000/day\s+2/3\s+0\s+-\s+3/100$`, lines[2])
	require.Regexp(t, `^cooling\s+-\s+0\s+-\s+-\s+-\s+-\s+0\s+\S+ left\s+0$`, lines[3])
	require.Regexp(t, `^quiet\s+quiet\s+0\s+-\s+0 of 10/min\s+-\s+-\s+0\s+-\s+0$`, lines[4])

	detail := c.mustRun(t, "stats", "acme")
	require.Contains(t, detail, "policy       acme: rate=1/h burst=5 quota=1000/day tz=UTC concurrency=3 backlog=100\n")
	require.Contains(t, detail, "concurrency  2 of 3 in flight\n")
	require.Regexp(t, `\n\s+job-1 \(lease ends in \S+\)\n`, detail)
	require.Regexp(t, `\nwaiting      3/100 jobs in its line, the oldest for \S+\n`, detail)
	cooling := c.mustRun(t, "stats", "cooling")
	require.Regexp(t, `\npolicy\s+none \(no policy of its own and no default \*\): not limited\n`, cooling)
	require.Regexp(t, `cooldown\s+\S+ left \(until `, cooling)
	require.Contains(t, cooling, "waiting   0 jobs in its line\n")

	// one of a thing is said in the singular
	c.mustRun(t, "policy", "set", "single", "rate=1/h")
	l := c.limiter(t)
	d, err := l.Admit(context.Background(), "single", "job-1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	_, _, err = waitroom.Of(l).Join(context.Background(), "single", 0, waitroom.Waiter{ID: "job-2"})
	require.NoError(t, err)
	one := c.mustRun(t, "stats", "single")
	require.Contains(t, one, "started   1 job (counted while the tenant's state is alive)\n")
	require.Regexp(t, `\nwaiting   1 job in its line, the oldest for \S+\n`, one)
	c.mustRun(t, "policy", "set", "pair", "window=2/min")
	d, err = l.Admit(context.Background(), "pair", "job-1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Contains(t, c.mustRun(t, "admit", "--dry-run", "pair"), "remaining   1 more job of cost 1 right now\n")
}

func testAdmitDryRun(t *testing.T, c *cli) {
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "slow", "rate=1/h concurrency=2")
	// stateKeys is every key of the tenant with its serialised value.
	stateKeys := func() map[string]string {
		keys, err := c.client.Keys(ctx, c.prefix+":{t:slow}:*").Result()
		require.NoError(t, err)
		out := map[string]string{}
		for _, k := range keys {
			v, err := c.client.Dump(ctx, k).Result()
			require.NoError(t, err)
			out[k] = v
		}
		return out
	}
	out := c.mustRun(t, "admit", "slow", "--dry-run")
	require.True(t, strings.HasPrefix(out, "a job of slow would be admitted now\n"), out)
	require.Contains(t, out, "  policy      slow: rate=1/h concurrency=2\n")
	require.Empty(t, stateKeys(), "a dry run writes nothing")

	d, err := c.limiter(t).Admit(ctx, "slow", "job-1")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	before := stateKeys()

	// Denied: exit 3, so a script can tell "no" from an error (1).
	r := c.run(t, "admit", "slow", "--dry-run")
	require.Equal(t, 3, r.code, r.stderr)
	require.Empty(t, r.stderr)
	out = r.stdout
	require.True(t, strings.HasPrefix(out, "a job of slow would NOT be admitted now\n  denied by    rate[0] of policy slow (1/h)\n  retry after  "), out)
	require.Contains(t, out, "  in flight    1 of 2\n")
	r = c.run(t, "admit", "--json", "slow", "--dry-run")
	require.Equal(t, 3, r.code, r.stderr)
	js := r.stdout
	require.Contains(t, js, `"allowed": false`)
	require.Contains(t, js, "\"denied_by\": {\n    \"policy\": \"slow\",\n    \"rule\": \"rate[0]\",\n    \"text\": \"rate[0] of policy slow (1/h)\"\n  }")
	require.Equal(t, before, stateKeys())

	r = c.run(t, "admit", "slow", "--dry-run", "--cost", "5")
	require.Equal(t, result{code: 1, stderr: "sluice: tenant \"slow\": a job of cost 5 can never start: slow rate[0] (1/h) admits at most 1 at once, and a job's cost must fit its burst; give that rate burst=5 or more (rate=1/h burst=5), or split the job into jobs of cost 1 or less\n"}, r)
}

func testTopOnce(t *testing.T, c *cli) {
	seedState(t, c)
	out := c.mustRun(t, "top", "--interval", "100ms")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 5, out)
	require.Regexp(t, `^TENANT\s+STARTS/S\s+LIMIT\s+IN FLIGHT\s+RESERVED\s+COOLDOWN\s+WAITING\s+POLICY$`, lines[0])
	// Nothing starts during the measurement; the busiest by in-flight jobs come first.
	require.Regexp(t, `^acme\s+0\.0\s+1/h\s+2/3\s+0\s+-\s+3/100\s+acme$`, lines[1])
	out = c.mustRun(t, "top", "--once", "--interval", "100ms", "--limit", "1")
	require.Equal(t, 3, strings.Count(out, "\n"), out)
	require.True(t, strings.HasSuffix(out, "... and 3 more tenants\n"), out)

	out = c.mustRun(t, "top", "--once", "--json", "--interval", "100ms", "--limit", "2")
	require.Equal(t, 1, strings.Count(out, "\n"), "one JSON line: %s", out)
	require.Regexp(t, `^\{"time":"[^"]+","interval_ms":100,"stale":false,"tenants":\[`+
		`\{"tenant":"acme","starts_per_s":0,"limit":"1/h","in_flight":2,"concurrency":3,"reserved":0,"cooldown_ms":0,"waiting":3,"backlog_cap":100,"policy":"acme"\},`+
		`\{"tenant":"cooling","starts_per_s":0,"limit":"","in_flight":0,"concurrency":-1,"reserved":0,"cooldown_ms":\d+(\.\d+)?,"waiting":0,"backlog_cap":0,"policy":""\}\]\}\n$`, out)
}

// testCluster runs the commands through the Cluster form of --redis against
// a one-node Redis Cluster.
func testCluster(t *testing.T, c *cli) {
	srv := redistest.NewServer(t, &redistest.Options{Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}})
	ctx := context.Background()
	node := srv.Client(t)
	require.NoError(t, node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
	waitFor(t, "cluster_state:ok", func() bool {
		info, err := node.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	env := map[string]string{"SLUICE_REDIS_URL": "redis+cluster://" + srv.Addr()}
	sluice := func(args ...string) string {
		r := c.runWith(t, nil, env, args...)
		require.Equal(t, 0, r.code, "sluice %v: %s", args, r.stderr)
		return r.stdout
	}
	sluice("policy", "set", "acme", "concurrency=2")
	sluice("policy", "set", "@global", "rate=10/s")
	require.Equal(t, "NAME     POLICY\n@global  rate=10/s\nacme     concurrency=2\n", sluice("policy", "list"))
	require.True(t, strings.HasPrefix(sluice("admit", "acme", "--dry-run"), "a job of acme would be admitted now\n"))
	out := sluice("stats", "--json")
	require.Contains(t, out, `"tenant": "@global"`)
	require.Contains(t, out, `"tenant": "acme"`)

	// The dashboard and asynqmon under it work on a Cluster too.
	d := startDashboard(t, c, env, "--interval", "100ms")
	d.tenants(t, "@global", "acme")
	resp, err := http.Get(d.base + "asynq/api/queues")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// testInvalidNames: policies whose names sluice refuses today (stored by an
// older version) are shown escaped, kept out of stats and top, and removed
// with policy delete --invalid, since a NUL cannot be typed at all.
func testInvalidNames(t *testing.T, c *cli) {
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	for _, name := range []string{"a\x00b", "two\nlines", "tab\tbed"} {
		require.NoError(t, c.client.HSet(ctx, c.prefix+":{p}:policies", name, `{"policy":"rate=1/s","updated":"2026-01-01T00:00:00Z"}`).Err())
	}
	r := c.run(t, "policy", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, `NAME          POLICY
"a\x00b"      rate=1/s  (INVALID NAME)
acme          rate=10/s
"tab\tbed"    rate=1/s  (INVALID NAME)
"two\nlines"  rate=1/s  (INVALID NAME)
`, r.stdout)
	require.Equal(t, "3 policies have a name that is not a valid tenant (shown quoted, with escapes); no job can use them; remove them with: sluice policy delete --invalid\n", r.stderr)
	require.Contains(t, c.mustRun(t, "policy", "list", "--json"), `"name": "two\nlines",
    "policy": "rate=1/s",
    "name_error": "invalid tenant: tenant \"two\\nlines\" has a control character (U+000A) at byte 3;`)

	out := c.mustRun(t, "stats")
	require.Equal(t, 2, strings.Count(out, "\n"), "the header and acme only:\n%s", out)
	require.Contains(t, out, "\nacme ")
	out = c.mustRun(t, "top", "--once", "--interval", "10ms")
	require.Equal(t, 2, strings.Count(out, "\n"), out)

	out = c.mustRun(t, "policy", "delete", "--invalid")
	require.Equal(t, 3, strings.Count(out, "\n"), out)
	require.Contains(t, out, `deleted policy "a\x00b" (invalid tenant: tenant "a\x00b" has a control character (U+0000) at byte 1;`)
	require.Equal(t, map[string]string{"acme": ""}, keysOnly(c.policies(t)))
	require.Equal(t, "no policy has an invalid name; nothing deleted\n", c.mustRun(t, "policy", "delete", "--invalid"))
}

// testRangeEdge: the largest burst the engine computes exactly is accepted
// and a brand-new tenant's job would start at once.
func testRangeEdge(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "edge", "rate=1/s burst=4503599627")
	out := c.mustRun(t, "admit", "edge", "--dry-run")
	require.True(t, strings.HasPrefix(out, "a job of edge would be admitted now\n"), out)
	require.Contains(t, out, "remaining   4503599627 more jobs of cost 1 right now\n")
}

// testAsynqURLForms: the binary reaches a Redis through a unix socket,
// written as go-redis (unix://) or asynq (redis-socket://) writes it.
func testAsynqURLForms(t *testing.T, c *cli) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	redistest.NewServer(t, &redistest.Options{Args: []string{"--unixsocket", sock, "--unixsocketperm", "700"}})
	r := c.runWith(t, nil, nil, "--redis", "unix://"+sock, "policy", "set", "acme", "rate=5/s")
	require.Equal(t, result{stdout: "set policy acme: rate=5/s\n"}, r)
	r = c.runWith(t, nil, map[string]string{"SLUICE_REDIS_URL": "redis-socket://" + sock}, "policy", "get", "acme")
	require.Equal(t, result{stdout: "rate=5/s\n"}, r)
}

// testJobs: sluice jobs lists the jobs of every queue by state, with their
// tenant, retries and last error (a handler's error, an unknown type),
// filters them by tenant and state, and runs or deletes one by id. It has
// a Redis of its own: asynq's queues are not prefixed.
func testJobs(t *testing.T, c *cli) {
	srv := redistest.NewServer(t, nil)
	c = &cli{bin: c.bin, url: srv.URL(), prefix: c.prefix, client: srv.Client(t)}
	ctx := context.Background()
	qc, err := queue.New(c.client, &queue.Config{Prefix: c.prefix})
	require.NoError(t, err)
	defer qc.Close()
	enqueue := func(tenant, typ, id string, opts ...asynq.Option) {
		t.Helper()
		_, err := qc.Enqueue(ctx, tenant, asynq.NewTask(typ, []byte(`{"n":1}`)), append(opts, asynq.TaskID(id))...)
		require.NoError(t, err)
	}
	release := make(chan struct{})
	w, err := worker.New(c.client, &worker.Config{
		Prefix: c.prefix,
		Asynq: asynq.Config{
			Queues: map[string]int{"work": 1}, LogLevel: asynq.FatalLevel,
			RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
		},
		Gate: worker.GateConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
	})
	require.NoError(t, err)
	w.HandleFunc("block", func(context.Context, *asynq.Task) error { <-release; return nil })
	w.HandleFunc("fail", func(context.Context, *asynq.Task) error { return errors.New("downstream said 500:\ninternal error") })
	w.HandleFunc("sleep", func(context.Context, *asynq.Task) error { return nil })
	require.NoError(t, w.Start())
	defer w.Shutdown()
	defer close(release)

	enqueue("acme", "block", "j-active", asynq.Queue("work"))
	enqueue("acme", "fail", "j-retry", asynq.Queue("work"), asynq.MaxRetry(3))
	enqueue("globex", "slep", "j-archived", asynq.Queue("work"))
	enqueue("acme", "sleep", "j-scheduled", asynq.Queue("work"), asynq.ProcessIn(time.Hour))
	enqueue("acme", "sleep", "dup", asynq.Queue("work"), asynq.ProcessIn(2*time.Hour))
	enqueue("globex", "sleep", "dup", asynq.Queue("idle"))
	enqueue("acme", "sleep", "j-pending", asynq.Queue("idle"))
	in := asynq.NewInspectorFromRedisClient(c.client)
	waitFor(t, "a job in each state", func() bool {
		info, err := in.GetQueueInfo("work")
		return err == nil && info.Active == 1 && info.Retry == 1 && info.Archived == 1
	})

	out := c.mustRun(t, "jobs")
	rows := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, rows, 8, out)
	require.Regexp(t, `^ID\s+TENANT\s+TYPE\s+QUEUE\s+STATE\s+RETRIED\s+NEXT RUN\s+LAST ERROR$`, rows[0])
	require.Regexp(t, `^j-active\s+acme\s+block\s+work\s+active\s+0/25\s+running\s+-$`, rows[1])
	// no worker serves queue idle: its jobs wait in their tenants' lines
	require.Regexp(t, `^(dup\s+globex|j-pending\s+acme)\s+sleep\s+idle\s+waiting\s+0/25\s+its turn\s+-$`, rows[2])
	require.Regexp(t, `^j-scheduled\s+acme\s+sleep\s+work\s+scheduled\s+0/25\s+in (59m\d\ds|1h0m0s)\s+-$`, rows[4])
	require.Regexp(t, `^dup\s+acme\s+sleep\s+work\s+scheduled\s+0/25\s+in (1h59m\d\ds|2h0m0s)\s+-$`, rows[5])
	require.Regexp(t, `^j-retry\s+acme\s+fail\s+work\s+retry\s+1/3\s+in \S+\s+downstream said 500: internal error$`, rows[6])
	require.Regexp(t, `^j-archived\s+globex\s+slep\s+work\s+archived\s+0/25\s+-\s+no handler for task type "slep" on this worker \(it handles block, fail, sleep\):…$`, rows[7])

	out = c.mustRun(t, "jobs", "globex", "--state", "archived,waiting")
	require.Regexp(t, `\ndup\s+globex\s+sleep\s+idle\s+waiting .*\nj-archived\s+globex\s+slep\s+work\s+archived `, out)
	require.Equal(t, 3, strings.Count(out, "\n"), out)
	r := c.run(t, "jobs", "--queue", "work", "--limit", "2")
	require.Equal(t, 0, r.code)
	require.Equal(t, 3, strings.Count(r.stdout, "\n"), r.stdout)
	require.Equal(t, "only the first 2 are listed: --limit N lists more (0: all); --state or a TENANT narrows them\n", r.stderr)
	r = c.run(t, "jobs", "initech")
	require.Equal(t, result{code: 0, stderr: "no active, pending, waiting, scheduled, retry, archived jobs of tenant initech in queues idle, work\n"}, r)
	// a job's id where a tenant goes: the job, and a word on the mix-up
	r = c.run(t, "jobs", "j-archived", "--state", "pending")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no jobs of tenant j-archived, but j-archived is a job's id: the job is listed (sluice jobs explain j-archived says what holds it)\n", r.stderr)
	require.Regexp(t, `^ID .*\nj-archived\s+globex\s+slep\s+work\s+archived\s+0/25\s+-\s+no handler for task type "slep" `, r.stdout)
	r = c.run(t, "jobs", "dup")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `\ndup\s+globex\s+sleep\s+idle\s+waiting\s+0/25\s+its turn\s+-\ndup\s+acme\s+sleep\s+work\s+scheduled\s`, r.stdout)
	enqueue("acme", "sleep", "import/7", asynq.Queue("work"), asynq.ProcessIn(time.Hour))
	r = c.run(t, "jobs", "import/7")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `\nimport/7\s+acme\s+sleep\s+work\s+scheduled\s`, r.stdout)
	r = c.run(t, "jobs", "export/7")
	require.Equal(t, 2, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "sluice: invalid tenant: tenant \"export/7\" holds \"/\", "), r.stderr)
	require.Contains(t, r.stderr, "; nor is it a job's id in queues idle, work (sluice jobs lists the jobs)\n")
	require.NoError(t, in.DeleteTask("work", "import/7"))
	js := c.mustRun(t, "jobs", "j-scheduled", "--json")
	require.Contains(t, js, `"id": "j-scheduled"`)
	require.Contains(t, js, `"state": "scheduled"`)
	out = c.mustRun(t, "jobs", "--state", "waiting", "--queue", "idle")
	require.Equal(t, 3, strings.Count(out, "\n"), out)
	r = c.run(t, "jobs", "--state", "waiting", "--queue", "work")
	require.Equal(t, result{code: 0, stderr: "no waiting jobs in queue work\n"}, r)

	js = c.mustRun(t, "jobs", "--state", "retry,archived", "--json")
	js = regexp.MustCompile(`"(now|last_failed_at|next_process_at)": "[^"]+"`).ReplaceAllString(js, `"$1": "<time>"`)
	clitest.Golden(t, "jobs_json", js)

	// run and delete, by id; an id in two queues needs --queue
	r = c.run(t, "jobs", "run", "dup")
	require.Equal(t, 2, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "sluice: task dup is in queues idle, work: give the one you mean with --queue\n"), r.stderr)
	require.Equal(t, "task dup (type sleep, tenant acme, queue work) was scheduled; now pending: a worker takes it next (it still passes its tenant's limits)\n", c.mustRun(t, "jobs", "run", "dup", "--queue", "work"))
	require.Equal(t, "task j-pending (type sleep, tenant acme, queue idle) was waiting in its tenant's line; now pending: a worker takes it next (it still passes its tenant's limits)\n", c.mustRun(t, "jobs", "run", "j-pending"))
	require.Equal(t, "task j-pending (type sleep, tenant acme, queue idle) is pending already: a worker takes it next; nothing changed\n", c.mustRun(t, "jobs", "run", "j-pending"))
	r = c.run(t, "jobs", "delete", "j-active")
	require.Equal(t, result{code: 1, stderr: "sluice: task j-active (type block, tenant acme, queue work) is running now and cannot be deleted; nothing changed (run sluice jobs again when it ends)\n"}, r)
	require.Equal(t, "deleted task j-archived (type slep, tenant globex, queue work) (it was archived)\n", c.mustRun(t, "jobs", "delete", "j-archived"))
	r = c.run(t, "jobs", "delete", "j-archived")
	require.Equal(t, result{code: 1, stderr: "sluice: no task j-archived in queues idle, work (a job that finished is gone); sluice jobs lists the jobs\n"}, r)
	r = c.run(t, "jobs", "run", "j-retry", "--queue", "nope")
	require.Equal(t, result{code: 1, stderr: "sluice: no queue \"nope\"; the queues are: idle, work\n"}, r)
}

// testLearned: a limit learned from the downstream shows in stats (the
// detail, the table, JSON) and top, beside the policy as stored.
func testLearned(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=100/s burst=5")
	lim := c.limiter(t)
	out, err := lim.Learn(context.Background(), "acme", throttle.LearnedLimit{Limit: 40, Window: time.Second,
		Source: "RateLimit-Policy", From: "200 from GET api.example.com/v1/send, task t-1"})
	require.NoError(t, err)
	require.Equal(t, throttle.LearnStored, out)

	detail := c.mustRun(t, "stats", "acme")
	require.Regexp(t, `(?m)^policy\s+acme: `, detail)
	require.Contains(t, detail, "100/s burst 5", "the policy as stored")
	require.Regexp(t, `(?m)^rate\[1\] \(learned\)\s+`, detail)
	require.Regexp(t, `(?m)^learned\s+40 per 1s \(40/s\) from the downstream, for (1m0s|5\d(\.\d+)?s) more \(until \S+\); declared in RateLimit-Policy of 200 from GET api.example.com/v1/send, task t-1; applied as rate\[1\]$`, detail)
	require.Contains(t, c.mustRun(t, "stats"), "(learned)")
	js := c.mustRun(t, "stats", "--json", "acme")
	require.Regexp(t, `"learned": \{\s*"limit": 40,\s*"window_ms": 1000,\s*"rate": "40/s",\s*"rule": "rate\[1\]",\s*"source": "RateLimit-Policy",\s*"from": "200 from GET api.example.com/v1/send, task t-1",\s*"learned": "[^"]+",\s*"until": "[^"]+"\s*\}`, js)
	top := c.mustRun(t, "top", "--once", "--interval", "100ms")
	require.Regexp(t, `(?m)^acme\s+\S+\s+40/s learned\s+`, top)
	// one admitted and 40 more reserved behind it, a second of the
	// learned rule's slots: the CLI's decision, however late it comes on
	// a busy machine, is held by the learned rule
	_, err = lim.Admit(context.Background(), "acme", "a-1")
	require.NoError(t, err)
	for i := 2; i <= 41; i++ {
		_, err = lim.Do(context.Background(), throttle.Request{Tenant: "acme", ID: "a-" + strconv.Itoa(i), Reserve: true})
		require.NoError(t, err)
	}
	r := c.run(t, "admit", "acme", "--dry-run")
	require.Equal(t, 3, r.code, r.stderr)
	require.Regexp(t, `denied by\s+rate\[1\] of policy acme \(40/s\) \(learned from the downstream\)`, r.stdout)
	require.Regexp(t, `(?m)^  learned\s+40 per 1s \(40/s\) until `, r.stdout)
	top = c.mustRun(t, "top", "--once", "--json", "--interval", "100ms")
	require.Contains(t, top, `"limit":"40/s"`)
	require.Contains(t, top, `"learned":"40 per 1s (40/s) until `)

	// pinned: recorded, not applied
	c.mustRun(t, "policy", "set", "acme", "rate=100/s burst=5 learn=false")
	detail = c.mustRun(t, "stats", "acme")
	require.Contains(t, detail, "not applied: pinned: the policy says learn=false")
	require.NotContains(t, detail, "rate[1]")
}

// testAdaptive: an adaptive rule shows in stats (the detail with its last
// changes, the table, JSON) and top, beside the policy as stored; a bad
// adapt= is refused with what to write instead, and changes nothing.
func testAdaptive(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=50/s adapt=10..200/s")
	r := c.run(t, "policy", "set", "acme", "rate=50/s adapt=200..10/s")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "adapt=200..10/s: the floor 200 is above the ceiling 10; write the lower first: adapt=10..200/s")
	require.Contains(t, c.mustRun(t, "policy", "get", "acme"), "rate=50/s adapt=10..200/s", "unchanged")

	lim := c.limiter(t)
	ch, err := lim.Adapt(context.Background(), "acme", throttle.AdaptReport{OK: 10, Throttled: 2})
	require.NoError(t, err)
	require.Equal(t, "throttled", ch.Reason)

	detail := c.mustRun(t, "stats", "acme")
	require.Contains(t, detail, "rate=50/s adapt=10..200/s", "the policy as stored")
	require.Regexp(t, `(?m)^rate\[0\] \(adaptive\)\s+37/s: `, detail)
	require.Regexp(t, `(?m)^adaptive\s+37/s now, between 10/s and 200/s \(\+4 every 1s while answers are good, ×0.75 on 429/503\); 0 increases, 1 decrease; lapses (10m0s|9m5\d(\.\d+)?s) after the last report$`, detail)
	require.Regexp(t, `(?m)^\s+\S+ ago: 50 → 37, the downstream answered 429/503$`, detail)
	require.Contains(t, c.mustRun(t, "stats"), "(adaptive 10..200)")
	js := c.mustRun(t, "stats", "--json", "acme")
	require.Regexp(t, `"adaptive": \{\s*"rule": "rate\[0\]",\s*"rate": "37/s",\s*"limit": 37,\s*"floor": 10,\s*"ceiling": 200,`, js)
	require.Regexp(t, `"history": \[\s*\{\s*"at": "[^"]+",\s*"from": 50,\s*"to": 37,\s*"reason": "throttled"\s*\}\s*\]`, js)
	top := c.mustRun(t, "top", "--once", "--interval", "100ms")
	require.Regexp(t, `(?m)^acme\s+\S+\s+37/s adaptive\s+`, top)
	top = c.mustRun(t, "top", "--once", "--json", "--interval", "100ms")
	require.Contains(t, top, `"adaptive":"37/s, 10..200, 0 up 1 down"`)
}

// testJobsExplain: jobs waiting in a rate=1/min line (no worker serves
// their queue) say what holds them and when they are expected to start.
func testJobsExplain(t *testing.T, c *cli) {
	srv := redistest.NewServer(t, nil)
	c = &cli{bin: c.bin, url: srv.URL(), prefix: c.prefix, client: srv.Client(t)}
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "acme", "rate=1/min")
	qc, err := queue.New(c.client, &queue.Config{Prefix: c.prefix})
	require.NoError(t, err)
	defer qc.Close()
	for _, id := range []string{"x-1", "x-2", "x-3"} {
		_, err := qc.Enqueue(ctx, "acme", asynq.NewTask("sleep", nil), asynq.Queue("slow"), asynq.TaskID(id))
		require.NoError(t, err)
	}
	out := c.mustRun(t, "jobs", "explain", "x-3")
	require.Regexp(t, `^job x-3 \(type sleep, tenant acme, queue slow\): waiting in its tenant's line, 2 ahead of it, for \S+; expected to start in (2m0s|1m5\d(\.\d+)?s) \(\S+\), held by rate\[0\]\n`, out)
	require.Regexp(t, `\n  rate\[0\]\s+in (2m0s|1m5\d(\.\d+)?s)\s+1/min: 2 units of cost ahead of it and its own, one every 1m0s\n`, out)
	// the head: no rule holds it, no worker serves its queue
	js := c.mustRun(t, "jobs", "explain", "--json", "x-1")
	require.Contains(t, js, `"state": "waiting"`)
	require.Contains(t, js, `"ahead": 0`)
	require.Contains(t, js, `"held_by": "turn"`)
	require.Contains(t, c.mustRun(t, "jobs", "explain", "x-1"), "every rule lets it start now: it waits for its turn")
	js = c.mustRun(t, "jobs", "explain", "--json", "x-2")
	require.Contains(t, js, `"held_by": "rate[0]"`)
	require.Regexp(t, `"expected_in_ms": (60000|5\d\d\d\d(\.\d+)?),`, js)

	list := c.mustRun(t, "jobs", "acme", "--state", "waiting")
	require.Regexp(t, `(?m)^x-3\s+acme\s+sleep\s+slow\s+waiting\s+0/25\s+in (2m0s|1m5\d(\.\d+)?s) \(rate\[0\]\)\s+-$`, list)
	require.Contains(t, c.mustRun(t, "jobs", "acme", "--state", "waiting", "--json"), `"held_by": "rate[0]"`)

	r := c.run(t, "jobs", "explain", "nope")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no task nope")
}

// testJobsPrioritize: a waiting job moved to another priority in its
// tenant's line; the list and explain show the line's level (not the
// header's), another tenant's line is untouched, and a job that does not
// wait, a bad level or a missing one change nothing.
func testJobsPrioritize(t *testing.T, c *cli) {
	srv := redistest.NewServer(t, nil)
	c = &cli{bin: c.bin, url: srv.URL(), prefix: c.prefix, client: srv.Client(t)}
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "acme", "rate=1/min")
	qc, err := queue.New(c.client, &queue.Config{Prefix: c.prefix})
	require.NoError(t, err)
	defer qc.Close()
	enqueue := func(tenant, id string, opts ...asynq.Option) {
		t.Helper()
		_, err := qc.Enqueue(ctx, tenant, asynq.NewTask("sleep", nil), append(opts, asynq.Queue("slow"), asynq.TaskID(id))...)
		require.NoError(t, err)
	}
	enqueue("acme", "p-1")
	enqueue("acme", "p-2")
	enqueue("acme", "p-3")
	enqueue("acme", "p-4", queue.Priority(queue.Low))
	enqueue("globex", "g-1")
	enqueue("acme", "later", asynq.ProcessIn(time.Hour))
	lim := c.limiter(t)
	order := func(tenant string) []string {
		t.Helper()
		xs, err := lim.ExplainLine(ctx, tenant, "slow", 0)
		require.NoError(t, err)
		var out []string
		for _, x := range xs {
			out = append(out, x.ID)
		}
		return out
	}
	require.Equal(t, []string{"p-1", "p-2", "p-3", "p-4"}, order("acme"))

	// bad usage: exit 2, nothing moved
	r := c.run(t, "jobs", "prioritize", "p-3")
	require.Equal(t, 2, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "sluice: jobs prioritize: missing --priority: high, normal or low\nusage: sluice jobs prioritize ID --priority high|normal|low [--queue Q] [--json]\n"), r.stderr)
	r = c.run(t, "jobs", "prioritize", "p-3", "--priority", "urgent")
	require.Equal(t, 2, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "sluice: --priority \"urgent\": must be high, normal or low\n"), r.stderr)
	r = c.run(t, "jobs", "prioritize", "--priority", "high")
	require.Equal(t, 2, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "sluice: jobs prioritize: missing ID\n"), r.stderr)
	require.Equal(t, []string{"p-1", "p-2", "p-3", "p-4"}, order("acme"))

	require.Equal(t, "job p-3 of tenant acme moved to high priority: 0 jobs ahead of it now (it was at normal priority)\n",
		c.mustRun(t, "jobs", "prioritize", "p-3", "--priority", "high"))
	require.Equal(t, "job p-3 of tenant acme is at high priority already: 0 jobs ahead of it; nothing changed\n",
		c.mustRun(t, "jobs", "prioritize", "p-3", "--priority", "HIGH"))
	require.Equal(t, []string{"p-3", "p-1", "p-2", "p-4"}, order("acme"))
	require.Equal(t, []string{"g-1"}, order("globex"), "another tenant's line is untouched")

	js := c.mustRun(t, "jobs", "prioritize", "p-4", "--priority", "high", "--json", "--queue", "slow")
	require.Contains(t, js, `"id": "p-4"`)
	require.Contains(t, js, `"state": "waiting"`)
	require.Contains(t, js, `"ahead": 1,`)
	require.Contains(t, js, `"priority": "high",`)
	require.Contains(t, js, `"previous_priority": "low"`)
	require.Equal(t, []string{"p-3", "p-4", "p-1", "p-2"}, order("acme"))
	require.Equal(t, "job p-1 of tenant acme moved to low priority: 3 jobs ahead of it now (it was at normal priority)\n",
		c.mustRun(t, "jobs", "prioritize", "p-1", "--priority", "low"))

	// explain and the list show the line's level; the header keeps the
	// level the job was enqueued with
	out := c.mustRun(t, "jobs", "explain", "p-4")
	require.Regexp(t, `^job p-4 \(type sleep, tenant acme, queue slow\): waiting in its tenant's line at high priority, 1 ahead of it, for \S+; `, out)
	out = c.mustRun(t, "jobs", "explain", "p-2")
	require.Regexp(t, `^job p-2 \(type sleep, tenant acme, queue slow\): waiting in its tenant's line, 2 ahead of it, `, out)
	require.Contains(t, c.mustRun(t, "jobs", "explain", "--json", "p-2"), `"priority": "normal",`)
	require.NotContains(t, c.mustRun(t, "jobs", "explain", "--json", "later"), `"priority"`)
	info, err := asynq.NewInspectorFromRedisClient(c.client).GetTaskInfo("slow", "p-4")
	require.NoError(t, err)
	require.Equal(t, "low", info.Headers["sluice-priority"])

	list := c.mustRun(t, "jobs", "acme", "--state", "waiting")
	rows := strings.Split(strings.TrimSuffix(list, "\n"), "\n")
	require.Len(t, rows, 5, list)
	for _, want := range []string{`p-1\s+acme\s+sleep\s+slow\s+waiting \(low\)\s`, `p-2\s+acme\s+sleep\s+slow\s+waiting\s+0/25`, `p-3\s+acme\s+sleep\s+slow\s+waiting \(high\)\s`, `p-4\s+acme\s+sleep\s+slow\s+waiting \(high\)\s`} {
		require.Regexp(t, `(?m)^`+want, list)
	}
	js = c.mustRun(t, "jobs", "acme", "--json")
	require.Regexp(t, `"id": "p-1",[^}]*"priority": "low"`, js)
	require.Regexp(t, `"id": "p-2",[^}]*"priority": "normal"`, js)
	require.Regexp(t, `"id": "later",[^}]*"payload": ""\s*}`, js, "a job not waiting has no priority")

	// a job that does not wait in a line: exit 1, nothing changed
	r = c.run(t, "jobs", "prioritize", "later", "--priority", "high")
	require.Equal(t, result{code: 1, stderr: "sluice: task later (type sleep, tenant acme, queue slow) is scheduled, not waiting in its tenant's line: only a waiting job has a place in a line to move; nothing changed\n"}, r)
	r = c.run(t, "jobs", "prioritize", "nope", "--priority", "high")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no task nope")
	require.Equal(t, []string{"p-3", "p-4", "p-2", "p-1"}, order("acme"))
}

// testPools: a shared pool's policy is set, read and listed by its @name;
// its state shows in sluice stats, alone and in the table, once jobs drew
// from it; a bad pool name is refused and changes nothing.
func testPools(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "@api", "rate=2/s concurrency=3")
	require.Contains(t, c.mustRun(t, "policy", "get", "@api"), "rate=2/s concurrency=3")
	require.Regexp(t, `(?m)^@api\s+rate=2/s concurrency=3`, c.mustRun(t, "policy", "list"))
	lim := c.limiter(t)
	d, err := lim.Do(context.Background(), throttle.Request{Tenant: "acme", ID: "j-1", Pools: []string{"@api"}})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	detail := c.mustRun(t, "stats", "@api")
	require.Regexp(t, `(?m)^policy\s+@api: rate=2/s concurrency=3`, detail)
	require.Contains(t, detail, "concurrency  1 of 3 in flight\n")
	require.Regexp(t, `(?m)^@api\s+@api\s+1\s+`, c.mustRun(t, "stats"))
	before := c.policies(t)
	r := c.run(t, "policy", "set", "@Bad Pool", "rate=1/s")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, `policy name "@Bad Pool"`)
	r = c.run(t, "stats", "@Bad")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, `pool "@Bad": 'B' at byte 1 is not allowed; use lowercase letters, digits, '.', '_' and '-'`)
	require.Equal(t, before, c.policies(t))
}

// testKeys: policies of keys below a tenant (acme/*, acme/vip, */*) are
// set, listed and read; a key's state shows in stats (its own row and
// detail, under the policy that applies to it) and in top; a bad key name
// gets a clear error and changes nothing.
func testKeys(t *testing.T, c *cli) {
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "acme", "rate=100/s burst=20")
	c.mustRun(t, "policy", "set", "acme/*", "rate=2/s concurrency=3")
	c.mustRun(t, "policy", "set", "acme/vip", "rate=10/s")
	c.mustRun(t, "policy", "set", "*/*", "rate=1/s")
	require.Contains(t, c.mustRun(t, "policy", "get", "acme/*"), "rate=2/s concurrency=3")
	list := c.mustRun(t, "policy", "list")
	require.Regexp(t, `(?m)^acme/\*\s+rate=2/s concurrency=3`, list)
	require.Regexp(t, `(?m)^acme/vip\s+rate=10/s`, list)
	require.Regexp(t, `(?m)^\*/\*\s+rate=1/s`, list)
	lim := c.limiter(t)
	for _, k := range []string{"user-42", "vip"} {
		d, err := lim.Do(ctx, throttle.Request{Tenant: "acme", Key: k, ID: "j-" + k})
		require.NoError(t, err)
		require.True(t, d.Allowed, k)
	}
	detail := c.mustRun(t, "stats", "acme/user-42")
	require.Regexp(t, `(?m)^policy\s+acme/\*: rate=2/s concurrency=3`, detail)
	require.Contains(t, detail, "concurrency  1 of 3 in flight\n")
	require.Regexp(t, `(?m)^policy\s+acme/vip: rate=10/s`, c.mustRun(t, "stats", "acme/vip"))
	table := c.mustRun(t, "stats")
	require.Regexp(t, `(?m)^acme/user-42\s+acme/\*\s+1\s+`, table)
	require.Regexp(t, `(?m)^acme/vip\s+acme/vip\s+1\s+`, table)
	require.Regexp(t, `(?m)^acme/user-42\s+`, c.mustRun(t, "top", "--once", "--interval", "100ms"))

	before := c.policies(t)
	for _, bad := range []struct{ name, want string }{
		{"acme/", "the key is empty"},
		{"*/u1", "so it takes */*"},
	} {
		r := c.run(t, "policy", "set", bad.name, "rate=1/s")
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, bad.want)
	}
	r := c.run(t, "stats", "acme/*")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "a key's state is read as TENANT/KEY")
	require.Equal(t, before, c.policies(t))
}

// testTopSettled: the cost settled after jobs ran shows in top, refunded
// and charged extra, on the tenant's row and on its pool's, and in
// top --json; a tenant that settled nothing has a blank cell.
func testTopSettled(t *testing.T, c *cli) {
	ctx := context.Background()
	c.mustRun(t, "policy", "set", "acme", "rate=100/s burst=20")
	c.mustRun(t, "policy", "set", "@llm", "rate=1000/min burst=100")
	c.mustRun(t, "policy", "set", "quiet", "rate=5/s")
	lim := c.limiter(t)
	for _, j := range []struct {
		id          string
		est, actual int64
	}{{"cheap", 10, 3}, {"dear", 2, 6}} {
		req := throttle.Request{Tenant: "acme", ID: j.id, Cost: j.est, Pools: []string{"@llm"}}
		d, err := lim.Do(ctx, req)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%s: %s", j.id, d)
		require.NoError(t, lim.Settle(ctx, req, d, j.actual))
	}
	d, err := lim.Admit(ctx, "quiet", "plain")
	require.NoError(t, err)
	require.True(t, d.Allowed)

	out := c.mustRun(t, "top", "--once", "--interval", "100ms")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^TENANT\s+STARTS/S\s+LIMIT\s+IN FLIGHT\s+RESERVED\s+COOLDOWN\s+WAITING\s+POLICY\s+SETTLED$`, lines[0])
	require.Regexp(t, `^@llm\s+0\.0\s+1000/min\s+-\s+0\s+-\s+0\s+@llm\s+-7/\+4$`, lines[1], "the pool was settled with the job")
	require.Regexp(t, `^acme\s+0\.0\s+100/s\s+-\s+0\s+-\s+0\s+acme\s+-7/\+4$`, lines[2])
	require.Regexp(t, `^quiet\s+0\.0\s+5/s\s+-\s+0\s+-\s+0\s+quiet$`, lines[3])

	var doc topDoc
	require.NoError(t, json.Unmarshal([]byte(c.mustRun(t, "top", "--once", "--json", "--interval", "100ms")), &doc))
	settled := map[string][2]int64{}
	for _, r := range doc.Tenants {
		settled[r.Tenant] = [2]int64{r.Refunded, r.Extra}
	}
	require.Equal(t, map[string][2]int64{"@llm": {7, 4}, "acme": {7, 4}, "quiet": {0, 0}}, settled)
}
