package worker

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/throttle"
)

// Acting on downstream signals for the whole fleet: a response that says
// its quota is used up (remaining 0 with a reset) pauses the job's tenant
// until the reset (throttle.Limiter.Cooldown), and one that declares a
// limit below the tenant's policy lowers the tenant's rate until it lapses
// (throttle.Limiter.Learn). Both are shared by every worker at once.

// Observe reads the rate-limit signals of resp (ParseSignal) and acts on
// them for the tenant of the job whose handler got ctx, fleet-wide:
//
//   - remaining 0 with a reset (a 2xx included): the tenant pauses until the
//     reset (at most RetryAfterMax), as a RetryAfter does;
//   - a declared limit with its window (RateLimit-Policy, or RateLimit-Limit
//     with w=) below the tenant's policy: every worker holds the tenant to
//     it until it lapses (throttle.LearnedLimit), unless the policy says
//     learn=false; a declared limit not below the policy clears one learned
//     before.
//
// A 429 or 503 is still the handler's to answer: return RetryAfter with
// the delay the signal gives (RetryDelay). Outside a job run by a sluice
// gate Observe only parses. Errors are counted and logged, not returned:
// the response has been received whatever sluice could record of it.
func Observe(ctx context.Context, resp *http.Response) Signal {
	sig := ParseResponse(resp)
	from := fmt.Sprint(resp.StatusCode)
	if req := resp.Request; req != nil && req.URL != nil {
		from += " from " + req.Method + " " + req.URL.Host + req.URL.Path
	}
	observe(ctx, sig, from)
	return sig
}

// ObserveHeader is Observe for a response given as its status and header.
func ObserveHeader(ctx context.Context, status int, h http.Header) Signal {
	sig := ParseSignal(status, h, time.Now())
	observe(ctx, sig, fmt.Sprint(status))
	return sig
}

// RetryDelay is how long a job whose downstream answered sig (a 429 or a
// 503) should wait: its Retry-After, else its reset when its quota is used
// up, else RetryAfterDefault; at most RetryAfterMax.
func (s Signal) RetryDelay() time.Duration {
	d := RetryAfterDefault
	switch {
	case s.RetryAfter > 0:
		d = s.RetryAfter
	case s.Exhausted():
		d = s.Reset
	}
	return min(d, RetryAfterMax)
}

type gateKey struct{}

func observe(ctx context.Context, sig Signal, from string) {
	g, ok := ctx.Value(gateKey{}).(*Gate)
	if !ok || g.down == nil {
		return
	}
	a, _ := AdmissionFrom(ctx)
	if id, ok := asynq.GetTaskID(ctx); ok {
		from += ", task " + id
	}
	g.down.act(ctx, g, a.Tenant, sig, from)
}

// downstream is a gate's part in acting on signals: its metrics, and what
// it paused, so that a run of responses saying the same thing costs one
// call.
type downstream struct {
	tenants bool
	signals *prometheus.CounterVec
	actions *prometheus.CounterVec
	limits  *prometheus.GaugeVec // per tenant, with tenant labels
	count   prometheus.Gauge

	mu      sync.Mutex
	paused  map[string]time.Time // tenant -> end of the pause this worker set
	learned map[string]time.Time // tenant -> when what this worker learned lapses

	// adaptive limits (adapt.go)
	adapt       adapter
	reports     *prometheus.CounterVec
	adaptations *prometheus.CounterVec
	adapted     *prometheus.GaugeVec // per tenant, with tenant labels
}

// Downstream actions, the action label of sluice_downstream_actions_total
// (with throttle.LearnOutcome's values).
const (
	actionPaused = "paused"
	actionFailed = "error"
)

const errDownstream = "downstream"

func newDownstream(reg prometheus.Registerer, tenants bool) (*downstream, error) {
	var labels []string
	if tenants {
		labels = []string{"tenant"}
	}
	d := &downstream{
		tenants: tenants,
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_downstream_signals_total",
			Help: "Rate-limit headers read from downstream responses, by kind (retry_after, ratelimit, ratelimit_draft, x_ratelimit, vendor_ratelimit) and result (read, malformed: the value was ignored).",
		}, []string{"kind", "result"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_downstream_actions_total",
			Help: "What downstream signals made this worker do: paused (remaining 0 until the reset), learned, kept, cleared, not_lower, pinned (declared limits), error.",
		}, append([]string{"action"}, labels...)),
		limits: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_downstream_learned_limit",
			Help: "The rate (per second) a learned limit holds the tenant to, as this worker learned it; 0 once it lapsed or was cleared.",
		}, labels),
		count: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_downstream_learned_tenants",
			Help: "Tenants held to a limit this worker learned from their downstream, not lapsed yet.",
		}),
		paused:  map[string]time.Time{},
		learned: map[string]time.Time{},
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_downstream_adapt_reports_total",
			Help: "Reports of what a tenant's downstream answered sent to its adaptive limit (at most one per tenant and interval), by result (ok, error).",
		}, []string{"result"}),
		adaptations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_downstream_adaptations_total",
			Help: "Changes of adaptive limits this worker's reports made, by reason (increase; throttled, latency: decreases; start, policy).",
		}, append([]string{"reason"}, labels...)),
		adapted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_downstream_adapted_limit",
			Help: "The rate (per second) the tenant's adaptive limit holds it to, as of this worker's last report.",
		}, labels),
	}
	cs := []prometheus.Collector{d.signals, d.actions, d.count, d.reports, d.adaptations}
	if tenants {
		cs = append(cs, d.limits, d.adapted)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, k := range []string{signalRetryAfter, signalIETF, signalDraft, signalX, signalVendor} {
		for _, r := range []string{"read", "malformed"} {
			d.signals.WithLabelValues(k, r)
		}
	}
	for _, r := range []string{"ok", actionFailed} {
		d.reports.WithLabelValues(r)
	}
	if !tenants {
		for _, a := range []string{actionPaused, string(throttle.LearnStored), string(throttle.LearnKept), string(throttle.LearnCleared), string(throttle.LearnNotLower), string(throttle.LearnPinned), actionFailed} {
			d.actions.WithLabelValues(a)
		}
		for _, r := range []string{"start", "policy", "increase", "throttled", "latency"} {
			d.adaptations.WithLabelValues(r)
		}
	}
	return d, nil
}

func (d *downstream) action(tenant, action string) {
	if d.tenants {
		d.actions.WithLabelValues(action, tenant).Inc()
		return
	}
	d.actions.WithLabelValues(action).Inc()
}

// maxRemembered bounds the per-tenant memories; past it they start afresh.
const maxRemembered = 10_000

func (d *downstream) act(ctx context.Context, g *Gate, tenant string, sig Signal, from string) {
	for _, k := range sig.read {
		d.signals.WithLabelValues(k, "read").Inc()
	}
	for _, k := range sig.bad {
		d.signals.WithLabelValues(k, "malformed").Inc()
	}
	if len(sig.Malformed) > 0 {
		g.warn("downstream_malformed", "rate-limit header ignored", "tenant", tenant, "response", from, "malformed", sig.Malformed)
	}
	if tenant == "" {
		return
	}
	now := time.Now()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
	defer cancel()
	if sig.Exhausted() {
		pause := min(sig.Reset, RetryAfterMax)
		until := now.Add(pause)
		d.mu.Lock()
		known := d.paused[tenant]
		if len(d.paused) > maxRemembered {
			d.paused = map[string]time.Time{}
		}
		// a pause this worker set that ends as late (to a few ms) stands
		fresh := until.Sub(known) > 5*time.Millisecond
		if fresh {
			d.paused[tenant] = until
		}
		d.mu.Unlock()
		if fresh && pause >= time.Millisecond {
			if _, err := g.lim.Cooldown(cctx, tenant, pause); err != nil {
				d.fail(g, tenant, err)
			} else {
				d.action(tenant, actionPaused)
			}
		}
	}
	if !sig.HasLimit() {
		return
	}
	out, err := g.lim.Learn(cctx, tenant, throttle.LearnedLimit{Limit: sig.Limit, Window: sig.Window, Source: sig.LimitFrom, From: from})
	if err != nil {
		d.fail(g, tenant, err)
		return
	}
	d.action(tenant, string(out))
	d.mu.Lock()
	defer d.mu.Unlock()
	switch out {
	case throttle.LearnStored:
		if len(d.learned) > maxRemembered {
			d.learned = map[string]time.Time{}
		}
		d.learned[tenant] = now.Add(min(max(sig.Window, throttle.LearnHoldDefault), throttle.LearnHoldMax))
		if d.tenants {
			d.limits.WithLabelValues(tenant).Set(float64(sig.Limit) / sig.Window.Seconds())
		}
	case throttle.LearnCleared:
		delete(d.learned, tenant)
		if d.tenants {
			d.limits.WithLabelValues(tenant).Set(0)
		}
	}
	n := 0
	for t, until := range d.learned {
		if now.Before(until) {
			n++
			continue
		}
		delete(d.learned, t)
		if d.tenants {
			d.limits.WithLabelValues(t).Set(0)
		}
	}
	d.count.Set(float64(n))
}

func (d *downstream) fail(g *Gate, tenant string, err error) {
	d.action(tenant, actionFailed)
	g.m.err(errDownstream)
	g.warn(errDownstream, "cannot act on rate-limit signal", "tenant", tenant, "err", err)
}
