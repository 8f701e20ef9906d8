package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// Adaptive limits, the worker's part: for each tenant whose policy has an
// adaptive rule (throttle.AdaptRule), the gate counts what its handlers'
// downstream answered — good (the handler returned nil), throttled (it
// returned RetryAfter: a 429 or 503), slow (good, but longer than the
// rule's adapt_latency) — and reports the counts to the fleet's rule
// (throttle.Limiter.Adapt) at most once per the rule's interval: one
// round trip per tenant and worker per interval, whatever the rate of
// jobs. Other errors of a handler count as neither.

// tally is what one tenant's downstream answered since the last report.
type tally struct {
	ok, throttled, slow int64
	seq                 int64 // the highest state the throttled and slow answers were sent under
	every, period       time.Duration
	last                time.Time // when the last report was sent
	timer               *time.Timer
	sending             bool
}

func (t *tally) empty() bool { return t.ok == 0 && t.throttled == 0 && t.slow == 0 }

// adapter holds the tallies of a gate's tenants.
type adapter struct {
	mu      sync.Mutex
	tallies map[string]*tally
	stopped bool
	wg      sync.WaitGroup
}

// adapts reports whether the job's policy has an adaptive rule.
func (j *job) adapts() bool {
	return j.tenant != "" && j.policies != nil && j.policies.Adaptive != nil && j.policies.Policy != nil && j.policies.Policy.Adapt != nil
}

// record counts the outcome of an admitted job whose handler returned err
// after took, and sends the tenant's report when its interval has passed
// (or sets a timer for when it will).
func (d *downstream) record(g *Gate, j *job, err error, took time.Duration) {
	if !j.adapts() {
		return
	}
	var ra *RetryAfterError
	throttled := errors.As(err, &ra)
	if err != nil && !throttled {
		return
	}
	al, target := j.policies.Adaptive, j.policies.Policy.Adapt.Latency
	a := &d.adapt
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	t := a.tallies[j.tenant]
	if t == nil {
		if a.tallies == nil || len(a.tallies) > maxRemembered {
			a.forgetIdle()
		}
		t = &tally{}
		a.tallies[j.tenant] = t
	}
	switch {
	case throttled:
		t.throttled++
		t.seq = max(t.seq, al.Seq)
	case target > 0 && took > target:
		t.slow++
		t.seq = max(t.seq, al.Seq)
	default:
		t.ok++
	}
	t.every, t.period = al.Every, al.Rate.Period
	d.schedule(g, j.tenant, t)
}

// forgetIdle drops the tallies with nothing to report and no report
// under way (their tenants' next report goes out at once); called with
// mu held.
func (a *adapter) forgetIdle() {
	if a.tallies == nil {
		a.tallies = map[string]*tally{}
		return
	}
	for tenant, t := range a.tallies {
		if t.empty() && t.timer == nil && !t.sending {
			delete(a.tallies, tenant)
		}
	}
}

// schedule sends t's report now when its interval has passed, else sets a
// timer for then; called with mu held.
func (d *downstream) schedule(g *Gate, tenant string, t *tally) {
	if t.sending || t.timer != nil || t.empty() {
		return
	}
	wait := time.Until(t.last.Add(t.every))
	if wait > 0 {
		t.timer = time.AfterFunc(wait, func() {
			a := &d.adapt
			a.mu.Lock()
			defer a.mu.Unlock()
			t.timer = nil
			if !a.stopped {
				d.schedule(g, tenant, t)
			}
		})
		return
	}
	rep := throttle.AdaptReport{OK: t.ok, Throttled: t.throttled, Slow: t.slow, Seq: t.seq}
	t.ok, t.throttled, t.slow, t.seq = 0, 0, 0, 0
	t.sending, t.last = true, time.Now()
	d.adapt.wg.Add(1)
	go func() {
		defer d.adapt.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.CallTimeout)
		c, err := g.lim.Adapt(ctx, tenant, rep)
		cancel()
		d.reported(g, tenant, t.period, c, err)
		a := &d.adapt
		a.mu.Lock()
		defer a.mu.Unlock()
		t.sending = false
		if err != nil {
			// nothing is lost: the counts go with the next report
			t.ok, t.throttled, t.slow = t.ok+rep.OK, t.throttled+rep.Throttled, t.slow+rep.Slow
			t.seq = max(t.seq, rep.Seq)
		}
		if !a.stopped {
			d.schedule(g, tenant, t)
		}
	}()
}

// reported records a report's result in the metrics.
func (d *downstream) reported(g *Gate, tenant string, period time.Duration, c throttle.AdaptChange, err error) {
	if err != nil {
		d.reports.WithLabelValues(actionFailed).Inc()
		d.fail(g, tenant, err)
		return
	}
	d.reports.WithLabelValues("ok").Inc()
	if c.Reason != "" {
		if d.tenants {
			d.adaptations.WithLabelValues(c.Reason, tenant).Inc()
		} else {
			d.adaptations.WithLabelValues(c.Reason).Inc()
		}
	}
	if d.tenants && c.To > 0 {
		d.adapted.WithLabelValues(tenant).Set(float64(c.To) / period.Seconds())
	}
}

// stopAdapting ends the reports: no timer fires and no report starts
// after it; it waits for those under way. Counts not reported yet are
// dropped (a report is advice, not a job).
func (d *downstream) stopAdapting() {
	a := &d.adapt
	a.mu.Lock()
	a.stopped = true
	for _, t := range a.tallies {
		if t.timer != nil {
			t.timer.Stop()
			t.timer = nil
		}
	}
	a.mu.Unlock()
	a.wg.Wait()
}
