package worker

import (
	"runtime"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/throttle"
)

// Metric label values.
const (
	verdictAllowed  = "allowed"
	verdictDenied   = "denied"
	verdictFailOpen = "fail_open"

	renewOK    = "ok"
	renewLost  = "lost"
	renewError = "error"

	ticketRedeemed = "redeemed"
	ticketAsked    = "asked"
	ticketReserved = "reserved"

	errRedis       = "redis"
	errCost        = "cost"
	errTenant      = "tenant_header"
	errNoTenant    = "no_tenant"
	errPolicy      = "policy"
	errCostHeader  = "cost_header"
	errPoolsHeader = "pools_header"
	errKeyHeader   = "key_header"
	errIDHeader    = "id_header"
	errCopy        = "copy"
	errRelease     = "release"
	errCooldown    = "cooldown"
	errRoom        = "room"
	errShadow      = "shadow"
	errSettle      = "settle"
	errBlock       = "block"
	errUsage       = "usage"

	settleRefund = "refund"
	settleExtra  = "extra"

	outcomeSuccess  = "success"
	outcomeError    = "error"
	outcomeSkip     = "skip_retry"
	outcomeRevoke   = "revoke"
	outcomePanic    = "panic"
	outcomeCooldown = "cooldown"

	scopeTenant = "tenant"
	scopeKey    = "key"
)

// The label values each labelled series starts at zero with, so that rate()
// and increase() see a series' first event and alerts on them do not wait
// for a second one. Rules: the denying rules of every policy (a policy's
// second and later rates, rate[1]…, appear when they first deny).
var (
	deniedRules   = []string{"rate[0]", "window", "quota", "concurrency", "cooldown", "reserved"}
	deniedScopes  = []string{scopeTenant, scopeKey, throttle.GlobalPolicy}
	deferReasons  = []string{ReasonThrottled, ReasonCooldown, ReasonUnavailable, ReasonCost, ReasonPolicy, ReasonShutdown}
	outcomeValues = []string{outcomeSuccess, outcomeError, outcomeSkip, outcomeRevoke, outcomePanic, outcomeCooldown}
	errorKinds    = []string{errRedis, errPolicy, errCost, errTenant, errNoTenant, errCostHeader, errPoolsHeader, errKeyHeader, errIDHeader, errCopy, errRelease, errCooldown, errRoom, errShadow, errSettle, errBlock, errUsage, errRecover, errLayout, errDownstream, errForward}
	renewResults  = []string{renewOK, renewLost, renewError}
	ticketResults = []string{ticketRedeemed, ticketAsked, ticketReserved}
	settleDirs    = []string{settleRefund, settleExtra}
)

// scopeOf is the scope label of a denial by the rule of policy: a pool's
// or @global's name, "key" for a key's policy (acme/user-42, acme/*), else
// "tenant" (the tenant's own policy or the default, *).
func scopeOf(policy string) string {
	switch {
	case strings.HasPrefix(policy, "@"):
		return policy
	case strings.Contains(policy, "/"):
		return scopeKey
	}
	return scopeTenant
}

// metrics are the gate's Prometheus metrics. The per-job ones get a tenant
// label only when GateConfig.TenantLabels is set.
type metrics struct {
	tenants bool
	// known are the tenants whose labelled series were set to zero
	known     sync.Map
	decisions *prometheus.CounterVec
	deferrals *prometheus.CounterVec
	drops     *prometheus.CounterVec
	wait      prometheus.Histogram
	inFlight  *prometheus.GaugeVec
	renewals  *prometheus.CounterVec
	tickets   *prometheus.CounterVec
	blocks    prometheus.Counter
	errors    *prometheus.CounterVec
	outcomes  *prometheus.CounterVec
	// unknownTypes counts the jobs of types no handler takes (Server only).
	unknownTypes *prometheus.CounterVec
	// shadows counts the decisions of tenants' shadow policies, always
	// by tenant: only tenants with a shadow have any.
	shadows *prometheus.CounterVec
	// settled counts the cost settled after jobs ran, by direction
	settled *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, tenants bool) (*metrics, error) {
	withTenant := func(labels ...string) []string {
		if tenants {
			return append(labels, "tenant")
		}
		return labels
	}
	m := &metrics{
		tenants: tenants,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_decisions_total",
			Help: "Admission decisions of the gate, by verdict (allowed, denied, fail_open), the rule that denied and the scope of its policy (tenant, key, @global or a shared pool's name).",
		}, withTenant("verdict", "rule", "scope")),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_deferrals_total",
			Help: "Jobs handed back to asynq to run later, by reason (throttled, cooldown, unavailable, cost, policy, shutdown).",
		}, withTenant("reason")),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_drops_total",
			Help: "Jobs archived because their policy drops denied jobs (overflow=drop).",
		}, withTenant()),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_worker_wait_seconds",
			Help:    "Time a job waited in the worker for its slot, per delivery.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2.5, 5, 10},
		}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_worker_in_flight",
			Help: "Jobs admitted by the gate whose handler is running.",
		}, withTenant()),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_lease_renewals_total",
			Help: "Concurrency lease renewals, by result (ok; lost: the lease had run out and the slot may be another job's; error).",
		}, []string{"result"}),
		tickets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_tickets_total",
			Help: "Jobs that came with the decision the waiting room made for them, by result (redeemed: started on it with no further decision; asked: decided anew, the job being late for its slot, retried or its slot gone; reserved: a reservation, decided by the gate at its slot).",
		}, []string{"result"}),
		blocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_worker_block_starts_total",
			Help: "Jobs started from a block of their tenant's starts and slots, with no call to Redis of their own (a tenant far from its limits).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_errors_total",
			Help: "Errors of the gate, by kind (redis, policy, cost, tenant_header, no_tenant, cost_header, pools_header, id_header, copy, release, cooldown, room, shadow, settle, usage: a response's usage unreadable, recover, asynq_layout: the waiting room is off, downstream, block: a block could not be taken, renewed or given back).",
		}, []string{"kind"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_handler_outcomes_total",
			Help: "Outcomes of the handlers the gate admitted (success, error, skip_retry, revoke, panic, cooldown).",
		}, withTenant("outcome")),
		unknownTypes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_unknown_types_total",
			Help: "Jobs of a type no handler of the worker is registered for (archived at once unless RetryUnknownTypes), by type; past 100 types, as (other).",
		}, []string{"type"}),
		shadows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_shadow_decisions_total",
			Help: "Decisions of tenants' shadow policies on the jobs this worker started, by tenant, verdict (allowed, denied: the shadow would have held the job back) and the rule that denied; nothing is held back.",
		}, []string{"tenant", "verdict", "rule"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_settled_cost_total",
			Help: "Cost settled after jobs ran (worker.SettleCost, the http handler's usage), by direction: refund (jobs cheaper than their estimate) or extra (dearer).",
		}, withTenant("direction")),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1: the versions of sluice, Go and asynq this worker was built with.",
	}, []string{"version", "goversion", "asynq_version"})
	build.WithLabelValues(buildinfo.Sluice(), runtime.Version(), buildinfo.Asynq()).Set(1)
	for _, c := range []prometheus.Collector{build, m.decisions, m.deferrals, m.drops, m.wait, m.inFlight, m.renewals, m.tickets, m.blocks, m.errors, m.outcomes, m.unknownTypes, m.shadows, m.settled} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, v := range renewResults {
		m.renewals.WithLabelValues(v)
	}
	for _, v := range ticketResults {
		m.tickets.WithLabelValues(v)
	}
	for _, v := range errorKinds {
		m.errors.WithLabelValues(v)
	}
	if !tenants {
		m.zero("")
	}
	return m, nil
}

// zero sets the series of tenant (of every tenant when the metrics have
// no tenant label) at zero for their known label values, once.
func (m *metrics) zero(tenant string) {
	if _, seen := m.known.LoadOrStore(tenant, true); seen {
		return
	}
	m.decisions.WithLabelValues(m.labels(tenant, verdictAllowed, "", "")...)
	m.decisions.WithLabelValues(m.labels(tenant, verdictFailOpen, "", "")...)
	scopes := deniedScopes
	if m.tenants {
		// a tenant's own rules; its keys' and @global's denials appear
		// with their first, to keep a tenant's series few
		scopes = []string{scopeTenant}
	}
	for _, rule := range deniedRules {
		for _, scope := range scopes {
			m.decisions.WithLabelValues(m.labels(tenant, verdictDenied, rule, scope)...)
		}
	}
	for _, v := range deferReasons {
		m.deferrals.WithLabelValues(m.labels(tenant, v)...)
	}
	for _, v := range outcomeValues {
		m.outcomes.WithLabelValues(m.labels(tenant, v)...)
	}
	for _, v := range settleDirs {
		m.settled.WithLabelValues(m.labels(tenant, v)...)
	}
	m.drops.WithLabelValues(m.labels(tenant)...)
	m.inFlight.WithLabelValues(m.labels(tenant)...)
}

func (m *metrics) labels(tenant string, values ...string) []string {
	if m.tenants {
		m.zero(tenant)
		return append(values, tenant)
	}
	return values
}

// decision counts a verdict; policy names the policy of the rule that
// denied ("" when allowed).
func (m *metrics) decision(tenant, verdict, rule, policy string) {
	scope := ""
	if verdict == verdictDenied {
		scope = scopeOf(policy)
	}
	m.decisions.WithLabelValues(m.labels(tenant, verdict, rule, scope)...).Inc()
}

func (m *metrics) deferral(tenant, reason string) {
	m.deferrals.WithLabelValues(m.labels(tenant, reason)...).Inc()
}

func (m *metrics) drop(tenant string) { m.drops.WithLabelValues(m.labels(tenant)...).Inc() }

func (m *metrics) outcome(tenant, outcome string) {
	m.outcomes.WithLabelValues(m.labels(tenant, outcome)...).Inc()
}

func (m *metrics) running(tenant string) prometheus.Gauge {
	return m.inFlight.WithLabelValues(m.labels(tenant)...)
}

func (m *metrics) err(kind string) { m.errors.WithLabelValues(kind).Inc() }
