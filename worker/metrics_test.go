package worker_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/worker"
)

// series returns the label sets of name's series.
func series(t *testing.T, g prometheus.Gatherer, name string) []map[string]string {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	var out []map[string]string
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, labels)
		}
	}
	return out
}

// TestMetricsStartAtZero: a worker exports its labelled series at zero for
// their known label values before anything happens, so that rate() and
// increase() see the first event; sluice_build_info names the versions.
func TestMetricsStartAtZero(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	srv := e.server(t, nil)
	g := srv.Gate().Gatherer()
	for _, tt := range []struct {
		name   string
		labels map[string]string
	}{
		{"sluice_worker_decisions_total", map[string]string{"verdict": "allowed", "rule": "", "scope": ""}},
		{"sluice_worker_decisions_total", map[string]string{"verdict": "denied", "rule": "concurrency", "scope": "tenant"}},
		{"sluice_worker_decisions_total", map[string]string{"verdict": "denied", "rule": "rate[0]", "scope": "@global"}},
		{"sluice_worker_decisions_total", map[string]string{"verdict": "denied", "rule": "quota", "scope": "key"}},
		{"sluice_worker_deferrals_total", map[string]string{"reason": "unavailable"}},
		{"sluice_worker_handler_outcomes_total", map[string]string{"outcome": "panic"}},
		{"sluice_worker_errors_total", map[string]string{"kind": "redis"}},
		{"sluice_worker_errors_total", map[string]string{"kind": "room"}},
		{"sluice_worker_lease_renewals_total", map[string]string{"result": "lost"}},
		{"sluice_worker_tickets_total", map[string]string{"result": "asked"}},
		{"sluice_worker_settled_cost_total", map[string]string{"direction": "extra"}},
		{"sluice_worker_recovered_total", map[string]string{"reason": "dead_worker"}},
		{"sluice_downstream_signals_total", map[string]string{"kind": "retry_after", "result": "read"}},
		{"sluice_downstream_actions_total", map[string]string{"action": "paused"}},
		{"sluice_downstream_adaptations_total", map[string]string{"reason": "throttled"}},
	} {
		require.Contains(t, series(t, g, tt.name), tt.labels, "%s%v", tt.name, tt.labels)
		require.Zero(t, metric(t, g, tt.name, tt.labels), "%s%v", tt.name, tt.labels)
	}
	require.Len(t, series(t, g, "sluice_worker_drops_total"), 1)
	build := series(t, g, "sluice_build_info")
	require.Len(t, build, 1)
	require.Equal(t, runtime.Version(), build[0]["goversion"])
	require.Contains(t, build[0], "asynq_version", "a test binary carries no module versions: the worker binary's test reads them")
	require.NotEmpty(t, build[0]["version"])
	require.Equal(t, 1.0, metric(t, g, "sluice_build_info", nil))
}

// TestMetricsOfATenantStartAtZeroOnceKnown: with tenant labels, a tenant's
// series appear (at zero but for what happened) with its first job, not
// before; a denial names the scope of the policy whose rule denied.
func TestMetricsOfATenantStartAtZeroOnceKnown(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.policy(t, "@global", "rate=1/min")
	srv := e.server(t, func(c *worker.Config) { c.Gate.TenantLabels = true })
	srv.Handle("job", newRecorder(0))
	g := srv.Gate().Gatherer()
	require.Empty(t, series(t, g, "sluice_worker_handler_outcomes_total"), "no tenant known yet")
	require.NoError(t, srv.Start())
	e.enqueueDirect(t, "acme", 2, "")
	eventually(t, 10*time.Second, func() bool {
		return metric(t, g, "sluice_worker_decisions_total", map[string]string{"tenant": "acme", "verdict": "denied", "rule": "rate[0]", "scope": "@global"}) >= 1
	}, "acme's second job denied by @global's rate")
	require.Equal(t, 1.0, metric(t, g, "sluice_worker_handler_outcomes_total", map[string]string{"tenant": "acme", "outcome": "success"}))
	require.Contains(t, series(t, g, "sluice_worker_handler_outcomes_total"), map[string]string{"tenant": "acme", "outcome": "panic"})
	require.Contains(t, series(t, g, "sluice_worker_deferrals_total"), map[string]string{"tenant": "acme", "reason": "cooldown"})
	require.Contains(t, series(t, g, "sluice_worker_decisions_total"), map[string]string{"tenant": "acme", "verdict": "denied", "rule": "window", "scope": "tenant"})
}
