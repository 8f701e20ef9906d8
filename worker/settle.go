package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
)

// Settled costs: a job is admitted on its estimated cost (queue.Cost), and
// its handler may report what it actually cost (SettleCost; the http
// handler reads it from the response). When the handler returns, the
// gate settles the difference on every meter the job was charged in
// (throttle.Limiter.Settle): one call, and only for a job whose cost
// differed.

// settlement is what a handler reported of its job's cost.
type settlement struct {
	actual atomic.Int64 // the actual cost + 1; 0: not reported
}

type settleKey struct{}

// SettleCost reports the actual cost of the job whose handler got ctx: the
// tokens an LLM call used, the records a batch call wrote. When the handler
// returns, the gate settles the job's charges from the estimate it was
// admitted on (queue.Cost; 1 by default) to actual: a refund when the job
// was cheaper, an extra charge when it was dearer (possibly into debt: the
// tenant's next start waits until it is paid off). 0 refunds the whole
// estimate. The last report counts; a job that reports nothing keeps its
// estimate (or is refunded, when it fails, with GateConfig.RefundFailed).
//
// It returns an error, and changes nothing, when actual is negative or ctx
// is not that of a handler the gate admitted.
func SettleCost(ctx context.Context, actual int64) error {
	s, ok := ctx.Value(settleKey{}).(*settlement)
	if !ok {
		return errors.New("sluice: SettleCost: ctx is not a job's that the gate admitted: call it from the handler, with the ctx it was given")
	}
	if actual < 0 || actual == math.MaxInt64 {
		return fmt.Errorf("sluice: SettleCost: actual cost %d: must be 0 or more (0 refunds the whole estimate)", actual)
	}
	s.actual.Store(actual + 1)
	return nil
}

// settle settles the job's cost once its handler returned (failed: with
// an error, or a panic): to what the handler reported, or to 0 when it
// failed without reporting and the gate refunds failed jobs. A job whose
// cost is its estimate, or that ran without a decision (fail-open), makes
// no call.
func (g *Gate) settle(ctx context.Context, j *job, a *Admission, s *settlement, failed bool) {
	actual := s.actual.Load() - 1
	if actual < 0 {
		if !failed || !g.cfg.RefundFailed {
			return
		}
		actual = 0
	}
	if actual == j.cost || a.FailOpen {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
	defer cancel()
	err := g.lim.Settle(cctx, j.request(g.path), a.Decision, actual)
	if err != nil {
		g.m.err(errSettle)
		g.warn(errSettle, "cost not settled; estimate stays charged", "task", j.taskID, "tenant", j.tenant, "estimate", j.cost, "actual", actual, "err", err)
		return
	}
	if actual < j.cost {
		g.m.settled.WithLabelValues(g.m.labels(j.tenant, settleRefund)...).Add(float64(j.cost - actual))
	} else {
		g.m.settled.WithLabelValues(g.m.labels(j.tenant, settleExtra)...).Add(float64(actual - j.cost))
	}
}

// usage reads an actual cost from a response's value (a header's, or a
// JSON field's) and reports it; a value that is not a whole number of at
// least 0 changes nothing and is counted (sluice_worker_errors_total
// {kind="usage"}) and logged the first time.
func usage(ctx context.Context, value any, from string) {
	var n int64
	ok := false
	switch v := value.(type) {
	case string:
		var err error
		n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		ok = err == nil
	case json.Number:
		var err error
		n, err = v.Int64()
		ok = err == nil
	}
	if ok && SettleCost(ctx, n) == nil {
		return
	}
	g, isGate := ctx.Value(gateKey{}).(*Gate)
	if !isGate {
		return
	}
	g.m.err(errUsage)
	if g.usageLogged.CompareAndSwap(false, true) {
		id, _ := AdmissionFrom(ctx)
		g.log.Warn("usage not a whole number; estimate kept",
			"from", from, "value", fmt.Sprint(value), "tenant", id.Tenant)
	}
}

// jsonField is the value at path (dot-separated object keys, e.g.
// "usage.total_tokens") of a JSON document; nil when it is not there.
func jsonField(body []byte, path string) any {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil
	}
	for _, k := range strings.Split(path, ".") {
		m, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		doc = m[k]
	}
	return doc
}
