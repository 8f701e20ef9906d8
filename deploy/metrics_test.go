package deploy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// family is a metric family a running worker exports: its type and the
// values each label takes.
type family struct {
	typ    dto.MetricType
	labels map[string]map[string]bool
}

// exported are a worker's families by name.
type exported map[string]*family

func parseExposition(t *testing.T, text string) exported {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err)
	out := exported{}
	for name, mf := range mfs {
		f := &family{typ: mf.GetType(), labels: map[string]map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if f.labels[l.GetName()] == nil {
					f.labels[l.GetName()] = map[string]bool{}
				}
				f.labels[l.GetName()][l.GetValue()] = true
			}
		}
		out[name] = f
	}
	return out
}

// lookup finds the family of a series name: a histogram's _bucket, _sum
// and _count series belong to it.
func (e exported) lookup(name string) (*family, bool) {
	if f, ok := e[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := e[base]; ok && f.typ == dto.MetricType_HISTOGRAM {
				return f, true
			}
		}
	}
	return nil, false
}

// runScenario starts a worker with tenant labels, as the compose file's,
// against a private Redis, and gives it the events that make every family
// of sluice's appear: the demo policies, a tenant held back in its line, a
// shadow policy, a downstream that declares a lower limit, one that
// answers 429, an adaptive rule, a job of an unknown type. It returns the
// worker's admin address and a function that reads its /metrics.
func runScenario(t *testing.T, b binaries) (admin string, scrape func() exported) {
	t.Helper()
	srv := redistest.NewServer(t, nil)
	env := map[string]string{"SLUICE_REDIS_URL": srv.URL()}
	mustRun := func(bin string, args ...string) {
		t.Helper()
		code, stdout, stderr := run(t, bin, env, args...)
		require.Equal(t, 0, code, "%s %v: %s%s", bin, args, stdout, stderr)
	}
	mustRun(b.sluice, "policy", "apply", "-f", "policies.yaml")
	mustRun(b.sluice, "policy", "set", "api", "rate=50/s adapt=10..200/s")
	mustRun(b.sluice, "policy", "set", "acme", "rate=1/s", "--shadow")

	var busy atomic.Int64
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/declares":
			w.Header().Set("RateLimit-Policy", `"default";q=5;w=1`)
			w.Header().Set("RateLimit", `"default";r=3;t=1`)
			w.Header().Set("X-RateLimit-Limit", "5")
			w.Header().Set("X-RateLimit-Remaining", "0")
			w.Header().Set("X-RateLimit-Reset-After", "1")
		case "/busy":
			if busy.Add(1) == 1 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
			}
		}
	}))
	t.Cleanup(downstream.Close)

	w := start(t, b.worker, env, "--queues", "default=1", "--concurrency", "20", "--tenant-labels", "--admin", "127.0.0.1:0", "--log-format", "json", "--recover-lease", "3s")
	admin = adminOf(t, w)
	mustRun(b.enqueue, "--tenant", "acme", "--type", "sleep", "--payload", `{"ms":10}`, "--count", "200", "--quiet")
	mustRun(b.enqueue, "--tenant", "api", "--type", "http", "--payload", `{"url":"`+downstream.URL+`/declares"}`, "--count", "3", "--quiet")
	mustRun(b.enqueue, "--tenant", "api", "--type", "http", "--payload", `{"url":"`+downstream.URL+`/busy"}`)
	mustRun(b.enqueue, "--tenant", "globex", "--type", "slep", "--payload", `{}`)
	t.Cleanup(func() {
		code, took := w.stop(t)
		require.Equal(t, 0, code, w.stderr.String())
		require.Less(t, took, 20*time.Second)
	})
	return admin, func() exported {
		code, body := get(t, "http://"+admin+"/metrics")
		require.Equal(t, http.StatusOK, code, body)
		return parseExposition(t, body)
	}
}

// testMetrics checks, against a running worker's /metrics, every metric
// name, label and label value that the Prometheus rules and the Grafana
// dashboard use, and docs/metrics.md's table both ways.
func testMetrics(t *testing.T, b binaries) {
	rules := ruleExprs(t)
	panels := dashboardExprs(t)
	table := metricsTable(t)
	used := map[string]bool{}
	for _, e := range append(slices.Clone(rules), panels...) {
		for _, s := range selectors(t, e) {
			if s.name != "up" && !recorded(rules, s.name) {
				used[s.name] = true
			}
		}
	}
	for name := range table {
		used[name] = true
	}

	_, scrape := runScenario(t, b)
	var (
		fams    exported
		missing []string
	)
	deadline := time.Now().Add(30 * time.Second)
	for {
		fams, missing = scrape(), nil
		for name := range used {
			if _, ok := fams.lookup(name); !ok {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			sort.Strings(missing)
			t.Fatalf("after 30s, the worker exports none of %v, which the rules, the dashboard or docs/metrics.md name", missing)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// one more scrape for the label values of the events that came last
	fams = scrape()

	t.Run("BuildInfo", func(t *testing.T) {
		f := fams["sluice_build_info"]
		require.Equal(t, map[string]bool{"v0.26.0": true}, f.labels["asynq_version"], "asynq's version from the binary's build information")
		require.Len(t, f.labels["version"], 1)
		for v := range f.labels["version"] {
			require.Regexp(t, `^(v\d+\.\d+\.\d+\S*|\(devel\)( [0-9a-f]+)?)$`, v)
		}
	})
	t.Run("Rules", func(t *testing.T) {
		for _, e := range rules {
			checkExpr(t, e.expr, e.where, fams, rules)
		}
	})
	t.Run("Dashboard", func(t *testing.T) {
		for _, e := range panels {
			checkExpr(t, e.expr, e.where, fams, rules)
		}
	})
	t.Run("DocsTable", func(t *testing.T) {
		var missing, undocumented []string
		for name, row := range table {
			f, ok := fams[name]
			if !ok {
				missing = append(missing, name)
				continue
			}
			require.Equal(t, strings.ToLower(f.typ.String()), row.typ, "docs/metrics.md: the type of %s", name)
			labels := []string{}
			for l := range f.labels {
				labels = append(labels, l)
			}
			sort.Strings(labels)
			require.Equal(t, labels, row.labels, "docs/metrics.md: the labels of %s (with --tenant-labels)", name)
		}
		for name := range fams {
			if strings.HasPrefix(name, "sluice_") {
				if _, ok := table[name]; !ok {
					undocumented = append(undocumented, name)
				}
			}
		}
		sort.Strings(missing)
		sort.Strings(undocumented)
		require.Empty(t, missing, "docs/metrics.md names metrics a worker does not export")
		require.Empty(t, undocumented, "a worker exports metrics docs/metrics.md does not name")
	})
}

// tableRow is a metric in docs/metrics.md's table.
type tableRow struct {
	typ    string
	labels []string
}

var tableLine = regexp.MustCompile("^\\| `(sluice_[a-z_]+)` \\| (counter|gauge|histogram) \\|([^|]*)\\|")

// metricsTable reads docs/metrics.md's table: | `name` | type | labels | …
// with the labels written `a`, `b`, and `tenant` among them for series a
// worker labels by tenant only with --tenant-labels.
func metricsTable(t *testing.T) map[string]tableRow {
	t.Helper()
	raw, err := os.ReadFile(root + "/docs/metrics.md")
	require.NoError(t, err)
	out := map[string]tableRow{}
	label := regexp.MustCompile("`([a-z_]+)`")
	for _, line := range strings.Split(string(raw), "\n") {
		m := tableLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		require.NotContains(t, out, m[1], "docs/metrics.md: %s twice", m[1])
		row := tableRow{typ: m[2], labels: []string{}}
		for _, l := range label.FindAllStringSubmatch(m[3], -1) {
			row.labels = append(row.labels, l[1])
		}
		sort.Strings(row.labels)
		out[m[1]] = row
	}
	require.Greater(t, len(out), 20, "docs/metrics.md has its table")
	return out
}

func recorded(rules []expr, name string) bool {
	for _, r := range rules {
		if r.record == name {
			return true
		}
	}
	return false
}

func (e expr) String() string { return fmt.Sprintf("%s: %s", e.where, e.expr) }
