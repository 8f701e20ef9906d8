package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "write the screenshots to ../docs/img")

func TestMain(m *testing.M) { redistest.Main(m) }

// The page is 1400 CSS pixels wide, as a laptop's browser window.
const (
	pageWidth    = 1400
	tenantsPage  = 1000
	tenantPage   = 1040
	pollInterval = 100 * time.Millisecond
)

// TestDashboardInChromium runs the real programs — redis-server, a worker
// with the built-in sleep handler, the dashboard — and Debian's Chromium,
// headless: the tenants page shows the tenants the test configured, their
// figures move while jobs run, a tenant's page plots them, a shared pool
// has a panel of its own, the cost settled after jobs ran shows on the
// pool's line and the tenant's page, a waiting job's page says where it
// stands and links to its task in asynq's pages, and asynq's pages list
// the queue. It saves screenshots of both pages.
func TestDashboardInChromium(t *testing.T) {
	browser := findChromium(t)
	srv := redistest.NewServer(t, nil)
	bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	sluice := func(args ...string) {
		t.Helper()
		code, stdout, stderr := clitest.Run(t, filepath.Join(bin, "sluice"), nil, nil, append([]string{"--redis", srv.URL()}, args...)...)
		require.Equal(t, 0, code, "sluice %v: %s%s", args, stdout, stderr)
	}
	sluice("policy", "set", "acme", "rate=20/s burst=5 concurrency=8")
	sluice("policy", "set", "globex", "rate=4/s burst=2 backlog=500")
	sluice("policy", "set", "initech", "concurrency=2")
	sluice("policy", "set", "umbrella", "quota=10000/day tz=UTC")
	sluice("policy", "set", "hooli", "rate=5/s adapt=2..50/s adapt_step=2 adapt_every=250ms")
	sluice("policy", "set", "@global", "concurrency=50")
	// a limit tried on acme's live traffic: half its rate, not enforced
	sluice("policy", "set", "acme", "rate=10/s burst=2", "--shadow")
	// a shared pool soylent's jobs draw from; its window and tokens' keep
	// their state (and the settled counts) for the hour
	sluice("policy", "set", "@openai", "rate=10/s burst=5 window=100000/h")
	sluice("policy", "set", "soylent", "rate=50/s")
	sluice("policy", "set", "tokens", "window=100000/h")
	settle(ctx, t, srv.Client(t), "tokens", []string{"@openai"}, [][2]int64{{5, 1}, {1, 3}})

	admin := startWorker(ctx, t, bin, srv.URL())
	base := startDashboard(ctx, t, bin, srv.URL(), "--metrics", admin+"/metrics")

	bctx := newBrowser(ctx, t, browser)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.EmulateViewport(pageWidth, tenantsPage),
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-tenant="acme"]`)),
	))
	for _, tenant := range []string{"@global", "globex", "initech", "umbrella"} {
		require.NoError(t, chromedp.Do(bctx, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr[data-tenant=%q]`, tenant)))))
	}
	// the pool in its panel, not among the tenants, with what tokens' jobs
	// settled on it: 4 of a cost of 5 refunded, 2 charged over a cost of 1
	require.NoError(t, chromedp.Do(bctx, chromedp.WaitVisible(chromedp.CSS(`#pools tr[data-pool="@openai"]`))))
	require.Equal(t, "-4 / +2", text(t, bctx, `#pools tr[data-pool="@openai"] td[data-field="settled"]`))
	require.Contains(t, text(t, bctx, `#pools tr[data-pool="@openai"]`), "rate=10/s burst=5 window=100000/h")
	require.Empty(t, text(t, bctx, `#tenants tr[data-tenant="@openai"]`), "a pool is not in the tenants table")
	require.NotEmpty(t, text(t, bctx, `#tenants tr[data-tenant="@global"]`), "@global is")
	require.Equal(t, 0.0, cell(t, bctx, "acme", "starts"), "nothing has run yet")
	require.Equal(t, 0.0, cell(t, bctx, "acme", "in_flight"))
	require.Contains(t, text(t, bctx, `[data-card="cooldown"]`), "tenants paused by a 429/503 in the last", "the count says the span it covers")

	enqueue(ctx, t, srv.Client(t), map[string]job{
		"acme":     {count: 800, ms: 300},
		"globex":   {count: 200, ms: 100},
		"initech":  {count: 100, ms: 1000},
		"umbrella": {count: 40, ms: 50},
		"hooli":    {count: 400, ms: 20},
		"soylent":  {count: 300, ms: 50, pools: []string{"@openai"}},
	})

	waitPage(t, base+"api/tenants", "acme's starts per second to move", func() bool { return cell(t, bctx, "acme", "starts") > 0 })
	waitPage(t, base+"api/tenants", "acme's jobs in flight", func() bool { return cell(t, bctx, "acme", "in_flight") > 0 })
	waitPage(t, base+"api/tenants", "initech at its concurrency cap", func() bool { return cell(t, bctx, "initech", "in_flight") == 2 })
	// globex's jobs wait for its rate in the waiting room and start on
	// their slots: the gate allows them there, it does not deny and ask
	// again
	waitPage(t, base+"api/tenants", "globex running at its rate", func() bool { return cell(t, bctx, "globex", "starts") > 0 })
	waitPage(t, base+"api/tenants", "soylent's jobs starting through @openai", func() bool {
		return value(t, bctx, `#pools tr[data-pool="@openai"] td[data-field="starts"] [data-value]`) > 0
	})
	// the summary sums the tenants' starts, not @global's (the same
	// starts again) nor the pool's; read in one step, from one redraw
	const startsJS = `(() => {
		let sum = 0;
		for (const v of document.querySelectorAll('#tenants tr:not([data-tenant="@global"]) td[data-field="starts"] [data-value]')) sum += parseFloat(v.getAttribute('data-value'));
		const card = parseFloat(document.querySelector('[data-card="starts"] .value').textContent);
		return Math.abs(card - sum) <= 0.5 ? "" : "card " + card + ", tenants " + sum;
	})()`
	summed, err := chromedp.Run(bctx, chromedp.Evaluate[string](startsJS))
	require.NoError(t, err)
	require.Empty(t, summed)
	waitPage(t, base+"api/tenants", "the fleet's decisions by rule", func() bool {
		return strings.Contains(text(t, bctx, "#decisions"), "allowed")
	})
	// the shadow panel: acme runs at its enforced 20/s, and its shadow of
	// 10/s counts the starts it would have denied
	waitPage(t, base+"api/tenants", "acme's shadow counting denials", func() bool {
		return regexp.MustCompile(`^[1-9][0-9,]* of [0-9,]+ \([0-9.]+%\) since \d\d:\d\d:\d\d$`).MatchString(text(t, bctx, `#shadows tr[data-tenant="acme"] td[data-field="shadow-denied"]`))
	})
	require.Contains(t, text(t, bctx, `#shadows tr[data-tenant="acme"]`), "rate=10/s burst=2")
	require.Empty(t, text(t, bctx, `#shadows tr[data-tenant="globex"]`), "only tenants with a shadow are in the panel")
	// A screenshot worth looking at: a few tens of seconds of sparkline.
	waitPage(t, base+"api/tenants", "half a minute of acme's history", func() bool {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelector('tr[data-tenant="acme"] polyline')?.points.length ?? 0`))
		require.NoError(t, err)
		return n >= 30 && cell(t, bctx, "acme", "in_flight") > 0
	})
	shots := screenshotDir(t)
	screenshot(t, bctx, filepath.Join(shots, "dashboard.png"))

	// The tenant's page plots what the list showed.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.EmulateViewport(pageWidth, tenantPage),
		chromedp.Navigate(base+"tenants/acme"),
		chromedp.WaitVisible(chromedp.CSS(`#chart-starts path[data-series="starts/s"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#chart-decisions path[data-series="allowed"]`)),
	))
	require.Equal(t, "acme", text(t, bctx, "#tenant-name"))
	waitPage(t, base+"api/tenants/acme", "acme's shadow in its state", func() bool {
		return strings.Contains(text(t, bctx, "#detail"), "would have denied") && strings.Contains(text(t, bctx, `[data-card="shadow"]`), "%")
	})
	waitPage(t, base+"api/tenants", "acme's starts plotted", func() bool {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelector('#chart-starts path[data-series="starts/s"]').getAttribute("d").split(/[LMHV]/).length`))
		require.NoError(t, err)
		return n >= 20
	})
	screenshot(t, bctx, filepath.Join(shots, "dashboard-tenant.png"))
	require.True(t, visible(t, bctx, "#chart-inflight"), "acme has a concurrency rule: its jobs in flight against the cap")

	// A tenant without a concurrency rule has no chart of jobs in flight
	// against a cap.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(base+"tenants/globex"),
		chromedp.WaitVisible(chromedp.CSS(`#chart-starts path[data-series="starts/s"]`)),
	))
	require.False(t, visible(t, bctx, "#chart-inflight"), "globex has no concurrency rule")

	// An adaptive tenant's page: its limit rising while its jobs succeed,
	// and the changes.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(base+"tenants/hooli"),
		chromedp.WaitVisible(chromedp.CSS(`[data-card="adaptive"]`)),
	))
	waitPage(t, base+"api/tenants", "hooli's adaptive limit raised", func() bool {
		return strings.Contains(text(t, bctx, "#detail"), "answers were good")
	})
	require.Contains(t, text(t, bctx, `[data-card="adaptive"]`), "2..50")

	// The cost tokens' jobs settled, on its page.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(base+"tenants/tokens"),
		chromedp.WaitVisible(chromedp.CSS(`[data-card="settled"]`)),
	))
	require.Contains(t, text(t, bctx, `[data-card="settled"]`), "-4 / +2")
	waitPage(t, base+"api/tenants/tokens", "tokens' settled costs in its state", func() bool {
		return strings.Contains(text(t, bctx, "#detail"), "4 refunded, 2 charged extra")
	})

	// A tenant's line in priority order on its page: a job of high
	// priority leaves first and is tagged, one of low priority last and
	// tagged; normal shows no tag. No worker serves the queue reports: the
	// jobs stay in the line.
	sluice("policy", "set", "wayne", "rate=1/min")
	qc, err := queue.New(srv.Client(t), nil)
	require.NoError(t, err)
	defer qc.Close()
	for _, j := range []struct {
		id string
		p  taskspec.Priority
	}{{"w-1", queue.Normal}, {"w-2", queue.Normal}, {"w-3", queue.Low}, {"w-4", queue.High}} {
		_, err := qc.Enqueue(ctx, "wayne", asynq.NewTask("sleep", nil), asynq.Queue("reports"), asynq.TaskID(j.id), queue.Priority(j.p))
		require.NoError(t, err)
	}
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(base+"tenants/wayne"),
		chromedp.WaitVisible(chromedp.CSS(`#detail [data-priority="high"]`)),
	))
	const lineJS = `[...document.querySelectorAll('#detail td a')].map((a) => a.textContent + '/' + (a.nextElementSibling?.getAttribute('data-priority') ?? '')).join(' ')`
	var line string
	waitPage(t, base+"api/tenants/wayne", "wayne's line in priority order, tagged", func() bool {
		line, err = chromedp.Run(bctx, chromedp.Evaluate[string](lineJS))
		require.NoError(t, err)
		return line == "w-4/high w-1/ w-2/ w-3/low"
	})
	require.Contains(t, text(t, bctx, `#detail [data-priority="low"]`), "low")

	// A waiting job's page, reached from its tenant's: where it stands in
	// the words of sluice jobs explain, its place in the line, its history,
	// and its task in asynq's pages.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(`#detail a[href="/jobs/w-2?queue=reports"]`),
		chromedp.WaitVisible(chromedp.CSS(`#history tr`)),
	))
	require.Equal(t, "w-2", text(t, bctx, "#job-id"))
	require.Contains(t, text(t, bctx, "#explain"), "job w-2 (type sleep, tenant wayne, queue reports): waiting in its tenant's line, 2 ahead of it")
	require.Contains(t, text(t, bctx, "#explain"), "held by rate[0]")
	require.Contains(t, text(t, bctx, "#line"), "#3: 2 jobs ahead of it")
	require.Contains(t, text(t, bctx, "#history"), "joined tenant wayne's line in queue reports")
	require.Contains(t, text(t, bctx, "#history"), "expected to start (held by rate[0])")
	require.Equal(t, "waiting", text(t, bctx, `[data-card="state"] .value`))
	asynqLink, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("asynq-link").getAttribute("href")`))
	require.NoError(t, err)
	require.Equal(t, "/asynq/queues/reports/tasks/w-2", asynqLink)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(`#asynq-link`)))
	waitPage(t, base+"api/jobs/w-2", "asynqmon's page of task w-2", func() bool {
		return strings.Contains(text(t, bctx, "body"), "w-2")
	})

	// asynq's own pages, under /asynq/, list the queue.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.EmulateViewport(pageWidth, tenantsPage),
		chromedp.Navigate(base+"asynq/"),
	))
	waitPage(t, base+"api/tenants", "asynqmon to list the default queue", func() bool {
		return strings.Contains(text(t, bctx, "body"), "default")
	})

	if *updateScreenshot {
		for _, name := range []string{"dashboard.png", "dashboard-tenant.png"} {
			data, err := os.ReadFile(filepath.Join(shots, name))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join("..", "docs", "img", name), data, 0o644))
		}
	}
	t.Logf("screenshots in %s", shots)
}

// findChromium returns the browser the test drives: $CHROMIUM, else
// chromium on PATH (Debian's package, which `make deps` installs).
func findChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("Chromium is needed by the dashboard's browser test and is not on PATH; install it (Debian/Ubuntu: sudo apt-get install chromium; `make deps` does it as root) or set CHROMIUM to its path")
	return ""
}

// buildBinaries builds sluice and worker from the main module.
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"sluice", "worker"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), "./cmd/"+name)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build ./cmd/%s: %s", name, out)
	}
	return dir
}

// startWorker runs a worker with the built-in handlers, tenant labels on
// its metrics and its admin endpoints on a free port, and returns their
// base URL. SIGTERM stops it when the test ends.
func startWorker(ctx context.Context, t *testing.T, bin, redisURL string) string {
	t.Helper()
	cmd := clitest.Command(ctx, t, filepath.Join(bin, "worker"), nil, nil,
		"--redis", redisURL, "--admin", "127.0.0.1:0", "--tenant-labels", "--concurrency", "100",
		"--shutdown-timeout", "1s", "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	stop(t, cmd)
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		var entry struct {
			Msg   string `json:"msg"`
			Admin string `json:"admin"`
		}
		if json.Unmarshal(lines.Bytes(), &entry) == nil && entry.Msg == "worker started" {
			go func() { _, _ = io.Copy(io.Discard, stderr) }()
			return entry.Admin
		}
	}
	t.Fatalf("the worker ended before it started: %v", lines.Err())
	return ""
}

// startDashboard runs sluice dashboard on a free loopback port and returns
// its base URL, read from the line it prints.
func startDashboard(ctx context.Context, t *testing.T, bin, redisURL string, args ...string) string {
	t.Helper()
	cmd := clitest.Command(ctx, t, filepath.Join(bin, "sluice"), nil, nil,
		append([]string{"--redis", redisURL, "dashboard", "--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr clitest.SyncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	stop(t, cmd)
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "the dashboard did not start: %s", stderr.String())
	fields := strings.Fields(lines.Text())
	require.GreaterOrEqual(t, len(fields), 4, lines.Text())
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return fields[3]
}

// stop sends SIGTERM to cmd when the test ends and waits for it.
func stop(t *testing.T, cmd *exec.Cmd) {
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
}

type job struct {
	count, ms int
	pools     []string // the shared pools the jobs draw from
}

// enqueue puts sleep jobs for each tenant in the default queue.
func enqueue(ctx context.Context, t *testing.T, rdb redis.UniversalClient, jobs map[string]job) {
	t.Helper()
	c, err := queue.New(rdb, nil)
	require.NoError(t, err)
	defer c.Close()
	var batch []queue.Job
	for tenant, j := range jobs {
		for range j.count {
			var opts []asynq.Option
			if len(j.pools) > 0 {
				opts = append(opts, queue.Pools(j.pools...))
			}
			batch = append(batch, queue.Job{Tenant: tenant, Task: asynq.NewTask("sleep", []byte(`{"ms":`+strconv.Itoa(j.ms)+`}`)), Options: opts})
		}
	}
	for _, r := range c.EnqueueBatch(ctx, batch) {
		require.NoError(t, r.Err)
	}
}

// settle admits jobs of tenant drawing from pools, one after the other,
// each on its estimated cost, and settles it to its actual cost
// ({estimate, actual}).
func settle(ctx context.Context, t *testing.T, rdb redis.UniversalClient, tenant string, pools []string, costs [][2]int64) {
	t.Helper()
	l, err := throttle.NewLimiter(rdb, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	for i, c := range costs {
		req := throttle.Request{Tenant: tenant, ID: fmt.Sprintf("settled-%d", i), Cost: c[0], Pools: pools}
		d, err := l.Do(ctx, req)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%s: %s", req.ID, d)
		require.NoError(t, l.Settle(ctx, req, d, c[1]))
	}
}

func newBrowser(ctx context.Context, t *testing.T, path string) context.Context {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(bctx), "start %s", path)
	return bctx
}

// cell is the number a tenant's row shows in a field (starts, in_flight).
func cell(t *testing.T, ctx context.Context, tenant, field string) float64 {
	t.Helper()
	// read in the page, in one step: the dashboard redraws its rows every
	// second, and a node found by one call may be gone by the next
	return value(t, ctx, fmt.Sprintf(`tr[data-tenant=%q] td[data-field=%q] [data-value]`, tenant, field))
}

// value is the number of the element sel finds (its data-value).
func value(t *testing.T, ctx context.Context, sel string) float64 {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q)?.getAttribute('data-value') ?? ''`, sel)))
	require.NoError(t, err)
	require.NotEmpty(t, v, "no %s", sel)
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err)
	return f
}

// visible reports whether the element sel finds is laid out on the page
// (it and its ancestors not hidden).
func visible(t *testing.T, ctx context.Context, sel string) bool {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q)?.offsetParent != null`, sel)))
	require.NoError(t, err)
	return v
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	// in one step, as cell reads: the rows are redrawn every second
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q)?.innerText ?? ''`, sel)))
	require.NoError(t, err)
	return s
}

// waitPage polls cond, which reads the page, until it holds or a minute
// has passed; then it fails with what the dashboard's API says.
func waitPage(t *testing.T, api, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			var doc string
			if resp, err := http.Get(api); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				doc = string(b)
			}
			t.Fatalf("timed out waiting for %s; %s says:\n%s", what, api, doc)
		}
		time.Sleep(pollInterval)
	}
}

func screenshotDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-dashboard-")
	require.NoError(t, err)
	return dir
}

func screenshot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, png, 0o644))
}
