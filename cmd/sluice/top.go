package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/throttle"
)

func top(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 0, ""); err != nil {
		return err
	}
	if o.limit < 0 {
		return usagef(c, "--limit %d: must be 0 (as many as fit) or more", o.limit)
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	interval := time.Duration(o.interval)
	outFd, outTTY := terminal(a.stdout)
	switch {
	case o.json && !o.once:
		return topJSON(a.ctx, cn, a.stdout, interval, o.limit)
	case o.once || o.json || !outTTY:
		return topOnce(a.ctx, cn, a.stdout, interval, o.limit, o.json)
	}

	keys := make(chan byte, 8)
	if inFd, inTTY := terminal(a.stdin); inTTY {
		old, err := term.MakeRaw(inFd)
		if err != nil {
			return fmt.Errorf("top: cannot read keys from the terminal: %w", err)
		}
		defer func() { _ = term.Restore(inFd, old) }()
	}
	// The reader ends with the process: a read from a terminal cannot be
	// interrupted portably.
	go readKeys(a.stdin, keys)
	size := func() (int, int) {
		w, h, err := term.GetSize(outFd)
		if err != nil {
			return 80, 24
		}
		return w, h
	}
	fmt.Fprint(a.stdout, "\x1b[?1049h\x1b[?25l") // alternate screen, hide cursor
	defer fmt.Fprint(a.stdout, "\x1b[?25h\x1b[?1049l")
	return topLoop(a.ctx, cn, a.stdout, keys, interval, o.limit, size)
}

// terminal reports whether f is a terminal, and its descriptor.
func terminal(f any) (int, bool) {
	file, ok := f.(*os.File)
	if !ok {
		return 0, false
	}
	fd := int(file.Fd())
	return fd, term.IsTerminal(fd)
}

func readKeys(r io.Reader, keys chan<- byte) {
	buf := make([]byte, 16)
	for {
		n, err := r.Read(buf)
		for _, b := range buf[:n] {
			keys <- b
		}
		if err != nil {
			close(keys)
			return
		}
	}
}

// topSample is one reading of every tenant.
type topSample map[string]*throttle.Stats

func (cn *conn) sample(ctx context.Context) (topSample, error) {
	names, err := cn.tenantNames(ctx)
	if err != nil {
		return nil, err
	}
	all, err := cn.collect(ctx, names)
	if err != nil {
		return nil, err
	}
	s := topSample{}
	for _, st := range all {
		s[st.Tenant] = st
	}
	return s, nil
}

// topRow is one tenant in the view.
type topRow struct {
	tenant   string
	perSec   float64
	limit    string // tightest rate, "-" without one
	learned  bool   // the tightest rate is a limit learned from the downstream
	adaptive bool   // the tightest rate is an adaptive rule
	inFlight int64
	cap      int64 // -1 without a concurrency rule
	reserved int64
	cooldown time.Duration
	waiting  int64
	// waitingText is the jobs waiting in the tenant's line for the table,
	// of its backlog cap when it has one
	waitingText string
	policy      string
	hasPolicy   bool
	// shadow is the tenant's shadow (nil: none), and the rates of its
	// decisions and denials over the interval
	shadow                           *throttle.ShadowStats
	shadowPerSec, shadowDeniedPerSec float64
	// refunded and extra are the cost settled after the tenant's jobs ran
	// (Stats.Refunded, Stats.Extra): totals while its state lives, not
	// rates over the interval
	refunded, extra int64
}

// topRows compares two samples: starts per second come from the growth of
// Stats.Started over the Redis time between them.
func topRows(prev, cur topSample) []topRow {
	rows := make([]topRow, 0, len(cur))
	for name, s := range cur {
		r := topRow{tenant: name, limit: "-", cap: -1, reserved: s.Reservations, waiting: s.Waiting, waitingText: waitingCell(s), policy: policyName(s),
			refunded: s.Refunded, extra: s.Extra}
		started := s.Started
		elapsed := time.Duration(0)
		if p, ok := prev[name]; ok {
			elapsed = s.Now.Sub(p.Now)
			if s.Started >= p.Started {
				started = s.Started - p.Started
			}
		} else {
			for _, p := range prev {
				elapsed = s.Now.Sub(p.Now)
				break
			}
		}
		if elapsed > 0 {
			r.perSec = float64(started) / elapsed.Seconds()
		}
		if r.shadow = s.Shadow; r.shadow != nil && elapsed > 0 {
			decided, denied := r.shadow.Decisions, r.shadow.Denied
			if p, ok := prev[name]; ok && p.Shadow != nil && p.Shadow.Name == r.shadow.Name && decided >= p.Shadow.Decisions {
				decided, denied = decided-p.Shadow.Decisions, denied-p.Shadow.Denied
			}
			r.shadowPerSec, r.shadowDeniedPerSec = float64(decided)/elapsed.Seconds(), float64(denied)/elapsed.Seconds()
		}
		if rt, _, ok := tightestRate(s); ok {
			r.limit = limitText(rt)
			r.learned = s.Learned != nil && s.Learned.Rule != "" && rt == s.Learned.Rate()
			r.adaptive = !r.learned && s.Adaptive != nil && rt == s.Adaptive.Rate
		}
		if cs := s.Concurrency; cs != nil {
			r.inFlight, r.cap = cs.InFlight, cs.Concurrency.Limit
		}
		if !s.CooldownUntil.IsZero() {
			r.cooldown = s.CooldownUntil.Sub(s.Now)
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		switch {
		case a.perSec != b.perSec:
			return a.perSec > b.perSec
		case a.inFlight != b.inFlight:
			return a.inFlight > b.inFlight
		case a.reserved != b.reserved:
			return a.reserved > b.reserved
		case a.waiting != b.waiting:
			return a.waiting > b.waiting
		case (a.cooldown > 0) != (b.cooldown > 0):
			return a.cooldown > 0
		}
		return a.tenant < b.tenant
	})
	return rows
}

// tightestRate is the rate rule of s that allows the fewest starts per
// second, and that number; ok is false without a rate rule.
func tightestRate(s *throttle.Stats) (r throttle.Rate, perSec float64, ok bool) {
	for _, rt := range s.Rates {
		if v := float64(rt.Rate.Limit) / rt.Rate.Period.Seconds(); !ok || v < perSec {
			r, perSec, ok = rt.Rate, v, true
		}
	}
	return r, perSec, ok
}

// writeTop prints the table of rows, at most limit of them (0: all), with
// eol ending each line ("\r\n" on a raw terminal).
func writeTop(w io.Writer, rows []topRow, limit int, eol string) error {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	shadows, settled := false, false
	for i, r := range rows {
		shown := limit == 0 || i < limit
		shadows = shadows || (r.shadow != nil && shown)
		settled = settled || (settledCell(r) != "" && shown)
	}
	header := "TENANT\tSTARTS/S\tLIMIT\tIN FLIGHT\tRESERVED\tCOOLDOWN\tWAITING\tPOLICY"
	if shadows {
		header += "\tSHADOW WOULD DENY"
	}
	if settled {
		header += "\tSETTLED"
	}
	fmt.Fprintln(tw, header)
	for i, r := range rows {
		if limit > 0 && i >= limit {
			break
		}
		inFlight := "-"
		if r.cap >= 0 {
			inFlight = fmt.Sprintf("%d/%d", r.inFlight, r.cap)
		}
		cool := "-"
		if r.cooldown > 0 {
			cool = short(r.cooldown)
		}
		limit := r.limit
		if r.learned {
			limit += " learned"
		}
		if r.adaptive {
			limit += " adaptive"
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t%d\t%s\t%s\t%s", human.Text(r.tenant), r.perSec, limit, inFlight, r.reserved, cool, r.waitingText, r.policy)
		if shadows {
			fmt.Fprintf(tw, "\t%s", topShadowCell(r))
		}
		if settled {
			fmt.Fprintf(tw, "\t%s", settledCell(r))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		fmt.Fprintf(w, "%s%s", strings.TrimRight(l, " "), eol)
	}
	if limit > 0 && len(rows) > limit {
		fmt.Fprintf(w, "... and %s%s", human.Count(len(rows)-limit, "more tenant", "more tenants"), eol)
	}
	return nil
}

// topShadowCell is what the tenant's shadow would deny over the interval:
// "90% of 12.0/s" (its denials of its decisions, and their rate).
func topShadowCell(r topRow) string {
	switch {
	case r.shadow == nil:
		return "-"
	case r.shadowPerSec == 0:
		return "no starts"
	}
	return fmt.Sprintf("%s of %.1f/s", percent(r.shadowDeniedPerSec/r.shadowPerSec), r.shadowPerSec)
}

// settledCell is the cost settled after the tenant's jobs ran: "-120/+30"
// (refunded, charged extra); "" when nothing was.
func settledCell(r topRow) string {
	if r.refunded == 0 && r.extra == 0 {
		return ""
	}
	return fmt.Sprintf("-%d/+%d", r.refunded, r.extra)
}

// sampleTimeout bounds one refresh: a Redis that has not answered by then
// counts as stalled.
func sampleTimeout(interval time.Duration) time.Duration {
	return min(max(2*interval, time.Second), 10*time.Second)
}

// sampleOnce reads every tenant within sampleTimeout; an error says how
// long Redis was waited for.
func (cn *conn) sampleOnce(ctx context.Context, interval time.Duration) (topSample, error) {
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, sampleTimeout(interval))
	defer cancel()
	s, err := cn.sample(sctx)
	if err != nil && ctx.Err() == nil && sctx.Err() != nil {
		return nil, fmt.Errorf("no answer from Redis within %s", short(time.Since(start)))
	}
	return s, err
}

// topOnce measures over one interval and prints one table, or with
// asJSON one JSON line.
func topOnce(ctx context.Context, cn *conn, w io.Writer, interval time.Duration, limit int, asJSON bool) error {
	prev, err := cn.sampleOnce(ctx, interval)
	if err != nil {
		return err
	}
	timer := time.NewTimer(interval) // the measuring period, not a wait for a condition
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
	}
	cur, err := cn.sampleOnce(ctx, interval)
	if err != nil {
		return err
	}
	rows := topRows(prev, cur)
	if asJSON {
		return writeTopJSON(w, topDocOf(cur, rows, interval, limit, nil))
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no tenant has a policy or throttle state yet")
		return nil
	}
	return writeTop(w, rows, limit, "\n")
}

// topDoc is one refresh of top --json, on one line.
type topDoc struct {
	// Time is Redis's time of the figures; the local time when stale.
	Time       time.Time `json:"time"`
	IntervalMS float64   `json:"interval_ms"`
	// Stale is set when this refresh failed: Error says why, and Tenants
	// are the last figures read.
	Stale   bool            `json:"stale"`
	Error   string          `json:"error,omitempty"`
	Tenants []topTenantJSON `json:"tenants"`
}

type topTenantJSON struct {
	Tenant       string  `json:"tenant"`
	StartsPerSec float64 `json:"starts_per_s"`
	// Limit is the tightest rate ("" without one), Concurrency the cap
	// (-1 without one); Waiting the jobs in the tenant's line, BacklogCap
	// the line's cap (0: none).
	Limit       string  `json:"limit"`
	InFlight    int64   `json:"in_flight"`
	Concurrency int64   `json:"concurrency"`
	Reserved    int64   `json:"reserved"`
	CooldownMS  float64 `json:"cooldown_ms"`
	Waiting     int64   `json:"waiting"`
	BacklogCap  int64   `json:"backlog_cap"`
	Policy      string  `json:"policy"`
	// Learned describes the limit learned from the tenant's downstream;
	// absent when none is in place.
	Learned string `json:"learned,omitempty"`
	// Shadow is what the tenant's shadow policy would deny; absent when
	// it has none.
	Shadow *topShadowJSON `json:"shadow,omitempty"`
	// Adaptive describes the adaptive rule ("37/s, 10..200/s, 4 up 2
	// down"); absent when the policy has none.
	Adaptive string `json:"adaptive,omitempty"`
	// Refunded and Extra are the cost settled after the tenant's jobs ran
	// (as stats --json has them): given back and charged extra, totals
	// while its state lives; absent while 0.
	Refunded int64 `json:"settled_refunded,omitempty"`
	Extra    int64 `json:"settled_extra,omitempty"`
}

// topShadowJSON is a shadow's decisions and denials per second over the
// interval, and its totals (stats' shadow).
type topShadowJSON struct {
	Name            string  `json:"name"`
	Rules           string  `json:"rules"`
	DecisionsPerSec float64 `json:"decisions_per_s"`
	DeniedPerSec    float64 `json:"denied_per_s"`
	Decisions       int64   `json:"decisions"`
	Denied          int64   `json:"denied"`
}

func topDocOf(cur topSample, rows []topRow, interval time.Duration, limit int, err error) topDoc {
	d := topDoc{Time: time.Now().UTC(), IntervalMS: ms(interval), Tenants: []topTenantJSON{}}
	for _, s := range cur {
		d.Time = s.Now.UTC()
		break
	}
	if err != nil {
		d.Time, d.Stale, d.Error = time.Now().UTC(), true, err.Error()
	}
	for i, r := range rows {
		if limit > 0 && i >= limit {
			break
		}
		t := topTenantJSON{Tenant: r.tenant, StartsPerSec: math.Round(r.perSec*10) / 10, Limit: r.limit, InFlight: r.inFlight, Concurrency: r.cap,
			Reserved: r.reserved, CooldownMS: ms(r.cooldown), Waiting: r.waiting, Refunded: r.refunded, Extra: r.extra}
		if t.Limit == "-" {
			t.Limit = ""
		}
		if s := cur[r.tenant]; s != nil {
			t.Policy = s.Policy
			if s.Rules != nil {
				t.BacklogCap = s.Rules.Backlog
			}
			if s.Learned != nil {
				t.Learned = s.Learned.String()
			}
			if sh := s.Shadow; sh != nil {
				t.Shadow = &topShadowJSON{Name: sh.Name, Rules: sh.Policy.String(), Decisions: sh.Decisions, Denied: sh.Denied,
					DecisionsPerSec: math.Round(r.shadowPerSec*10) / 10, DeniedPerSec: math.Round(r.shadowDeniedPerSec*10) / 10}
			}
			if a := s.Adaptive; a != nil {
				t.Adaptive = fmt.Sprintf("%s, %d..%d, %d up %d down", limitText(a.Rate), a.Floor, a.Ceiling, a.Increases, a.Decreases)
			}
		}
		d.Tenants = append(d.Tenants, t)
	}
	return d
}

func writeTopJSON(w io.Writer, d topDoc) error {
	return json.NewEncoder(w).Encode(d)
}

// topJSON prints a JSON line every interval until ctx ends.
func topJSON(ctx context.Context, cn *conn, w io.Writer, interval time.Duration, limit int) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	prev, err := cn.sampleOnce(ctx, interval)
	if err != nil {
		return err
	}
	var rows []topRow
	cur := prev
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s, err := cn.sampleOnce(ctx, interval)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			prev, cur = cur, s
			rows = topRows(prev, cur)
		}
		if werr := writeTopJSON(w, topDocOf(cur, rows, interval, limit, err)); werr != nil {
			return werr
		}
	}
}

// sampled is one refresh of the live view.
type sampled struct {
	s   topSample
	err error
}

// topLoop redraws the view every interval until q, Ctrl-C or Ctrl-D is
// typed, keys closes, or ctx ends. Refreshes run in the background, one at
// a time, so that while Redis does not answer the view says so (STALE,
// with how long) above the last figures it read. size gives the
// terminal's width and height: the view shows as many tenants as fit (or
// limit) and cuts its lines to the width, so that none wraps.
func topLoop(ctx context.Context, cn *conn, w io.Writer, keys <-chan byte, interval time.Duration, limit int, size func() (width, height int)) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	results := make(chan sampled, 1)
	var (
		wg             sync.WaitGroup
		busy           bool
		prev, cur      topSample
		lastGood       time.Time // when the last good answer came
		lastErr        error
		started        = time.Now()
		figuresFrom    time.Time
		sctx, cancelSS = context.WithCancel(ctx)
	)
	defer func() {
		cancelSS()
		wg.Wait()
	}()
	refresh := func() {
		if busy {
			return
		}
		busy = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := cn.sampleOnce(sctx, interval)
			results <- sampled{s, err}
		}()
	}
	draw := func() {
		width, height := size()
		var b strings.Builder
		line := func(s string) { b.WriteString(human.Fit(s, width) + "\x1b[K\r\n") }
		b.WriteString("\x1b[H")
		line(fmt.Sprintf("sluice top  %s  prefix %s  every %s  (q quits)", cn.url.String(), cn.prefix, interval))
		since := lastGood
		if since.IsZero() {
			since = started
		}
		figures := "no figures yet"
		if prev != nil && cur != nil {
			figures = "the figures below are from " + figuresFrom.Format("15:04:05")
		}
		switch {
		case lastErr != nil && !strings.HasPrefix(lastErr.Error(), "no answer from Redis"):
			line(fmt.Sprintf("STALE: the last refresh failed: %s; %s", human.Line(lastErr.Error(), 0), figures))
		case lastErr != nil || (busy && time.Since(since) > 2*interval):
			line(fmt.Sprintf("STALE: no answer from Redis for %s; %s", short(time.Since(since)), figures))
		case prev == nil || cur == nil:
			line("measuring...")
		default:
			line(figuresFrom.Format("15:04:05") + "  " + human.Count(len(cur), "tenant", "tenants"))
		}
		if prev != nil && cur != nil {
			rows := topRows(prev, cur)
			n := limit
			if n == 0 {
				n = max(height-4, 1)
			}
			var t strings.Builder
			_ = writeTop(&t, rows, n, "\n")
			for _, l := range strings.Split(strings.TrimSuffix(t.String(), "\n"), "\n") {
				line(l)
			}
		}
		b.WriteString("\x1b[J")
		_, _ = io.WriteString(w, b.String())
	}
	refresh()
	draw()
	for {
		select {
		case <-ctx.Done():
			return nil
		case k, ok := <-keys:
			if !ok || k == 'q' || k == 'Q' || k == 3 || k == 4 {
				return nil
			}
		case r := <-results:
			busy = false
			if ctx.Err() != nil {
				return nil
			}
			if r.err != nil {
				lastErr = r.err
			} else {
				prev, cur, lastErr = cur, r.s, nil
				lastGood, figuresFrom = time.Now(), time.Now()
			}
			draw()
		case <-tick.C:
			refresh()
			draw()
		}
	}
}
