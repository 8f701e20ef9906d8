package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/worker"
)

// fleetWorker is a worker of the test's fleet: a real worker.Server with
// tenant labels whose metrics a real HTTP server serves at the address it
// records in the fleet's registry.
type fleetWorker struct {
	srv     *worker.Server
	metrics *httptest.Server
}

func startFleetWorker(t *testing.T, c *cli, queueName string) *fleetWorker {
	t.Helper()
	reg := prometheus.NewRegistry()
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)
	srv, err := worker.New(c.client, &worker.Config{
		Prefix: c.prefix,
		Admin:  strings.TrimPrefix(metrics.URL, "http://"),
		Asynq:  asynq.Config{Queues: map[string]int{queueName: 1}, LogLevel: asynq.FatalLevel},
		Gate:   worker.GateConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg, TenantLabels: true},
	})
	require.NoError(t, err)
	srv.HandleFunc("sleep", func(context.Context, *asynq.Task) error { return nil })
	require.NoError(t, srv.Start())
	t.Cleanup(srv.Shutdown)
	return &fleetWorker{srv: srv, metrics: metrics}
}

// testDashboardFindsTheFleet: without --metrics the dashboard finds the
// workers in the fleet's registry, reads the metrics of those that are up
// and says which are down or serve none.
func testDashboardFindsTheFleet(t *testing.T, c *cli) {
	srv := redistest.NewServer(t, nil)
	c = &cli{bin: c.bin, url: srv.URL(), prefix: c.prefix, client: srv.Client(t)}
	q := "fleet-" + c.prefix
	w1, w2 := startFleetWorker(t, c, q), startFleetWorker(t, c, q)
	// a worker that stopped beating, and one with its admin endpoints off
	reg := fleet.New(c.client, c.prefix)
	_, _, err := reg.Beat(context.Background(), "dead:1:aa", "127.0.0.1:1", 100*time.Millisecond, time.Second, []string{q})
	require.NoError(t, err)
	_, _, err = reg.Beat(context.Background(), "quiet:2:bb", "", time.Minute, time.Second, []string{q})
	require.NoError(t, err)
	c.mustRun(t, "policy", "set", "acme", "rate=50/s")
	d := startDashboard(t, c, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "--interval", "200ms")
	enqueueSleeps(t, c, q, "acme", 20)

	var doc tenantsDoc
	waitFor(t, "four workers listed, acme's decisions read from the two up", func() bool {
		doc = tenantsDoc{}
		getJSON(t, d.base+"api/tenants", &doc)
		return len(doc.Workers) == 4 && doc.Decisions != nil && doc.Decisions.Allowed > 0
	})
	up := map[string]bool{}
	for _, w := range doc.Workers {
		up[w.ID] = w.Up
	}
	require.False(t, up["dead:1:aa"])
	require.True(t, up["quiet:2:bb"])
	byURL := map[string]sourceJSON{}
	for _, s := range doc.MetricsSources {
		byURL[s.URL+"|"+s.Worker] = s
	}
	for _, w := range []*fleetWorker{w1, w2} {
		var found bool
		for _, s := range doc.MetricsSources {
			if s.URL == w.metrics.URL+"/metrics" {
				found = true
				require.True(t, s.OK, s.Error)
				require.NotEmpty(t, s.Worker)
			}
		}
		require.True(t, found, "%s among %v", w.metrics.URL, doc.MetricsSources)
	}
	require.Contains(t, byURL, "http://127.0.0.1:1/metrics|dead:1:aa")
	require.Regexp(t, `^down: no beat for \d+s past its lease$`, byURL["http://127.0.0.1:1/metrics|dead:1:aa"].Error)
	require.Equal(t, "serves no metrics (started with --admin off)", byURL["|quiet:2:bb"].Error)
	require.True(t, doc.TenantLabels)
}

// enqueueSleeps enqueues n sleep jobs of tenant in queue q.
func enqueueSleeps(t *testing.T, c *cli, q, tenant string, n int) {
	t.Helper()
	qc, err := queue.New(c.client, &queue.Config{Prefix: c.prefix})
	require.NoError(t, err)
	defer qc.Close()
	for range n {
		_, err := qc.Enqueue(context.Background(), tenant, asynq.NewTask("sleep", nil), asynq.Queue(q))
		require.NoError(t, err)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// testDashboardHistoryFromPrometheus: with --prometheus a tenant's page
// draws the history a real Prometheus server scraped from a real worker,
// history older than the dashboard process itself.
func testDashboardHistoryFromPrometheus(t *testing.T, c *cli) {
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "the prometheus server is needed by this test: make deps installs it (Debian's prometheus package)")
	srv := redistest.NewServer(t, nil)
	c = &cli{bin: c.bin, url: srv.URL(), prefix: c.prefix, client: srv.Client(t)}
	q := "hist-" + c.prefix
	w := startFleetWorker(t, c, q)
	prom := startPrometheus(t, bin, strings.TrimPrefix(w.metrics.URL, "http://"))
	found := func(query string) func() bool {
		return func() bool {
			var doc struct {
				Data struct {
					Result []json.RawMessage `json:"result"`
				} `json:"data"`
			}
			getJSON(t, prom+"/api/v1/query?query="+url.QueryEscape(query), &doc)
			return len(doc.Data.Result) > 0
		}
	}
	waitFor(t, "Prometheus to scrape the worker", found(`up{job="sluice-worker"} == 1`))
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	const acmeStarts = `sluice_worker_decisions_total{tenant="acme",verdict="allowed"}`
	enqueueSleeps(t, c, q, "acme", 30)
	waitFor(t, "Prometheus to have scraped acme's starts", found(`count_over_time(`+acmeStarts+`[1m]) >= 4 and increase(`+acmeStarts+`[1m]) > 0`))
	began := time.Now()
	d := startDashboard(t, c, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "--prometheus", prom)
	d.tenants(t, "acme")
	var doc tenantDoc
	getJSON(t, d.base+"api/tenants/acme", &doc)
	require.Equal(t, historyPrometheus, doc.HistoryFrom, doc.HistoryError)
	var before, started int
	for _, p := range doc.Points {
		if p.T < began.UnixMilli() {
			before++
			if p.StartsPerS > 0 {
				started++
			}
		}
	}
	require.Positive(t, before, "points from before the dashboard started: %+v", doc.Points)
	require.Positive(t, started, "with acme's starts: %+v", doc.Points)
	require.Equal(t, 10.0, doc.Points[0].LimitPerS)

	// a Prometheus that fails: the page says why and keeps its own samples
	broken := startDashboard(t, c, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "--prometheus", "http://127.0.0.1:1")
	broken.tenants(t, "acme")
	doc = tenantDoc{}
	getJSON(t, broken.base+"api/tenants/acme", &doc)
	require.Equal(t, historyMemory, doc.HistoryFrom)
	require.Contains(t, doc.HistoryError, "prometheus http://127.0.0.1:1: ")
}

// startPrometheus runs a Prometheus server on a free loopback port,
// scraping target every second, and returns its URL once it is ready.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sluice-worker\n    static_configs:\n      - targets: [%q]\n", target)), 0o644))
	port, err := redistest.FreePort()
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ctx, cancel := context.WithCancel(context.Background())
	cmd := clitest.Command(ctx, t, bin, nil, nil, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	logs := &clitest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	base := "http://" + addr
	waitFor(t, "prometheus ready", func() bool {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base
}
