package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/throttle"
)

func stats(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 1, ""); err != nil {
		return err
	}
	if len(args) == 1 {
		if err := checkTenant(c, args[0]); err != nil {
			return err
		}
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	var names []string
	if len(args) == 1 {
		names = args
	} else if names, err = cn.tenantNames(a.ctx); err != nil {
		return err
	}
	all, err := cn.collect(a.ctx, names)
	if err != nil {
		return err
	}
	now := time.Now()
	if len(all) > 0 {
		now = all[0].Now
	}
	if o.json {
		doc := statsDoc{Now: now.UTC(), Tenants: make([]tenantJSON, 0, len(all))}
		for _, s := range all {
			doc.Tenants = append(doc.Tenants, toJSON(s))
		}
		return writeJSON(a.stdout, doc)
	}
	if len(args) == 1 {
		return writeDetail(a.stdout, all[0])
	}
	if len(all) == 0 {
		fmt.Fprintln(a.stderr, "no tenant has a policy or throttle state yet")
	}
	return writeStatsTable(a.stdout, all)
}

// tenantNames lists every tenant with a policy or live state, and @global
// when it has either; not "*", which is a policy but no tenant, and not a
// name that is no valid tenant (a policy left by an older version: policy
// list shows it).
func (cn *conn) tenantNames(ctx context.Context) ([]string, error) {
	live, err := cn.limiter.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	return cn.withPolicyNames(ctx, live)
}

// withPolicyNames adds to live (tenants with state) the names of every
// stored policy but "*", sorted, without repeats.
func (cn *conn) withPolicyNames(ctx context.Context, live []string) ([]string, error) {
	set := map[string]bool{}
	for _, t := range live {
		set[t] = true
	}
	list, err := cn.store.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, np := range list {
		name := np.Name
		if of, ok := strings.CutPrefix(name, throttle.ShadowPrefix); ok {
			name = of // a tenant with a shadow is listed, not the shadow
		}
		if name != throttle.DefaultPolicy {
			set[name] = true
		}
	}
	listed := make([]string, 0, len(set))
	for n := range set {
		if n == throttle.GlobalPolicy || names.Tenant(n) == nil || names.Pool(n) == nil || isKeyName(n) {
			listed = append(listed, n)
		}
	}
	sort.Strings(listed)
	return listed, nil
}

// collect reads the stats of names, several at a time (the limiter shares
// round trips between concurrent calls), in the order given.
func (cn *conn) collect(ctx context.Context, names []string) ([]*throttle.Stats, error) {
	out := make([]*throttle.Stats, len(names))
	errs := make([]error, len(names))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = cn.limiter.Stats(ctx, n)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// statsDoc is the output of `stats --json`: a stable schema for scripts.
type statsDoc struct {
	Now     time.Time    `json:"now"`
	Tenants []tenantJSON `json:"tenants"`
}

type tenantJSON struct {
	Tenant string `json:"tenant"`
	// Policy is the name of the policy that applies ("" when none does)
	// and Rules its text.
	Policy       string           `json:"policy"`
	Rules        string           `json:"rules"`
	Started      int64            `json:"started"`
	Rates        []rateJSON       `json:"rates"`
	Window       *windowJSON      `json:"window"`
	Quota        *quotaJSON       `json:"quota"`
	Concurrency  *concurrencyJSON `json:"concurrency"`
	Reservations int64            `json:"reservations"`
	FirstSlot    *time.Time       `json:"first_slot"`
	LastSlot     *time.Time       `json:"last_slot"`
	Cooldown     *time.Time       `json:"cooldown_until"`
	Waiting      int64            `json:"waiting"`
	WaitingSince *time.Time       `json:"waiting_since"`
	BacklogCap   int64            `json:"backlog_cap"`
	Leftovers    int64            `json:"leftovers"`
	// Refunded and Extra are the cost settled after jobs ran (worker.SettleCost)
	Refunded int64 `json:"settled_refunded,omitempty"`
	Extra    int64 `json:"settled_extra,omitempty"`
	// Learned is the limit learned from the tenant's downstream; absent
	// when none is in place.
	Learned *learnedJSON `json:"learned,omitempty"`
	// Shadow is what the tenant's shadow policy would have denied; absent
	// when it has none.
	Shadow *shadowJSON `json:"shadow,omitempty"`
	// Adaptive is the state of the policy's adaptive rule; absent when
	// the policy has none.
	Adaptive *adaptiveJSON `json:"adaptive,omitempty"`
}

type shadowJSON struct {
	Name      string `json:"name"` // @shadow:TENANT, or @shadow:* (the default's)
	Rules     string `json:"rules"`
	Decisions int64  `json:"decisions"`
	Denied    int64  `json:"denied"`
	// DeniedShare is Denied / Decisions (0 when none was made).
	DeniedShare float64          `json:"denied_share"`
	DeniedBy    map[string]int64 `json:"denied_by"`
	// RetryAfterMS sums the waits the denials would have imposed.
	RetryAfterMS float64    `json:"retry_after_ms"`
	Since        *time.Time `json:"since"`
}

type adaptiveJSON struct {
	Rule      string  `json:"rule"`
	Rate      string  `json:"rate"` // the current limit, as the rule admits by
	Limit     int64   `json:"limit"`
	Floor     int64   `json:"floor"`
	Ceiling   int64   `json:"ceiling"`
	PeriodMS  float64 `json:"period_ms"`
	Step      int64   `json:"step"`
	EveryMS   float64 `json:"every_ms"`
	Increases int64   `json:"increases"`
	Decreases int64   `json:"decreases"`
	// Until is when the state lapses without reports; absent when none is
	// kept (the limit is the policy's rate).
	Until   *time.Time        `json:"until,omitempty"`
	History []adaptChangeJSON `json:"history"`
}

type adaptChangeJSON struct {
	At     time.Time `json:"at"`
	From   int64     `json:"from"`
	To     int64     `json:"to"`
	Reason string    `json:"reason"`
}

type learnedJSON struct {
	Limit    int64     `json:"limit"`
	WindowMS float64   `json:"window_ms"`
	Rate     string    `json:"rate"`
	Rule     string    `json:"rule"` // "" when not applied: see note
	Note     string    `json:"note,omitempty"`
	Source   string    `json:"source"`
	From     string    `json:"from"`
	Learned  time.Time `json:"learned"`
	Until    time.Time `json:"until"`
}

type rateJSON struct {
	Rule      string  `json:"rule"`
	Rate      string  `json:"rate"`
	Limit     int64   `json:"limit"`
	PeriodMS  float64 `json:"period_ms"`
	Burst     int64   `json:"burst"`
	Available int64   `json:"available"`
	AheadMS   float64 `json:"ahead_ms"`
	// StartedAheadMS is how far the meter of actual starts runs ahead.
	StartedAheadMS float64 `json:"started_ahead_ms"`
}

type windowJSON struct {
	Window   string  `json:"window"`
	Limit    int64   `json:"limit"`
	PeriodMS float64 `json:"period_ms"`
	Started  int64   `json:"started"`
	Planned  int64   `json:"planned"`
}

type quotaJSON struct {
	Quota                string    `json:"quota"`
	Limit                int64     `json:"limit"`
	Used                 int64     `json:"used"`
	Remaining            int64     `json:"remaining"`
	WindowStart          time.Time `json:"window_start"`
	WindowEnd            time.Time `json:"window_end"`
	ReservedInNextWindow int64     `json:"reserved_in_next_window"`
}

type concurrencyJSON struct {
	Limit    int64        `json:"limit"`
	InFlight int64        `json:"in_flight"`
	Holders  []holderJSON `json:"holders"`
}

type holderJSON struct {
	ID       string    `json:"id"`
	LeaseEnd time.Time `json:"lease_end"`
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func toJSON(s *throttle.Stats) tenantJSON {
	j := tenantJSON{
		Tenant: s.Tenant, Policy: s.Policy, Started: s.Started,
		Rates:        []rateJSON{},
		Reservations: s.Reservations, FirstSlot: timePtr(s.FirstSlot), LastSlot: timePtr(s.LastSlot),
		Cooldown: timePtr(s.CooldownUntil), Waiting: s.Waiting, WaitingSince: timePtr(s.WaitingSince), Leftovers: s.Leftovers,
		Refunded: s.Refunded, Extra: s.Extra,
	}
	if s.Rules != nil {
		j.Rules = s.Rules.String()
		j.BacklogCap = s.Rules.Backlog
	}
	for _, r := range s.Rates {
		j.Rates = append(j.Rates, rateJSON{
			Rule: r.Rule, Rate: r.Rate.String(), Limit: r.Rate.Limit, PeriodMS: ms(r.Rate.Period),
			Burst: max(r.Rate.Burst, 1), Available: r.Available, AheadMS: ms(r.Ahead), StartedAheadMS: ms(r.StartedAhead),
		})
	}
	if w := s.Window; w != nil {
		j.Window = &windowJSON{Window: w.Window.String(), Limit: w.Window.Limit, PeriodMS: ms(w.Window.Period), Started: w.Started, Planned: w.Planned}
	}
	if sh := s.Shadow; sh != nil {
		j.Shadow = &shadowJSON{Name: sh.Name, Rules: sh.Policy.String(), Decisions: sh.Decisions, Denied: sh.Denied,
			DeniedShare: deniedShare(sh), DeniedBy: sh.DeniedBy, RetryAfterMS: ms(sh.RetryAfter), Since: timePtr(sh.Since)}
	}
	if l := s.Learned; l != nil {
		j.Learned = &learnedJSON{Limit: l.Limit, WindowMS: ms(l.Window), Rate: l.Rate().String(), Rule: l.Rule, Note: l.Note,
			Source: l.Source, From: l.From, Learned: l.Learned.UTC(), Until: l.Until.UTC()}
	}
	if a := s.Adaptive; a != nil {
		aj := &adaptiveJSON{Rule: a.Rule, Rate: a.Rate.String(), Limit: a.Rate.Limit, Floor: a.Floor, Ceiling: a.Ceiling,
			PeriodMS: ms(a.Rate.Period), Step: a.Step, EveryMS: ms(a.Every), Increases: a.Increases, Decreases: a.Decreases,
			Until: timePtr(a.Until), History: []adaptChangeJSON{}}
		for _, c := range a.History {
			aj.History = append(aj.History, adaptChangeJSON{At: c.At.UTC(), From: c.From, To: c.To, Reason: c.Reason})
		}
		j.Adaptive = aj
	}
	if q := s.Quota; q != nil {
		j.Quota = &quotaJSON{
			Quota: q.Quota.String(), Limit: q.Quota.Limit, Used: q.Used, Remaining: q.Remaining,
			WindowStart: q.WindowStart.UTC(), WindowEnd: q.WindowEnd.UTC(), ReservedInNextWindow: q.ReservedInNextWindow,
		}
	}
	if cs := s.Concurrency; cs != nil {
		cj := &concurrencyJSON{Limit: cs.Concurrency.Limit, InFlight: cs.InFlight, Holders: []holderJSON{}}
		for _, h := range cs.Holders {
			cj.Holders = append(cj.Holders, holderJSON{ID: h.ID, LeaseEnd: h.LeaseEnd.UTC()})
		}
		j.Concurrency = cj
	}
	return j
}

func policyName(s *throttle.Stats) string {
	if s.Policy == "" {
		return "-"
	}
	return human.Text(s.Policy)
}

func rateCell(s *throttle.Stats) string {
	if len(s.Rates) == 0 {
		return "-"
	}
	var parts []string
	for _, r := range s.Rates {
		part := fmt.Sprintf("%d/%d of %s", r.Available, max(r.Rate.Burst, 1), limitText(r.Rate))
		if isLearned(s, r.Rule) {
			part += " (learned)"
		}
		if isAdaptive(s, r.Rule) {
			part += fmt.Sprintf(" (adaptive %d..%d)", s.Adaptive.Floor, s.Adaptive.Ceiling)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// isLearned reports whether rule is the one s's learned limit added.
func isLearned(s *throttle.Stats, rule string) bool {
	return s.Learned != nil && s.Learned.Rule != "" && s.Learned.Rule == rule
}

// isAdaptive reports whether rule is s's adaptive rule.
func isAdaptive(s *throttle.Stats, rule string) bool {
	return s.Adaptive != nil && s.Adaptive.Rule == rule
}

// adaptiveText tells where an adaptive rule is, within what, and how it
// got there.
func adaptiveText(s *throttle.Stats) string {
	a := s.Adaptive
	per := "/" + strings.TrimPrefix(limitText(throttle.Rate{Limit: 1, Period: a.Rate.Period}), "1/")
	text := fmt.Sprintf("%s now, between %d%s and %d%s (+%d every %s while answers are good, ×0.75 on 429/503)",
		limitText(a.Rate), a.Floor, per, a.Ceiling, per, a.Step, short(a.Every))
	if a.Until.IsZero() {
		text += "; not begun: the policy's rate"
	} else {
		text += fmt.Sprintf("; %s, %s; lapses %s after the last report", human.Count(a.Increases, "increase", "increases"), human.Count(a.Decreases, "decrease", "decreases"), short(a.Until.Sub(s.Now)))
	}
	return text
}

// adaptChangeText is one change of an adaptive limit.
func adaptChangeText(s *throttle.Stats, c throttle.AdaptChange) string {
	why := map[string]string{"start": "began at the policy's rate", "policy": "the policy changed", "increase": "answers were good",
		"throttled": "the downstream answered 429/503", "latency": "answers were slow"}[c.Reason]
	if why == "" {
		why = human.Text(c.Reason)
	}
	return fmt.Sprintf("%s ago: %d → %d, %s", short(s.Now.Sub(c.At)), c.From, c.To, why)
}

// learnedText tells what was learned, from where, until when and whether
// it applies.
func learnedText(s *throttle.Stats) string {
	l := s.Learned
	text := fmt.Sprintf("%d per %s (%s) from the downstream, for %s more (until %s)", l.Limit, short(l.Window), limitText(l.Rate()),
		short(l.Until.Sub(s.Now)), l.Until.UTC().Format(time.RFC3339))
	if l.Source != "" {
		text += "; declared in " + l.Source
	}
	if l.From != "" {
		text += " of " + human.Text(l.From)
	}
	if l.Rule != "" {
		return text + "; applied as " + l.Rule
	}
	return text + "; not applied: " + l.Note
}

// limitText is a rate without its burst: "100/s".
func limitText(r throttle.Rate) string {
	text, _, _ := strings.Cut(r.String(), " ")
	return text
}

func windowCell(s *throttle.Stats) string {
	if s.Window == nil {
		return "-"
	}
	return fmt.Sprintf("%d of %s", s.Window.Started, s.Window.Window.String())
}

func quotaCell(s *throttle.Stats) string {
	if s.Quota == nil {
		return "-"
	}
	return fmt.Sprintf("%d of %s", s.Quota.Used, s.Quota.Quota.String())
}

func inFlightCell(s *throttle.Stats) string {
	if s.Concurrency == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d", s.Concurrency.InFlight, s.Concurrency.Concurrency.Limit)
}

func reservedCell(s *throttle.Stats) string {
	if s.Reservations == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (last in %s)", s.Reservations, short(s.LastSlot.Sub(s.Now)))
}

func cooldownCell(s *throttle.Stats) string {
	if s.CooldownUntil.IsZero() {
		return "-"
	}
	return short(s.CooldownUntil.Sub(s.Now)) + " left"
}

// waitingCell is how many jobs wait in the tenant's line (of its backlog
// cap).
// jobsNoun is "job" or "jobs", as n asks.
func jobsNoun(n int64) string {
	if n == 1 {
		return "job"
	}
	return "jobs"
}

func waitingCell(s *throttle.Stats) string {
	if s.Rules != nil && s.Rules.Backlog > 0 {
		return fmt.Sprintf("%d/%d", s.Waiting, s.Rules.Backlog)
	}
	return fmt.Sprint(s.Waiting)
}

// short prints a duration rounded for people: 1.2s, 350ms, 4m10s.
func short(d time.Duration) string { return human.Duration(d) }

// deniedShare is the share of the shadow's decisions it denied.
func deniedShare(sh *throttle.ShadowStats) float64 {
	if sh.Decisions == 0 {
		return 0
	}
	return float64(sh.Denied) / float64(sh.Decisions)
}

// shadowCell is what a tenant's shadow would have denied: "98 of 100 (98%)".
func shadowCell(sh *throttle.ShadowStats) string {
	if sh == nil {
		return "-"
	}
	if sh.Decisions == 0 {
		return "none yet"
	}
	return fmt.Sprintf("%d of %d (%s)", sh.Denied, sh.Decisions, percent(deniedShare(sh)))
}

// percent prints a share for people: 98%, 0.4%, 0%.
func percent(f float64) string {
	switch {
	case f == 0 || f >= 0.1:
		return fmt.Sprintf("%.0f%%", 100*f)
	default:
		return fmt.Sprintf("%.1f%%", 100*f)
	}
}

// shadowText tells what a tenant's shadow policy would have done.
func shadowText(sh *throttle.ShadowStats, now time.Time) string {
	if sh.Decisions == 0 {
		return describeRules(sh.Policy) + " (not enforced): no job has started since it was set"
	}
	text := fmt.Sprintf("%s (not enforced) would have denied %s starts in the last %s", describeRules(sh.Policy), shadowCell(sh), short(now.Sub(sh.Since)))
	if sh.Denied > 0 {
		rules := make([]string, 0, len(sh.DeniedBy))
		for r := range sh.DeniedBy {
			rules = append(rules, r)
		}
		sort.Strings(rules)
		var by []string
		for _, r := range rules {
			by = append(by, fmt.Sprintf("%s %d", r, sh.DeniedBy[r]))
		}
		text += fmt.Sprintf("; by %s; each would have waited %s on average", strings.Join(by, ", "), short(sh.RetryAfter/time.Duration(sh.Denied)))
	}
	return text
}

func writeStatsTable(w io.Writer, all []*throttle.Stats) error {
	tw := newTable(w)
	shadows := false
	for _, s := range all {
		shadows = shadows || s.Shadow != nil
	}
	header := "TENANT\tPOLICY\tSTARTED\tRATE (FREE/BURST)\tWINDOW\tQUOTA\tIN FLIGHT\tRESERVED\tCOOLDOWN\tWAITING"
	if shadows {
		header += "\tSHADOW WOULD DENY"
	}
	fmt.Fprintln(tw, header)
	for _, s := range all {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s", human.Text(s.Tenant), policyName(s), s.Started,
			rateCell(s), windowCell(s), quotaCell(s), inFlightCell(s), reservedCell(s), cooldownCell(s), waitingCell(s))
		if shadows {
			fmt.Fprintf(tw, "\t%s", shadowCell(s.Shadow))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// rateText tells a rate rule's state in a line: "100/s burst 20: 3 of 20
// free now".
func rateText(r throttle.RateStats) string {
	text := fmt.Sprintf("%s: %d of %d free now", r.Rate, r.Available, max(r.Rate.Burst, 1))
	if r.Ahead > 0 {
		text += fmt.Sprintf("; reserved slots run %s ahead", human.Duration(r.Ahead))
	}
	if r.StartedAhead > 0 {
		text += fmt.Sprintf("; started jobs run %s ahead", human.Duration(r.StartedAhead))
	}
	return text
}

// adaptShown is how many of an adaptive limit's last changes the detail
// view lists (--json has them all).
const adaptShown = 10

func writeDetail(w io.Writer, s *throttle.Stats) error {
	tw := newTable(w)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("tenant", "%s", human.Text(s.Tenant))
	switch {
	case s.Policy == "":
		row("policy", "none (no policy of its own and no default *): not limited")
	case s.Policy == throttle.DefaultPolicy:
		row("policy", "* (the default): %s", describeRules(s.Rules))
	default:
		row("policy", "%s: %s", human.Text(s.Policy), describeRules(s.Rules))
	}
	row("started", "%s (counted while the tenant's state is alive)", human.Count(s.Started, "job", "jobs"))
	for _, r := range s.Rates {
		name := r.Rule
		if isLearned(s, name) {
			name += " (learned)"
		}
		if isAdaptive(s, name) {
			name += " (adaptive)"
		}
		row(name, "%s", rateText(r))
	}
	if w := s.Window; w != nil {
		row("window", "%s: %d started in the last %s, %d with reservations", w.Window, w.Started, w.Window.Period, w.Planned)
	}
	if q := s.Quota; q != nil {
		row("quota", "%s: %d used, %d left; resets %s (in %s); %d reserved in the next window",
			q.Quota, q.Used, q.Remaining, q.WindowEnd.UTC().Format(time.RFC3339), human.Duration(q.WindowEnd.Sub(s.Now)), q.ReservedInNextWindow)
	}
	if c := s.Concurrency; c != nil {
		row("concurrency", "%d of %d in flight", c.InFlight, c.Concurrency.Limit)
	}
	if s.Learned != nil {
		row("learned", "%s", learnedText(s))
	}
	if s.Shadow != nil {
		row("shadow", "%s: %s", human.Text(s.Shadow.Name), shadowText(s.Shadow, s.Now))
	}
	if s.Adaptive != nil {
		row("adaptive", "%s", adaptiveText(s))
		h := s.Adaptive.History
		for i := len(h) - 1; i >= 0 && i >= len(h)-adaptShown; i-- {
			row("", "%s", adaptChangeText(s, h[i]))
		}
		if len(h) > adaptShown {
			row("", "(%d earlier changes in --json)", len(h)-adaptShown)
		}
	}
	if cs := s.Concurrency; cs != nil {
		for _, h := range cs.Holders {
			row("", "%s (lease ends in %s)", human.Text(h.ID), short(h.LeaseEnd.Sub(s.Now)))
		}
	}
	if s.Reservations > 0 {
		row("reserved", "%s future slots, the first in %s, the last in %s", human.Count(s.Reservations, "job holds", "jobs hold"), short(s.FirstSlot.Sub(s.Now)), short(s.LastSlot.Sub(s.Now)))
	} else {
		row("reserved", "0")
	}
	if s.CooldownUntil.IsZero() {
		row("cooldown", "none")
	} else {
		row("cooldown", "%s left (until %s)", short(s.CooldownUntil.Sub(s.Now)), s.CooldownUntil.UTC().Format(time.RFC3339Nano))
	}
	if s.Waiting > 0 {
		row("waiting", "%s %s in its line, the oldest for %s", waitingCell(s), jobsNoun(s.Waiting), short(s.Now.Sub(s.WaitingSince)))
	} else {
		row("waiting", "%s %s in its line", waitingCell(s), jobsNoun(s.Waiting))
	}
	if s.Refunded > 0 || s.Extra > 0 {
		row("settled", "%d refunded, %d charged extra (jobs' actual costs against their estimates)", s.Refunded, s.Extra)
	}
	if s.Leftovers > 0 {
		row("leftovers", "%s a two-step Cluster admission could not take back (each at most one interval of a rate; they pass with time)", human.Count(s.Leftovers, "charge", "charges"))
	}
	return tw.Flush()
}
