package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/waitroom"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/hibiken/asynqmon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// boardEnv is a board sampling the shared test server every 20ms under a
// prefix of its own, served by an httptest server, with a fake worker's
// metrics endpoint.
type boardEnv struct {
	cn        *conn
	board     *board
	srv       *httptest.Server
	decisions *prometheus.CounterVec
}

func newBoardEnv(t *testing.T, cfg boardConfig) *boardEnv {
	t.Helper()
	a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: redistest.URL(t), prefix: redistest.Prefix(t)}
	cn, err := a.connect(nil)
	require.NoError(t, err)
	t.Cleanup(cn.Close)

	e := &boardEnv{cn: cn}
	// A worker's /metrics: the gate's decisions, labelled by tenant.
	reg := prometheus.NewRegistry()
	e.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: decisionsMetric, Help: "decisions"}, []string{"verdict", "rule", "tenant"})
	reg.MustRegister(e.decisions)
	e.decisions.WithLabelValues("allowed", "", "someone-else").Add(1)
	worker := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(worker.Close)

	cfg.interval = cmp.Or(cfg.interval, 20*time.Millisecond)
	cfg.points = cmp.Or(cfg.points, 50)
	cfg.maxTenants = cmp.Or(cfg.maxTenants, 100)
	cfg.scrape = append(cfg.scrape, worker.URL+"/metrics")
	e.board = newBoard(cn, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.board.run(ctx)
	}()
	mon := asynqmon.New(asynqmon.Options{RootPath: asynqRoot, RedisConnOpt: cn.url.AsynqOpt(), ReadOnly: cfg.readOnly})
	e.srv = httptest.NewServer(e.board.handler(mon, false))
	t.Cleanup(func() {
		e.srv.Close()
		cancel()
		<-done
		e.board.close()
		_ = mon.Close()
	})
	return e
}

func (e *boardEnv) get(t *testing.T, path string, v any) int {
	t.Helper()
	resp, err := http.Get(e.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	if v != nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return resp.StatusCode
}

// row waits until the tenants list has tenant and cond holds for its row.
func (e *boardEnv) row(t *testing.T, tenant, what string, cond func(tenantsDoc, rowJSON) bool) (tenantsDoc, rowJSON) {
	t.Helper()
	var (
		doc tenantsDoc
		got rowJSON
	)
	waitFor(t, tenant+": "+what, func() bool {
		doc = tenantsDoc{}
		require.Equal(t, http.StatusOK, e.get(t, "/api/tenants", &doc))
		for _, r := range doc.Tenants {
			if r.Tenant == tenant {
				got = r
				return cond(doc, r)
			}
		}
		return false
	})
	return doc, got
}

func setPolicy(t *testing.T, cn *conn, name, text string) {
	t.Helper()
	p, err := throttle.ParsePolicy(text)
	require.NoError(t, err)
	require.NoError(t, cn.store.Set(context.Background(), name, p))
}

func TestBoardFollowsATenant(t *testing.T) {
	t.Parallel()
	// a tenant's decisions per second are those of the last sample: the
	// test's polls must see one sample after the counters moved, so the
	// samples are not much shorter than a poll on a loaded machine
	e := newBoardEnv(t, boardConfig{readOnly: true, interval: 250 * time.Millisecond})
	ctx := context.Background()
	setPolicy(t, e.cn, "acme", "rate=1000/s burst=10 concurrency=5 backlog=100")

	doc, row := e.row(t, "acme", "listed from its policy", func(tenantsDoc, rowJSON) bool { return true })
	require.Equal(t, rowJSON{
		Tenant: "acme", Kind: kindTenant, Policy: "acme", Rules: "rate=1000/s burst=10 concurrency=5 backlog=100",
		Limit: "1000/s", LimitPerS: 1000, Cap: 5, BacklogCap: 100,
		Decisions: &decisionsJSON{Denied: map[string]float64{}}, Spark: row.Spark,
	}, row)
	require.Equal(t, e.cn.prefix, doc.Prefix)
	require.True(t, doc.ReadOnly)
	require.Empty(t, doc.Error)
	require.Equal(t, 1, doc.TenantsTotal)
	require.Equal(t, []sourceJSON{{URL: e.board.cfg.scrape[0], OK: true}}, doc.MetricsSources)

	// Jobs start and run: starts per second and in flight move.
	var claims []uint64
	for i := range 3 {
		d, err := e.cn.limiter.Admit(ctx, "acme", "job-"+strconv.Itoa(i))
		require.NoError(t, err)
		require.True(t, d.Allowed)
		claims = append(claims, d.Claim)
	}
	_, _, err := waitroom.Of(e.cn.limiter).Join(ctx, "acme", 100, waitroom.Waiter{ID: "queued-1"}, waitroom.Waiter{ID: "queued-2"})
	require.NoError(t, err)
	e.decisions.WithLabelValues("allowed", "", "acme").Add(3)
	e.decisions.WithLabelValues("denied", "concurrency", "acme").Add(4)
	_, row = e.row(t, "acme", "starts, in flight, waiting and decisions", func(_ tenantsDoc, r rowJSON) bool {
		return r.InFlight == 3 && r.Waiting == 2 && r.Decisions.Denied["concurrency"] > 0
	})
	require.Equal(t, int64(5), row.Cap)

	var detail tenantDoc
	waitFor(t, "the starts in acme's history", func() bool {
		detail = tenantDoc{}
		require.Equal(t, http.StatusOK, e.get(t, "/api/tenants/acme", &detail))
		for _, p := range detail.Points {
			if p.StartsPerS > 0 {
				return true
			}
		}
		return false
	})
	require.Equal(t, "acme", detail.Tenant.Tenant)
	require.Equal(t, int64(3), detail.Stats.Started)
	require.Equal(t, int64(5), detail.Stats.Concurrency.Limit)
	require.LessOrEqual(t, len(detail.Points), 50, "history is bounded")
	for i := 1; i < len(detail.Points); i++ {
		require.GreaterOrEqual(t, detail.Points[i].T, detail.Points[i-1].T, "points oldest first")
	}

	for i, c := range claims {
		require.NoError(t, e.cn.limiter.Release(ctx, "acme", "job-"+strconv.Itoa(i), c))
	}
	e.row(t, "acme", "nothing in flight after the releases", func(_ tenantsDoc, r rowJSON) bool { return r.InFlight == 0 })

	// The fleet's decisions sum the tenants'.
	require.NotNil(t, doc.Decisions)
	var fleet tenantsDoc
	require.Equal(t, http.StatusOK, e.get(t, "/api/tenants", &fleet))
	require.True(t, fleet.TenantLabels)

	// An unknown tenant is a 404 with a reason, also for a name with a slash.
	var notFound map[string]string
	require.Equal(t, http.StatusNotFound, e.get(t, "/api/tenants/nobody", &notFound))
	require.Contains(t, notFound["error"], `tenant "nobody" is not followed`)
	setPolicy(t, e.cn, "a/b c", "rate=1/s")
	e.row(t, "a/b c", "listed", func(tenantsDoc, rowJSON) bool { return true })
	require.Equal(t, http.StatusOK, e.get(t, "/api/tenants/a%2Fb%20c", &detail))
	require.Equal(t, "a/b c", detail.Tenant.Tenant)
}

func TestBoardShowsReservationsAndCooldown(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	ctx := context.Background()
	setPolicy(t, e.cn, "slow", "rate=1/min")
	d, err := e.cn.limiter.Do(ctx, throttle.Request{Tenant: "slow", ID: "first", Reserve: true})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	for _, id := range []string{"second", "third"} {
		d, err = e.cn.limiter.Do(ctx, throttle.Request{Tenant: "slow", ID: id, Reserve: true})
		require.NoError(t, err)
		require.False(t, d.Allowed)
	}
	_, err = e.cn.limiter.Cooldown(ctx, "slow", time.Minute)
	require.NoError(t, err)
	_, row := e.row(t, "slow", "two reserved slots and a cooldown", func(_ tenantsDoc, r rowJSON) bool {
		return r.Reserved == 2 && r.CooldownMS > 0
	})
	require.True(t, row.Paused)
	require.LessOrEqual(t, row.CooldownMS, 60_000.0)
	require.Equal(t, "1/min", row.Limit)
	require.InDelta(t, 1.0/60, row.LimitPerS, 1e-9, "a slow limit is not rounded to 0")
	require.Zero(t, row.Waiting)
}

// TestBoardPausedSinceTheSampleBefore: a tenant counts as paused while
// in cooldown, at the sample after its cooldown ended (the decisions by
// rule are counted over that interval), and when its labelled decisions
// show denials by cooldown; not otherwise.
func TestBoardPausedSinceTheSampleBefore(t *testing.T) {
	t.Parallel()
	b := newBoard(nil, boardConfig{interval: time.Second, points: 10, maxTenants: 10})
	t0 := time.Unix(1_800_000_000, 0)
	sample := func(at time.Time, cooldownUntil time.Time) topSample {
		return topSample{"acme": &throttle.Stats{Tenant: "acme", Now: at, CooldownUntil: cooldownUntil}}
	}
	paused := func() bool {
		b.mu.RLock()
		defer b.mu.RUnlock()
		return b.tracks["acme"].row.Paused
	}
	b.record(sample(t0, time.Time{}), []string{"acme"}, decisionRates{}, nil, nil)
	require.False(t, paused())
	b.record(sample(t0.Add(time.Second), t0.Add(1500*time.Millisecond)), []string{"acme"}, decisionRates{}, nil, nil)
	require.True(t, paused(), "in cooldown now")
	b.record(sample(t0.Add(2*time.Second), time.Time{}), []string{"acme"}, decisionRates{}, nil, nil)
	require.True(t, paused(), "in cooldown at the sample before: paused during the interval")
	b.record(sample(t0.Add(3*time.Second), time.Time{}), []string{"acme"}, decisionRates{}, nil, nil)
	require.False(t, paused())
	labelled := decisionRates{labelled: true, perSec: map[decisionKey]float64{{"acme", "denied", ruleCooldown}: 2}}
	b.record(sample(t0.Add(4*time.Second), time.Time{}), []string{"acme"}, labelled, nil, nil)
	require.True(t, paused(), "a cooldown between two samples, seen in the decisions")
}

// TestBoardShowsPoolsAndSettledCosts: a line's kind tells tenants, @global,
// keys below tenants and shared pools apart (the page lists pools in a panel of their own),
// and the cost settled after jobs ran shows on the tenant's line and its
// pool's, and in the tenant's state.
func TestBoardShowsPoolsAndSettledCosts(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	ctx := context.Background()
	setPolicy(t, e.cn, "acme", "rate=100/s burst=20")
	setPolicy(t, e.cn, "quiet", "rate=5/s")
	setPolicy(t, e.cn, "@global", "concurrency=50")
	setPolicy(t, e.cn, "@openai", "rate=1000/min burst=100")
	setPolicy(t, e.cn, "@smtp", "concurrency=2")
	setPolicy(t, e.cn, "acme/*", "rate=10/s")
	for _, j := range []struct {
		id          string
		est, actual int64
	}{{"cheap", 10, 3}, {"dear", 2, 6}} {
		req := throttle.Request{Tenant: "acme", ID: j.id, Cost: j.est, Pools: []string{"@openai"}}
		d, err := e.cn.limiter.Do(ctx, req)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%s: %s", j.id, d)
		require.NoError(t, e.cn.limiter.Settle(ctx, req, d, j.actual))
	}

	// a key below acme (after the settlements, so that acme's figures are
	// the two jobs' alone): a line of its own, of kind key
	d, err := e.cn.limiter.Do(ctx, throttle.Request{Tenant: "acme", Key: "user-42", ID: "keyed"})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	e.row(t, "acme/user-42", "listed", func(tenantsDoc, rowJSON) bool { return true })
	doc, acme := e.row(t, "acme", "its settled costs", func(_ tenantsDoc, r rowJSON) bool { return r.SettledRefunded > 0 })
	require.Equal(t, [2]int64{7, 4}, [2]int64{acme.SettledRefunded, acme.SettledExtra}, "refunded 10-3, charged 6-2 extra")
	require.Equal(t, kindTenant, acme.Kind)
	_, pool := e.row(t, "@openai", "its settled costs", func(_ tenantsDoc, r rowJSON) bool { return r.SettledRefunded > 0 })
	require.Equal(t, [2]int64{7, 4}, [2]int64{pool.SettledRefunded, pool.SettledExtra}, "the pool was settled with the job")
	require.Equal(t, kindPool, pool.Kind)
	require.Equal(t, "1000/min", pool.Limit)
	kinds := map[string]string{}
	for _, r := range doc.Tenants {
		kinds[r.Tenant] = r.Kind
		if r.Tenant == "quiet" {
			require.Zero(t, r.SettledRefunded+r.SettledExtra)
		}
	}
	require.Equal(t, map[string]string{"@global": kindGlobal, "@openai": kindPool, "@smtp": kindPool, "acme": kindTenant, "acme/user-42": kindKey, "quiet": kindTenant}, kinds)
	require.Equal(t, 6, doc.TenantsTotal)
	require.Equal(t, 2, doc.PoolsTotal)
	require.Equal(t, 1, doc.KeysTotal)

	var detail tenantDoc
	require.Equal(t, http.StatusOK, e.get(t, "/api/tenants/@openai", &detail))
	require.Equal(t, kindPool, detail.Tenant.Kind)
	require.Equal(t, [2]int64{7, 4}, [2]int64{detail.Stats.Refunded, detail.Stats.Extra})

	// The JSON keeps its fields: a line has the settled counts also while 0.
	resp, err := http.Get(e.srv.URL + "/api/tenants")
	require.NoError(t, err)
	var raw struct {
		PoolsTotal *int             `json:"pools_total"`
		Tenants    []map[string]any `json:"tenants"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
	resp.Body.Close()
	require.NotNil(t, raw.PoolsTotal)
	for _, r := range raw.Tenants {
		for _, k := range []string{"tenant", "kind", "starts_per_s", "settled_refunded", "settled_extra"} {
			require.Contains(t, r, k, "%v", r["tenant"])
		}
	}

	resp, err = http.Get(e.srv.URL + "/")
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(page), `<section class="panel" id="pools-panel" hidden>`)
	require.Contains(t, string(page), "<h2>Shared pools")
}

func TestBoardPages(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	for path, want := range map[string]string{
		"/":                     "<title>sluice · tenants</title>",
		"/tenants/acme":         "<title>sluice · tenant</title>",
		"/static/dashboard.js":  "function lineChart(",
		"/static/dashboard.css": ".bar {",
		"/asynq/":               "Asynq - Monitoring",
	} {
		resp, err := http.Get(e.srv.URL + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, string(body), want, path)
	}
	var queues map[string]any
	require.Equal(t, http.StatusOK, e.get(t, "/asynq/api/queues", &queues))
}

func TestBoardReadOnly(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodPut} {
		req, err := http.NewRequest(method, e.srv.URL+"/asynq/api/queues/default:pause", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, method)
		require.Contains(t, string(body), "the dashboard is read-only: start it with --allow-write")
	}
}

func TestBoardWritesNeedTheSameOrigin(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: false})
	post := func(header, value string) int {
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/asynq/api/queues/nosuchqueue:pause", nil)
		require.NoError(t, err)
		if header != "" {
			req.Header.Set(header, value)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post("Sec-Fetch-Site", "cross-site"), "a page of another site cannot post")
	require.Equal(t, http.StatusForbidden, post("Origin", "http://evil.example"))
	// With --allow-write a request from the page itself reaches asynqmon,
	// which answers for the queue that does not exist.
	require.NotEqual(t, http.StatusForbidden, post("Sec-Fetch-Site", "same-origin"))
	require.NotEqual(t, http.StatusMethodNotAllowed, post("Sec-Fetch-Site", "same-origin"))
}

func TestBoardRefusesOtherHosts(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	for host, want := range map[string]int{
		"evil.example":    http.StatusForbidden,
		"10.0.0.1:8080":   http.StatusForbidden,
		"localhost:8080":  http.StatusOK,
		"127.0.0.1":       http.StatusOK,
		"[::1]:8080":      http.StatusOK,
		"LOCALHOST:31337": http.StatusOK,
	} {
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/api/tenants", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, host)
	}
}

func TestBoardReportsRedisErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t, nil)
	a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: srv.URL(), prefix: "sluice"}
	cn, err := a.connect(nil)
	require.NoError(t, err)
	defer cn.Close()
	setPolicy(t, cn, "acme", "rate=5/s")
	b := newBoard(cn, boardConfig{interval: 20 * time.Millisecond, points: 10, maxTenants: 10})
	defer b.close()
	ctx := context.Background()
	b.sample(ctx)
	require.Empty(t, b.tenants().Error)
	require.Len(t, b.tenants().Tenants, 1)

	srv.Kill()
	b.sample(ctx)
	doc := b.tenants()
	require.Contains(t, doc.Error, "connection refused")
	require.NotNil(t, doc.ErrorSince)
	require.Len(t, doc.Tenants, 1, "the last good figures stay")

	require.NoError(t, srv.Restart())
	waitFor(t, "the board to recover", func() bool {
		b.sample(ctx)
		return b.tenants().Error == ""
	})
	require.Nil(t, b.tenants().ErrorSince)
}

func TestBoardChoose(t *testing.T) {
	t.Parallel()
	b := &board{cfg: boardConfig{interval: time.Second, points: 60, maxTenants: 3}, tracks: map[string]*track{}}
	names := []string{"a", "b", "c", "d", "e"}
	require.Equal(t, []string{"a", "b", "c"}, b.choose(names), "the first in name order")
	require.Equal(t, []string{"a", "b"}, b.choose([]string{"a", "b"}))

	long := time.Now().Add(-2 * time.Minute)
	b.tracks["b"] = &track{}
	b.tracks["d"] = &track{idleSince: long}
	b.tracks["e"] = &track{idleSince: time.Now().Add(-30 * time.Second)}
	// b is active and e idle for less than the history: they keep their
	// places. d has been idle for the whole history: the first newcomer (a)
	// takes its place; c waits.
	require.Equal(t, []string{"a", "b", "e"}, b.choose(names))
	b.tracks["d"].idleSince = time.Now()
	require.Equal(t, []string{"b", "d", "e"}, b.choose(names), "no place is free")
}

func TestParseDecisions(t *testing.T) {
	t.Parallel()
	text := `# TYPE sluice_worker_decisions_total counter
sluice_worker_decisions_total{rule="",tenant="acme",verdict="allowed"} 58
sluice_worker_decisions_total{rule="rate[0]",tenant="acme",verdict="denied"} 4
sluice_worker_decisions_total{rule="concurrency",tenant="b",verdict="denied"} 2
`
	got, labelled, err := parseDecisions(strings.NewReader(text))
	require.NoError(t, err)
	require.True(t, labelled)
	require.Equal(t, map[decisionKey]float64{
		{"acme", "allowed", ""}: 58, {"acme", "denied", "rate[0]"}: 4, {"b", "denied", "concurrency"}: 2,
	}, got)

	got, labelled, err = parseDecisions(strings.NewReader("# TYPE sluice_worker_in_flight gauge\nsluice_worker_in_flight 0\n"))
	require.NoError(t, err, "a worker that decided nothing yet")
	require.False(t, labelled)
	require.Empty(t, got)

	_, _, err = parseDecisions(strings.NewReader("# TYPE go_goroutines gauge\ngo_goroutines 7\n"))
	require.EqualError(t, err, "no sluice_worker_* metrics: is this a sluice worker's /metrics?")
	_, _, err = parseDecisions(strings.NewReader("<html>"))
	require.ErrorContains(t, err, "not Prometheus metrics")
}

func TestScraperRates(t *testing.T) {
	t.Parallel()
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body.Load()) }))
	defer srv.Close()
	urls := []string{srv.URL, "http://127.0.0.1:1/metrics"}
	s := newScraper(time.Second)
	defer s.close()
	counter := func(allowed, denied int) string {
		return fmt.Sprintf("sluice_worker_decisions_total{rule=\"\",verdict=\"allowed\"} %d\nsluice_worker_decisions_total{rule=\"window\",verdict=\"denied\"} %d\n", allowed, denied)
	}
	ctx := context.Background()
	body.Store(counter(100, 10))
	r := s.round(ctx, urls)
	require.Empty(t, r.perSec, "the first round has nothing to compare with")
	require.True(t, r.sources[0].OK)
	require.False(t, r.sources[1].OK)
	require.Contains(t, r.sources[1].Error, "connection refused")
	require.Nil(t, r.byTenant(), "no tenant labels")

	body.Store(counter(300, 10))
	r = s.round(ctx, urls)
	fleet := r.fleet()
	require.Positive(t, fleet.Allowed)
	require.Zero(t, fleet.Denied["window"])

	// A restarted worker's counters start again: what it counted since.
	body.Store(counter(5, 1))
	r = s.round(ctx, urls)
	require.Positive(t, r.fleet().Allowed)
	require.Positive(t, r.fleet().Denied["window"])
}

func TestLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.8.9.1": true, "::1": true, "localhost": true, "LocalHost": true,
		"": false, "0.0.0.0": false, "::": false, "10.1.2.3": false, "example.com": false, "localhost.example.com": false,
	} {
		require.Equal(t, want, loopbackHost(host), host)
	}
}

// runningDashboard is a sluice dashboard process started by a test.
type runningDashboard struct {
	cmd    *exec.Cmd
	lines  *bufio.Scanner
	stderr *clitest.SyncBuffer
	base   string // http://127.0.0.1:PORT/
	first  string // the line it printed first
}

// startDashboard runs the binary with env on a free loopback port and
// reads the address it prints.
func startDashboard(t *testing.T, c *cli, env map[string]string, args ...string) *runningDashboard {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	d := &runningDashboard{stderr: &clitest.SyncBuffer{}}
	d.cmd = clitest.Command(ctx, t, c.bin, nil, env, append([]string{"dashboard", "--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := d.cmd.StdoutPipe()
	require.NoError(t, err)
	d.cmd.Stderr = d.stderr
	require.NoError(t, d.cmd.Start())
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		_ = d.cmd.Wait()
	})
	d.lines = bufio.NewScanner(stdout)
	require.True(t, d.lines.Scan(), "stderr: %s", d.stderr.String())
	first := d.lines.Text()
	require.Regexp(t, `^sluice dashboard on http://127\.0\.0\.1:\d+/ \((read-only|asynq's pages may change queues and tasks \(--allow-write\))(, asks for its credential)?; asynq's queues and tasks at /asynq/\)$`, first)
	d.base, d.first = strings.Fields(first)[3], first
	return d
}

// tenants waits until the dashboard lists want, by name.
func (d *runningDashboard) tenants(t *testing.T, want ...string) tenantsDoc {
	t.Helper()
	var doc tenantsDoc
	waitFor(t, fmt.Sprintf("%v on the dashboard", want), func() bool {
		resp, err := http.Get(d.base + "api/tenants")
		require.NoError(t, err)
		defer resp.Body.Close()
		doc = tenantsDoc{}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
		var got []string
		for _, r := range doc.Tenants {
			got = append(got, r.Tenant)
		}
		return slices.Equal(want, got)
	})
	return doc
}

// testDashboard runs the binary: it serves, answers, and stops on SIGTERM
// with exit code 0; an address in use is a failure that says so.
func testDashboard(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=10/s concurrency=2")
	d := startDashboard(t, c, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "--interval", "100ms")
	doc := d.tenants(t, "acme")
	require.NotNil(t, doc.Workers, "no --metrics: the workers come from the fleet's registry")
	require.Empty(t, doc.Workers, "where none is registered")
	require.Contains(t, d.first, "(read-only; ")

	// A second dashboard on the same address fails and says what to do.
	addr := strings.TrimSuffix(strings.TrimPrefix(d.base, "http://"), "/")
	r := c.run(t, "dashboard", "--listen", addr)
	require.Equal(t, 1, r.code)
	require.Equal(t, "sluice: --listen "+addr+": cannot listen: address already in use; choose another address with --listen HOST:PORT (port 0 picks a free one)\n", r.stderr)

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.True(t, d.lines.Scan())
	require.Equal(t, "sluice dashboard stopped", d.lines.Text())
	require.NoError(t, d.cmd.Wait(), "exit code 0 after SIGTERM; stderr: %s", d.stderr.String())
	require.Empty(t, d.stderr.String())
	_, err := net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, err, "the port is closed")
}

// TestBoardExplainsWaitingJobs: a tenant's page lists the first jobs of
// its lines with when they are expected to start and their priority, and
// /api/jobs/ID explains one (sluice jobs explain --json).
func TestBoardExplainsWaitingJobs(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	ctx := context.Background()
	setPolicy(t, e.cn, "lined", "rate=1/min")
	qname := "q-" + e.cn.prefix
	qc, err := queue.New(e.cn.client, &queue.Config{Prefix: e.cn.prefix})
	require.NoError(t, err)
	defer qc.Close()
	for _, j := range []struct {
		id string
		p  taskspec.Priority
	}{{"a", queue.Normal}, {"b", queue.Normal}, {"c", queue.Low}, {"d", queue.High}} {
		_, err := qc.Enqueue(ctx, "lined", asynq.NewTask("sleep", nil), asynq.Queue(qname), asynq.TaskID(e.cn.prefix+"-"+j.id), queue.Priority(j.p))
		require.NoError(t, err)
	}
	e.row(t, "lined", "four waiting", func(_ tenantsDoc, r rowJSON) bool { return r.Waiting == 4 })
	var doc tenantDoc
	require.Equal(t, http.StatusOK, e.get(t, "/api/tenants/lined", &doc))
	require.Len(t, doc.Next, 4)
	require.Equal(t, nextJSON{ID: e.cn.prefix + "-d", Queue: qname, HeldBy: "turn", Priority: "high"}, doc.Next[0], "high priority leaves first")
	var order []string
	for _, n := range doc.Next {
		order = append(order, strings.TrimPrefix(n.ID, e.cn.prefix+"-")+"/"+n.Priority)
	}
	require.Equal(t, []string{"d/high", "a/normal", "b/normal", "c/low"}, order)
	require.Equal(t, "rate[0]", doc.Next[2].HeldBy)
	require.InDelta(t, 120_000, doc.Next[2].ExpectedInMS, 1000)

	var doc2 jobDoc
	require.Equal(t, http.StatusOK, e.get(t, "/api/jobs/"+e.cn.prefix+"-b?queue="+qname, &doc2))
	job := doc2.Job
	require.Equal(t, "waiting", job.State)
	require.Equal(t, "rate[0]", job.HeldBy)
	require.EqualValues(t, 2, job.Ahead)
	require.Equal(t, "normal", job.Priority)
	require.Contains(t, job.Text, "held by rate[0]")
	require.Equal(t, http.StatusOK, e.get(t, "/api/jobs/"+e.cn.prefix+"-c?queue="+qname, &doc2))
	require.Equal(t, "low", doc2.Job.Priority)
	require.Contains(t, doc2.Job.Text, "waiting in its tenant's line at low priority, 3 ahead of it")
	var missing map[string]string
	require.Equal(t, http.StatusNotFound, e.get(t, "/api/jobs/nope?queue="+qname, &missing))
	require.Contains(t, missing["error"], `no task "nope"`)
}

// TestScrapeRoomErrors: the waiting room's errors (kinds room, recover and
// asynq_layout of sluice_worker_errors_total) are read beside the
// decisions, and the fleet's decisions say the room is failing while they
// grow; the gate's other errors are not the room's.
func TestScrapeRoomErrors(t *testing.T) {
	t.Parallel()
	text := `# TYPE sluice_worker_errors_total counter
sluice_worker_errors_total{kind="room"} 3
sluice_worker_errors_total{kind="asynq_layout"} 1
sluice_worker_errors_total{kind="redis"} 5
`
	got, _, err := parseDecisions(strings.NewReader(text))
	require.NoError(t, err, "a worker whose room fails before it decided anything")
	require.Equal(t, map[decisionKey]float64{
		{"", verdictRoomError, "room"}: 3, {"", verdictRoomError, "asynq_layout"}: 1,
	}, got)

	r := decisionRates{perSec: map[decisionKey]float64{{"", verdictRoomError, "room"}: 0.5, {"", "allowed", ""}: 10}}
	d := r.fleet()
	require.Equal(t, map[string]float64{"room": 0.5}, d.RoomErrors)
	require.Equal(t, 10.0, d.Allowed)
	require.Nil(t, decisionRates{perSec: map[decisionKey]float64{{"", "allowed", ""}: 10}}.fleet().RoomErrors, "a working room shows nothing")
}

// testDashboardAuth: with a credential every request but /healthz must
// carry it: USER:PASSWORD as basic auth, a token as a bearer token or as
// basic auth's password.
func testDashboardAuth(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=10/s")
	status := func(d *runningDashboard, path string, set func(*http.Request)) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, d.base+path, nil)
		require.NoError(t, err)
		if set != nil {
			set(req)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			require.Equal(t, `Basic realm="sluice dashboard", charset="UTF-8"`, resp.Header.Get("WWW-Authenticate"))
		}
		return resp.StatusCode
	}
	basic := func(user, pass string) func(*http.Request) {
		return func(r *http.Request) { r.SetBasicAuth(user, pass) }
	}
	d := startDashboard(t, c, map[string]string{"SLUICE_REDIS_URL": c.url, "SLUICE_DASHBOARD_AUTH": "admin:s3cret-pass"}, "--prefix", c.prefix, "--allow-write")
	require.Contains(t, d.first, "(asynq's pages may change queues and tasks (--allow-write), asks for its credential; ")
	require.Equal(t, http.StatusUnauthorized, status(d, "api/tenants", nil))
	require.Equal(t, http.StatusUnauthorized, status(d, "", basic("admin", "wrong-pass")))
	require.Equal(t, http.StatusUnauthorized, status(d, "", basic("root", "s3cret-pass")))
	require.Equal(t, http.StatusOK, status(d, "api/tenants", basic("admin", "s3cret-pass")))
	require.Equal(t, http.StatusOK, status(d, "asynq/", basic("admin", "s3cret-pass")))
	require.Equal(t, http.StatusOK, status(d, "healthz", nil), "the probes' endpoint needs none")

	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("0123456789abcdef\n"), 0o600))
	d = startDashboard(t, c, map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "--auth-file", file)
	require.Equal(t, http.StatusUnauthorized, status(d, "api/tenants", nil))
	require.Equal(t, http.StatusOK, status(d, "api/tenants", func(r *http.Request) { r.Header.Set("Authorization", "Bearer 0123456789abcdef") }))
	require.Equal(t, http.StatusUnauthorized, status(d, "api/tenants", func(r *http.Request) { r.Header.Set("Authorization", "Bearer 0123456789abcdeX") }))
	require.Equal(t, http.StatusOK, status(d, "", basic("anyone", "0123456789abcdef")), "a browser sends the token as a password")

	for _, tt := range []struct{ value, want string }{
		{"admin:", "sluice: SLUICE_DASHBOARD_AUTH: USER:PASSWORD with an empty user or password; give both, or a token with no colon\n"},
		{"short", "sluice: SLUICE_DASHBOARD_AUTH: a password or token of 5 characters; use at least 8 (e.g. openssl rand -hex 16)\n"},
	} {
		r := c.runWith(t, nil, map[string]string{"SLUICE_DASHBOARD_AUTH": tt.value}, "dashboard")
		require.Equal(t, 2, r.code)
		require.True(t, strings.HasPrefix(r.stderr, tt.want), r.stderr)
	}
}

// durationsRE masks the durations and times of an explanation, which move
// between two readings.
var durationsRE = regexp.MustCompile(`\d+(\.\d+)?(ns|µs|ms|s|m|h)\b|\(\d{4}-[0-9T:.-]+Z\)`)

// TestBoardJobPage: /jobs/ID is a page of its own, and /api/jobs/ID gives
// it the job's explanation as sluice jobs explain prints it, its place in
// its tenant's line, what is known of its history and its task's page in
// asynqmon, which the dashboard serves.
func TestBoardJobPage(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	ctx := context.Background()
	setPolicy(t, e.cn, "paced", "rate=1/min")
	qname := "q-" + strings.ReplaceAll(e.cn.prefix, ":", ".")
	qc, err := queue.New(e.cn.client, &queue.Config{Prefix: e.cn.prefix})
	require.NoError(t, err)
	defer qc.Close()
	for _, id := range []string{"a", "b", "c"} {
		_, err := qc.Enqueue(ctx, "paced", asynq.NewTask("sleep", nil), asynq.Queue(qname), asynq.TaskID(e.cn.prefix+"-"+id))
		require.NoError(t, err)
	}
	e.row(t, "paced", "three waiting", func(_ tenantsDoc, r rowJSON) bool { return r.Waiting == 3 })
	id := e.cn.prefix + "-c"

	resp, err := http.Get(e.srv.URL + "/jobs/" + url.PathEscape(id) + "?queue=" + qname)
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Contains(t, string(page), `<script src="/static/job.js" defer></script>`)
	require.Contains(t, string(page), `id="explain"`)

	var doc jobDoc
	require.Equal(t, http.StatusOK, e.get(t, "/api/jobs/"+url.PathEscape(id)+"?queue="+qname, &doc))
	require.Equal(t, "waiting", doc.Job.State)
	require.NotEmpty(t, doc.Redis, "the header's fields, for the page's status")

	// the explanation is sluice jobs explain's, word for word
	var stdout, stderr bytes.Buffer
	env := func(k string) string {
		if k == "SLUICE_REDIS_URL" {
			return redistest.URL(t)
		}
		return ""
	}
	require.Equal(t, 0, run(ctx, []string{"--prefix", e.cn.prefix, "jobs", "explain", id}, nil, &stdout, &stderr, env), stderr.String())
	require.Equal(t, durationsRE.ReplaceAllString(stdout.String(), "<d>"), durationsRE.ReplaceAllString(doc.Explain, "<d>"))
	require.Contains(t, doc.Explain, "held by rate[0]")

	require.NotNil(t, doc.Line)
	require.Equal(t, int64(3), doc.Line.Position)
	require.Equal(t, int64(2), doc.Line.Ahead)
	require.Equal(t, int64(2), doc.Line.CostAhead)
	require.Equal(t, "normal", doc.Line.Priority)
	require.Equal(t, int64(3), doc.Line.Waiting)

	require.Len(t, doc.History, 3, "%+v", doc.History)
	require.Equal(t, "joined tenant paced's line in queue "+qname, doc.History[0].What)
	require.True(t, strings.HasPrefix(doc.History[1].What, "now: waiting in its tenant's line, 2 ahead of it"), doc.History[1].What)
	require.Equal(t, eventJSON{At: doc.History[2].At, What: "expected to start (held by rate[0])", Next: true}, doc.History[2])
	require.InDelta(t, 2*time.Minute, doc.History[2].At.Sub(doc.History[1].At), float64(2*time.Second))

	require.Equal(t, "/asynq/queues/"+qname+"/tasks/"+url.PathEscape(id), doc.AsynqURL)
	require.Equal(t, http.StatusOK, e.get(t, doc.AsynqURL, nil), "asynqmon serves the task's page")

	// a job that failed: its last failure and when asynq runs it again
	srv := asynq.NewServerFromRedisClient(e.cn.client, asynq.Config{
		Queues: map[string]int{qname + "-f": 1}, Concurrency: 1, LogLevel: asynq.FatalLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc("fail", func(context.Context, *asynq.Task) error { return errors.New("downstream said 500") })
	require.NoError(t, srv.Start(mux))
	defer srv.Shutdown()
	ac := asynq.NewClientFromRedisClient(e.cn.client)
	_, err = ac.Enqueue(asynq.NewTaskWithHeaders("fail", nil, map[string]string{taskspec.TenantHeader: "paced"}), asynq.Queue(qname+"-f"), asynq.TaskID("failing"), asynq.MaxRetry(3))
	require.NoError(t, err)
	waitFor(t, "the job in retry", func() bool {
		doc = jobDoc{}
		return e.get(t, "/api/jobs/failing", &doc) == http.StatusOK && doc.Job.State == "retry"
	})
	require.Nil(t, doc.Line)
	require.Len(t, doc.History, 3, "%+v", doc.History)
	require.Equal(t, "failed (retried 1 of 3): downstream said 500", doc.History[0].What)
	require.True(t, strings.HasPrefix(doc.History[1].What, "now: retry: asynq brings it back in "), doc.History[1].What)
	require.Equal(t, "asynq runs it again", doc.History[2].What)
	require.True(t, doc.History[2].Next)
	require.Contains(t, doc.Explain, "last error: downstream said 500")

	var missing map[string]string
	require.Equal(t, http.StatusNotFound, e.get(t, "/api/jobs/nope", &missing))
	require.Contains(t, missing["error"], `no task "nope"`)
}
