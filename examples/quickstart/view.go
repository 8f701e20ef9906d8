package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// view is the live per-tenant progress display.
type view struct {
	out   io.Writer
	live  bool
	specs []tenantSpec
	api   *api
	lim   *throttle.Limiter
	start time.Time
	drawn int // lines drawn last time (live)
}

func (v *view) header(where, url string) {
	fmt.Fprintf(v.out, "sluice quickstart: %d workers share each tenant's limits through %s.\n", workers, where)
	fmt.Fprintf(v.out, "A fake API at %s enforces the same limits itself\n", url)
	fmt.Fprintf(v.out, "(forgiving network jitter: %s on a rate, a tenth of a window) and answers\n", jitterAllowance)
	fmt.Fprintf(v.out, "429 to any request over them. Jobs arrive in bursts.\n\n")
}

// draw shows one line per tenant: jobs done, the rate of the last second,
// running requests, jobs waiting (queued or deferred to their slots) and
// the API's rejections.
func (v *view) draw(ctx context.Context, enqueued map[string]int) {
	var b strings.Builder
	fmt.Fprintf(&b, "t=%4.1fs\n", time.Since(v.start).Seconds())
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, t := range v.specs {
		a := v.api.view(t.name)
		reserved := "-"
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		if st, err := v.lim.Stats(cctx, t.name); err == nil {
			reserved = fmt.Sprint(st.Reservations)
		}
		cancel()
		running := fmt.Sprint(a.running)
		if t.policy.Concurrency != nil {
			running += fmt.Sprintf("/%d", t.policy.Concurrency.Limit)
		}
		fmt.Fprintf(tw, "  %s\t%s\tdone %d/%d\t%d/s\trunning %s\twaiting %d (%s with a reserved slot)\t429s %d\n",
			t.name, t.policyText, a.done, t.jobs(), a.lastSecond, running, max(enqueued[t.name]-a.done, 0), reserved, a.rejected)
	}
	_ = tw.Flush()
	text := b.String()
	if v.live {
		if v.drawn > 0 {
			fmt.Fprintf(v.out, "\x1b[%dA", v.drawn)
		}
		text = strings.ReplaceAll(text, "\n", "\x1b[K\n")
		v.drawn = strings.Count(text, "\n")
	}
	fmt.Fprint(v.out, text)
}

// final ends the live display.
func (v *view) final() { fmt.Fprintln(v.out) }

// Tolerances of the report's expectations: rateLow and rateHigh bound a
// rate-limited tenant's achieved rate, as a fraction of its limit: sluice
// should neither exceed the limit nor waste much of it. A machine too busy
// to keep up may be given a lower rateLow (options.rateLow).
const (
	rateLowDefault = 0.8
	rateHigh       = 1.05
)

// tenantResult is one tenant's line of the report.
type tenantResult struct {
	name, policy string
	jobs         int // the producer's
	enqueued     int
	done         int
	lost         int
	waiting      int // still queued or deferred at the end
	duplicates   int
	rejected     int
	peak         int64
	cap          int64   // 0: no concurrency cap
	rate         float64 // achieved starts/s over the busy period
	rateLimit    float64 // 0: no rate rule
	maxInWindow  int
	window       *throttle.Window
	failures     []string
}

func tenantReport(t tenantSpec, a tenantView, enqueued int, queued [2]int, rateLow float64) tenantResult {
	r := tenantResult{
		name: t.name, policy: t.policyText, jobs: t.jobs(), enqueued: enqueued, done: a.done,
		waiting: queued[0], duplicates: a.duplicates, rejected: a.rejected, peak: a.peak,
		maxInWindow: a.maxInWin, window: t.policy.Window,
	}
	r.lost = max(enqueued-a.done-queued[0], 0)
	if c := t.policy.Concurrency; c != nil {
		r.cap = c.Limit
	}
	burst := 0
	if len(t.policy.Rates) > 0 {
		rt := t.policy.Rates[0]
		r.rateLimit = float64(rt.Limit) / rt.Period.Seconds()
		burst = int(max(rt.Burst, 1))
	}
	if span := a.last.Sub(a.first).Seconds(); span > 0 && a.accepted > burst {
		// The first burst starts at once; the rest come at the rate.
		r.rate = float64(a.accepted-burst) / span
	}
	fail := func(format string, args ...any) {
		r.failures = append(r.failures, t.name+": "+fmt.Sprintf(format, args...))
	}
	if r.enqueued != r.jobs {
		fail("%d of %d jobs enqueued", r.enqueued, r.jobs)
	}
	if r.rejected > 0 {
		fail("the API rejected %d requests (429)", r.rejected)
	}
	if r.lost > 0 {
		fail("%d jobs lost (%d archived)", r.lost, queued[1])
	}
	if r.done < r.enqueued {
		fail("%d jobs not done before the deadline (%d still queued)", r.enqueued-r.done, r.waiting)
	}
	if r.cap > 0 && r.peak > r.cap {
		fail("%d requests ran at once, over the cap of %d", r.peak, r.cap)
	}
	if r.rateLimit > 0 && (r.rate < rateLow*r.rateLimit || r.rate > rateHigh*r.rateLimit) {
		fail("achieved %.1f/s, outside %.0f%%–%.0f%% of the limit %.0f/s", r.rate, rateLow*100, rateHigh*100, r.rateLimit)
	}
	if w := r.window; w != nil && int64(r.maxInWindow) > w.Limit {
		fail("%d requests in one %s window, over the limit of %d", r.maxInWindow, w.Period, w.Limit)
	}
	return r
}

// report is the closing report of a run.
type report struct {
	where    string
	elapsed  time.Duration
	short    bool
	rateLow  float64
	tenants  []tenantResult
	failures []string
}

// ok reports whether every expectation held.
func (r *report) ok() bool { return len(r.allFailures()) == 0 }

func (r *report) allFailures() []string {
	out := append([]string(nil), r.failures...)
	for _, t := range r.tenants {
		out = append(out, t.failures...)
	}
	return out
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "Report after %.1fs:\n", r.elapsed.Seconds())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TENANT\tPOLICY\tJOBS\tDONE\tLOST\t429s\tACHIEVED\tPEAK RUNNING")
	for _, t := range r.tenants {
		achieved := ""
		switch {
		case t.rateLimit > 0:
			achieved = fmt.Sprintf("%.1f/s (limit %.0f/s)", t.rate, t.rateLimit)
		case t.window != nil:
			achieved = fmt.Sprintf("at most %d in %s (limit %d)", t.maxInWindow, t.window.Period, t.window.Limit)
		default:
			achieved = fmt.Sprintf("%.1f/s (no rate limit)", t.rate)
		}
		peak := fmt.Sprintf("%d (no cap)", t.peak)
		if t.cap > 0 {
			peak = fmt.Sprintf("%d (cap %d)", t.peak, t.cap)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", t.name, t.policy, t.jobs, t.done, t.lost, t.rejected, achieved, peak)
	}
	_ = tw.Flush()
	for _, t := range r.tenants {
		if t.duplicates > 0 {
			fmt.Fprintf(w, "  (%s: %d jobs reached the API twice: asynq delivers at least once)\n", t.name, t.duplicates)
		}
	}
	fmt.Fprintln(w)
	if f := r.allFailures(); len(f) > 0 {
		fmt.Fprintln(w, "EXPECTATIONS FAILED:")
		for _, s := range f {
			fmt.Fprintln(w, "  - "+s)
		}
		return
	}
	fmt.Fprintln(w, "All expectations met: every job done, none lost, no request rejected by the API,")
	fmt.Fprintln(w, "every tenant held to its limits across the three workers, and each limit used")
	fmt.Fprintf(w, "(a rate-limited tenant got at least %.0f%% of its rate).\n", r.rateLow*100)
}
