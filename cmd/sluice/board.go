package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/waitroom"
	"github.com/sluicehq/sluice/taskspec"
	"github.com/sluicehq/sluice/throttle"
)

// listEvery is how many samples pass between two scans of the keyspace for
// the tenants with state (a SCAN costs in proportion to the database);
// stored policies are read at every sample.
const listEvery = 5

// sparkPoints is how many of a tenant's last points the tenants list
// carries for its sparkline.
const sparkPoints = 60

// boardConfig is how the board samples and what it keeps.
type boardConfig struct {
	interval   time.Duration
	points     int // per tenant
	maxTenants int
	scrape     []string // workers' metrics URLs (--metrics)
	// discover finds the workers' metrics in the fleet's registry in
	// Redis instead (no --metrics).
	discover bool
	// history draws the tenants' history from Prometheus (--prometheus);
	// nil keeps it in memory only.
	history  *promHistory
	readOnly bool
}

// board samples Redis (and the workers' metrics) once per interval in one
// goroutine, for every browser at once, and keeps each followed tenant's
// recent history in memory: at most maxTenants tenants of at most points
// points each.
type board struct {
	cn      *conn
	cfg     boardConfig
	scraper *scraper // nil when the workers' metrics are not read
	fleet   *fleet.Registry

	// Only the sampling goroutine uses these.
	samples int
	live    []string  // tenants with state, from the last scan
	prev    topSample // the last good sample

	mu       sync.RWMutex
	tracks   map[string]*track
	total    int       // tenants known, followed or not, pools included
	pools    int       // shared pools known, followed or not
	keys     int       // keys below tenants known, followed or not
	now      time.Time // Redis time of the last good sample
	err      string    // why the last sample failed; "" when it went well
	errSince time.Time
	decided  *decisionsJSON
	labelled bool
	sources  []sourceJSON
	workers  []workerJSON // nil unless discover
}

// workerJSON is a worker of the fleet's registry: up while it beats within
// its lease (--recover-lease).
type workerJSON struct {
	ID string `json:"id"`
	// Metrics is its metrics URL, "" when it serves no admin endpoints.
	Metrics     string  `json:"metrics"`
	Up          bool    `json:"up"`
	LeaseLeftMS float64 `json:"lease_left_ms"`
}

// track is one followed tenant.
type track struct {
	row       rowJSON
	stats     *throttle.Stats
	points    []point
	idleSince time.Time // zero while the tenant is active
}

// rowJSON is a tenant's line on the tenants page (GET /api/tenants).
// Shared pools and @global have lines too: Kind tells them apart.
type rowJSON struct {
	Tenant string `json:"tenant"`
	// Kind is "tenant", "global" (@global), "pool" (a shared pool,
	// "@openai"; the page lists them in a panel of their own) or "key" (a
	// key below a tenant, "acme/user-42": its starts are its tenant's too).
	Kind string `json:"kind"`
	// Policy is the name of the policy that applies ("" when none does)
	// and Rules its text.
	Policy     string  `json:"policy"`
	Rules      string  `json:"rules"`
	StartsPerS float64 `json:"starts_per_s"`
	// Limit is the tightest rate rule ("20/s"), LimitPerS its starts per
	// second; "" and 0 without a rate rule.
	Limit     string  `json:"limit"`
	LimitPerS float64 `json:"limit_per_s"`
	InFlight  int64   `json:"in_flight"`
	// Cap is the concurrency rule's limit, -1 without one.
	Cap int64 `json:"cap"`
	// Waiting counts the jobs waiting in the tenant's line, the oldest
	// for OldestWaitMS; BacklogCap is its policy's backlog=, 0 for none.
	Waiting      int64   `json:"waiting"`
	OldestWaitMS float64 `json:"oldest_wait_ms"`
	Reserved     int64   `json:"reserved"`
	CooldownMS   float64 `json:"cooldown_ms"`
	// Paused says the tenant was in cooldown at some moment since the
	// sample before: at this one, at that one, or, when the workers label
	// their decisions by tenant, in a job the gate denied by cooldown.
	Paused     bool  `json:"paused"`
	BacklogCap int64 `json:"backlog_cap"`
	// SettledRefunded and SettledExtra are the cost settled after its
	// jobs ran (Stats.Refunded, Stats.Extra): given back by jobs cheaper
	// than their estimate and charged for dearer ones, while its state
	// lives.
	SettledRefunded int64 `json:"settled_refunded"`
	SettledExtra    int64 `json:"settled_extra"`
	// Learned describes the limit learned from the tenant's downstream
	// (what, from which answer, until when, as which rule); absent when
	// none is in place. LimitLearned says Limit is that limit.
	Learned      string `json:"learned,omitempty"`
	LimitLearned bool   `json:"limit_learned,omitempty"`
	// Adaptive describes the policy's adaptive rule (where it is, within
	// what, how it moved); absent without one. LimitAdaptive says Limit is
	// that rule.
	Adaptive      string `json:"adaptive,omitempty"`
	LimitAdaptive bool   `json:"limit_adaptive,omitempty"`
	// Decisions are the tenant's decisions per second, null unless the
	// workers scraped label their metrics by tenant.
	Decisions *decisionsJSON `json:"decisions"`
	// Spark is the starts per second of the last points, oldest first
	// (tenants list only).
	Spark []float64 `json:"spark,omitempty"`
	// Shadow is what the tenant's shadow policy would have denied; absent
	// when it has none.
	Shadow *boardShadowJSON `json:"shadow,omitempty"`
}

// boardShadowJSON is a tenant's shadow policy on the dashboard: its totals
// (as stats --json shows them), the rates of the last interval, and the
// sentence the page shows.
type boardShadowJSON struct {
	shadowJSON
	DecisionsPerS float64 `json:"decisions_per_s"`
	DeniedPerS    float64 `json:"denied_per_s"`
	Text          string  `json:"text"`
}

// point is one sample of a tenant's history.
type point struct {
	T          int64          `json:"t"` // Redis time, Unix ms
	StartsPerS float64        `json:"starts_per_s"`
	LimitPerS  float64        `json:"limit_per_s"`
	InFlight   int64          `json:"in_flight"`
	Cap        int64          `json:"cap"`
	Waiting    int64          `json:"waiting"`
	Reserved   int64          `json:"reserved"`
	Decisions  *decisionsJSON `json:"decisions,omitempty"`
}

// boardHeader starts both JSON documents.
type boardHeader struct {
	// Now is the Redis time of the last good sample, null before the first.
	Now        *time.Time `json:"now"`
	IntervalMS float64    `json:"interval_ms"`
	HistoryMS  float64    `json:"history_ms"`
	Redis      string     `json:"redis"`
	Prefix     string     `json:"prefix"`
	ReadOnly   bool       `json:"read_only"`
	// Error says why the last sample failed (the figures are then those of
	// the last good one), since ErrorSince; "" and null when it went well.
	Error      string     `json:"error"`
	ErrorSince *time.Time `json:"error_since"`
}

// tenantsDoc is GET /api/tenants.
type tenantsDoc struct {
	boardHeader
	// TenantsTotal counts the tenants with a policy or state, @global and
	// the shared pools (PoolsTotal of them) and the keys below tenants
	// (KeysTotal) included; Tenants lists at most --max-tenants of them,
	// by name.
	TenantsTotal int `json:"tenants_total"`
	PoolsTotal   int `json:"pools_total"`
	KeysTotal    int `json:"keys_total"`
	// Decisions are the fleet's decisions per second, from the workers'
	// metrics (MetricsSources); null before the first scrape. TenantLabels
	// says whether the workers label them by tenant.
	Decisions      *decisionsJSON `json:"decisions"`
	TenantLabels   bool           `json:"tenant_labels"`
	MetricsSources []sourceJSON   `json:"metrics_sources"`
	// Workers are the fleet's registered workers, up or not, when the
	// dashboard finds them there (no --metrics); null otherwise.
	Workers []workerJSON `json:"workers"`
	Tenants []rowJSON    `json:"tenants"`
}

// tenantDoc is GET /api/tenants/{name}: the tenant's line, its state as
// `sluice stats --json` prints it, and its history, oldest first.
type tenantDoc struct {
	boardHeader
	Tenant rowJSON    `json:"tenant"`
	Stats  tenantJSON `json:"stats"`
	Points []point    `json:"points"`
	// HistoryFrom says where Points come from: "prometheus" (then the
	// points since Prometheus's last one are the dashboard's own) or
	// "memory", the dashboard's samples since it started; HistoryError
	// says why Prometheus's could not be used.
	HistoryFrom  string `json:"history_from"`
	HistoryError string `json:"history_error,omitempty"`
	// Next are the first jobs of each of the tenant's lines, with when
	// they are expected to start (sluice jobs explain); empty when none
	// waits.
	Next []nextJSON `json:"next"`
}

// nextJSON is a waiting job on a tenant's page.
type nextJSON struct {
	ID           string  `json:"id"`
	Queue        string  `json:"queue"`
	Ahead        int64   `json:"ahead"`
	ExpectedInMS float64 `json:"expected_in_ms"`
	HeldBy       string  `json:"held_by"`
	RunningFirst int64   `json:"running_first"`
	// Priority is its level in the line: "high", "normal" or "low".
	Priority string `json:"priority"`
}

func newBoard(cn *conn, cfg boardConfig) *board {
	b := &board{cn: cn, cfg: cfg, tracks: map[string]*track{}}
	if len(cfg.scrape) > 0 || cfg.discover {
		b.scraper = newScraper(max(cfg.interval, time.Second))
	}
	if cfg.discover {
		b.fleet = fleet.New(cn.client, cn.prefix)
	}
	return b
}

func (b *board) close() {
	if b.scraper != nil {
		b.scraper.close()
	}
	if b.cfg.history != nil {
		b.cfg.history.close()
	}
}

// run samples at once, then every interval, until ctx ends.
func (b *board) run(ctx context.Context) {
	tick := time.NewTicker(b.cfg.interval)
	defer tick.Stop()
	for {
		b.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sample reads every followed tenant's stats and the workers' metrics, at
// the same time, and records them.
func (b *board) sample(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, max(2*b.cfg.interval, 5*time.Second))
	defer cancel()
	var (
		rates   decisionRates
		workers []workerJSON
		wg      sync.WaitGroup
	)
	if b.scraper != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			urls, down := b.cfg.scrape, []sourceJSON(nil)
			if b.fleet != nil {
				var err error
				if workers, urls, down, err = b.findWorkers(ctx); err != nil {
					return // the sample's own read of Redis says so
				}
			}
			rates = b.scraper.round(ctx, urls)
			b.nameSources(rates.sources, workers)
			rates.sources = append(rates.sources, down...)
		}()
	}
	cur, names, err := b.read(ctx)
	wg.Wait()
	if parent.Err() != nil {
		return // shutting down
	}
	b.record(cur, names, rates, workers, err)
}

// findWorkers lists the fleet's registered workers: the metrics URLs of
// those that are up, and a source with the reason for each that is not
// scraped (down, or serving no metrics).
func (b *board) findWorkers(ctx context.Context) (workers []workerJSON, urls []string, down []sourceJSON, err error) {
	members, err := b.fleet.List(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	workers = make([]workerJSON, 0, len(members))
	for _, m := range members {
		w := workerJSON{ID: m.ID, Up: m.Up(), LeaseLeftMS: ms(m.LeaseLeft)}
		if m.Admin != "" {
			w.Metrics = "http://" + m.Admin + "/metrics"
		}
		workers = append(workers, w)
		switch {
		case !w.Up:
			down = append(down, sourceJSON{URL: w.Metrics, Worker: m.ID, Error: fmt.Sprintf("down: no beat for %s past its lease", (-m.LeaseLeft).Round(time.Second))})
		case w.Metrics == "":
			down = append(down, sourceJSON{Worker: m.ID, Error: "serves no metrics (started with --admin off)"})
		default:
			urls = append(urls, w.Metrics)
		}
	}
	return workers, urls, down, nil
}

// nameSources gives each scraped source the id of its registered worker.
func (b *board) nameSources(sources []sourceJSON, workers []workerJSON) {
	for i := range sources {
		for _, w := range workers {
			if w.Metrics == sources[i].URL {
				sources[i].Worker = w.ID
			}
		}
	}
}

// read lists the tenants (names), picks the ones to follow and reads
// their stats.
func (b *board) read(ctx context.Context) (topSample, []string, error) {
	if b.live == nil || b.samples%listEvery == 0 {
		live, err := b.cn.limiter.Tenants(ctx)
		if err != nil {
			return nil, nil, err
		}
		b.live = live
	}
	b.samples++
	names, err := b.cn.withPolicyNames(ctx, b.live)
	if err != nil {
		return nil, nil, err
	}
	all, err := b.cn.collect(ctx, b.choose(names))
	if err != nil {
		return nil, nil, err
	}
	cur := topSample{}
	for _, s := range all {
		cur[s.Tenant] = s
	}
	return cur, names, nil
}

// choose picks at most maxTenants of names (sorted) to sample. Tenants
// already followed keep their place; newcomers take free places in name
// order, and when none is free, the places of followed tenants that have
// been idle for the whole history, the longest idle first.
func (b *board) choose(names []string) []string {
	if len(names) <= b.cfg.maxTenants {
		return names
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	var kept, newcomers []string
	for _, n := range names {
		if _, ok := b.tracks[n]; ok {
			kept = append(kept, n)
		} else {
			newcomers = append(newcomers, n)
		}
	}
	if room := b.cfg.maxTenants - len(kept); len(newcomers) > room {
		history := time.Duration(b.cfg.points) * b.cfg.interval
		var idle []string
		for _, n := range kept {
			if s := b.tracks[n].idleSince; !s.IsZero() && time.Since(s) >= history {
				idle = append(idle, n)
			}
		}
		sort.SliceStable(idle, func(i, j int) bool { return b.tracks[idle[i]].idleSince.Before(b.tracks[idle[j]].idleSince) })
		evict := map[string]bool{}
		for _, n := range idle[:min(len(idle), len(newcomers)-room)] {
			evict[n] = true
		}
		kept = slices.DeleteFunc(kept, func(n string) bool { return evict[n] })
	}
	chosen := append(kept, newcomers[:min(len(newcomers), b.cfg.maxTenants-len(kept))]...)
	sort.Strings(chosen)
	return chosen
}

// record stores a sample of the tenants known (names): a failed one only
// as the error.
func (b *board) record(cur topSample, names []string, rates decisionRates, workers []workerJSON, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.scraper != nil && (b.fleet == nil || workers != nil) {
		b.decided, b.labelled, b.sources, b.workers = rates.fleet(), rates.labelled, rates.sources, workers
	}
	if err != nil {
		if b.err == "" {
			b.errSince = time.Now()
		}
		b.err = err.Error()
		return
	}
	b.err, b.errSince = "", time.Time{}
	b.total, b.pools, b.keys = len(names), 0, 0
	for _, n := range names {
		switch scopeKind(n) {
		case kindPool:
			b.pools++
		case kindKey:
			b.keys++
		}
	}
	// A tenant followed from this sample on has no earlier reading to
	// measure against: its first point counts no starts, where top would
	// count every start since its state was created.
	prev := topSample{}
	for name, s := range cur {
		if p, ok := b.prev[name]; ok {
			prev[name] = p
		} else {
			prev[name] = s
		}
	}
	byTenant := rates.byTenant()
	for _, r := range topRows(prev, cur) {
		s := cur[r.tenant]
		b.now = s.Now
		row := newRow(s, r)
		if byTenant != nil {
			row.Decisions = byTenant[r.tenant]
			if row.Decisions == nil {
				row.Decisions = &decisionsJSON{Denied: map[string]float64{}}
			}
		}
		p := prev[r.tenant]
		row.Paused = row.CooldownMS > 0 || (p != nil && p.CooldownUntil.After(p.Now)) || (row.Decisions != nil && row.Decisions.Denied[ruleCooldown] > 0)
		tr := b.tracks[r.tenant]
		if tr == nil {
			tr = &track{}
			b.tracks[r.tenant] = tr
		}
		tr.row, tr.stats = row, s
		if len(tr.points) == b.cfg.points {
			tr.points = slices.Delete(tr.points, 0, 1)
		}
		tr.points = append(tr.points, point{
			T: s.Now.UnixMilli(), StartsPerS: row.StartsPerS, LimitPerS: row.LimitPerS,
			InFlight: row.InFlight, Cap: row.Cap, Waiting: row.Waiting, Reserved: row.Reserved,
			Decisions: row.Decisions,
		})
		idle := row.StartsPerS == 0 && row.InFlight == 0 && row.Waiting == 0 && row.Reserved == 0 && row.CooldownMS == 0
		switch {
		case !idle:
			tr.idleSince = time.Time{}
		case tr.idleSince.IsZero():
			tr.idleSince = time.Now()
		}
	}
	for name := range b.tracks {
		if _, ok := cur[name]; !ok {
			delete(b.tracks, name)
		}
	}
	b.prev = cur
}

func newRow(s *throttle.Stats, r topRow) rowJSON {
	row := rowJSON{
		Tenant: s.Tenant, Kind: scopeKind(s.Tenant), Policy: s.Policy, StartsPerS: round2(r.perSec),
		InFlight: r.inFlight, Cap: r.cap, Reserved: r.reserved,
		CooldownMS: ms(r.cooldown), Waiting: s.Waiting,
		SettledRefunded: r.refunded, SettledExtra: r.extra,
	}
	if !s.WaitingSince.IsZero() {
		row.OldestWaitMS = ms(max(s.Now.Sub(s.WaitingSince), 0))
	}
	if s.Rules != nil {
		row.Rules, row.BacklogCap = s.Rules.String(), s.Rules.Backlog
	}
	if s.Learned != nil {
		row.Learned, row.LimitLearned = learnedText(s), r.learned
	}
	if s.Adaptive != nil {
		row.Adaptive, row.LimitAdaptive = adaptiveText(s), r.adaptive
	}
	if rt, perSec, ok := tightestRate(s); ok {
		row.Limit, row.LimitPerS = limitText(rt), perSec
	}
	if sh := s.Shadow; sh != nil {
		text := "would have denied " + shadowCell(sh)
		if sh.Decisions > 0 {
			text += " starts in the last " + short(s.Now.Sub(sh.Since))
		}
		row.Shadow = &boardShadowJSON{shadowJSON: *toJSON(&throttle.Stats{Shadow: sh}).Shadow,
			DecisionsPerS: round2(r.shadowPerSec), DeniedPerS: round2(r.shadowDeniedPerSec), Text: text}
	}
	return row
}

// ruleCooldown is the rule of a decision denied because its tenant was
// in cooldown (throttle.Decision.Rule).
const ruleCooldown = "cooldown"

// The kinds of the dashboard's lines.
const (
	kindTenant = "tenant"
	kindGlobal = "global"
	kindPool   = "pool"
	kindKey    = "key"
)

// scopeKind is the kind of a line's name: @global, a shared pool, a key
// below a tenant ("acme/user-42") or a tenant.
func scopeKind(name string) string {
	switch {
	case name == throttle.GlobalPolicy:
		return kindGlobal
	case names.Pool(name) == nil:
		return kindPool
	case isKeyName(name):
		return kindKey
	}
	return kindTenant
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

func (b *board) header() boardHeader {
	h := boardHeader{
		IntervalMS: ms(b.cfg.interval),
		HistoryMS:  ms(time.Duration(b.cfg.points) * b.cfg.interval),
		Redis:      b.cn.url.String(),
		Prefix:     b.cn.prefix,
		ReadOnly:   b.cfg.readOnly,
		Error:      b.err,
		ErrorSince: timePtr(b.errSince),
		Now:        timePtr(b.now),
	}
	return h
}

// tenants is the tenants page's document.
func (b *board) tenants() tenantsDoc {
	b.mu.RLock()
	defer b.mu.RUnlock()
	doc := tenantsDoc{
		boardHeader: b.header(), TenantsTotal: b.total, PoolsTotal: b.pools, KeysTotal: b.keys,
		Decisions: b.decided, TenantLabels: b.labelled, MetricsSources: b.sources, Workers: b.workers,
		Tenants: make([]rowJSON, 0, len(b.tracks)),
	}
	if doc.MetricsSources == nil {
		doc.MetricsSources = []sourceJSON{}
	}
	for _, tr := range b.tracks {
		row := tr.row
		from := max(len(tr.points)-sparkPoints, 0)
		row.Spark = make([]float64, 0, len(tr.points)-from)
		for _, p := range tr.points[from:] {
			row.Spark = append(row.Spark, p.StartsPerS)
		}
		doc.Tenants = append(doc.Tenants, row)
	}
	sort.Slice(doc.Tenants, func(i, j int) bool { return doc.Tenants[i].Tenant < doc.Tenants[j].Tenant })
	return doc
}

// tenant is a tenant page's document; ok is false when the tenant is not
// followed.
func (b *board) tenant(name string) (tenantDoc, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	tr, ok := b.tracks[name]
	if !ok {
		return tenantDoc{boardHeader: b.header()}, false
	}
	return tenantDoc{
		boardHeader: b.header(), Tenant: tr.row, Stats: toJSON(tr.stats),
		Points: slices.Clone(tr.points), HistoryFrom: historyMemory,
	}, true
}

func (b *board) serveTenants(w http.ResponseWriter, r *http.Request) {
	serveJSON(w, http.StatusOK, b.tenants())
}

func (b *board) serveTenant(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	doc, ok := b.tenant(name)
	if !ok {
		serveJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf(
			"tenant %q is not followed: it has no policy and no throttle state (or more than --max-tenants tenants have)", name)})
		return
	}
	if h := b.cfg.history; h != nil {
		span := time.Duration(b.cfg.points) * b.cfg.interval
		points, err := h.tenant(r.Context(), name, time.Now().Add(-span), time.Now(), b.cfg.interval, doc.Tenant)
		switch {
		case err != nil:
			doc.HistoryError = err.Error()
		case len(points) == 0:
			doc.HistoryError = "Prometheus has no series of this tenant: the workers label their metrics by tenant only with --tenant-labels"
		default:
			doc.Points, doc.HistoryFrom = joinHistory(points, doc.Points), historyPrometheus
		}
	}
	doc.Next = []nextJSON{}
	if doc.Stats.Waiting > 0 {
		next, err := b.next(r.Context(), name)
		if err != nil {
			serveJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
			return
		}
		doc.Next = next
	}
	serveJSON(w, http.StatusOK, doc)
}

// nextPerLine is how many jobs of each line a tenant's page explains.
const nextPerLine = 10

// next explains the first jobs of each of tenant's lines.
func (b *board) next(ctx context.Context, tenant string) ([]nextJSON, error) {
	heads, err := waitroom.Of(b.cn.limiter).WaitingIDs(ctx, tenant, 1)
	if err != nil {
		return nil, err
	}
	out := []nextJSON{}
	for _, h := range heads {
		xs, err := b.cn.limiter.ExplainLine(ctx, tenant, h.Queue, nextPerLine)
		if err != nil {
			return nil, err
		}
		for _, x := range xs {
			out = append(out, nextJSON{ID: x.ID, Queue: x.Queue, Ahead: x.Ahead, ExpectedInMS: ms(x.Expected.Sub(x.Now)), HeldBy: x.HeldBy, RunningFirst: x.RunningFirst,
				Priority: taskspec.Priority(x.Priority).String()})
		}
	}
	return out, nil
}

// jobDoc is GET /api/jobs/{id}[?queue=Q], what a job's page shows: Job is
// what sluice jobs explain --json prints and Explain what it prints as
// text; Line the job's place in its tenant's line (null when it does not
// wait in one); History what is known of the job's way, oldest first;
// AsynqURL its page in asynq's own UI.
type jobDoc struct {
	boardHeader
	Job      explainDoc  `json:"job"`
	Explain  string      `json:"explain"`
	Line     *lineJSON   `json:"line"`
	History  []eventJSON `json:"history"`
	AsynqURL string      `json:"asynq_url"`
}

// lineJSON is a waiting job's place in its tenant's line: Position counts
// from 1 at the head; Waiting is how many of the tenant's jobs wait, in
// all its lines, at the last sample (0 when the tenant is not followed).
type lineJSON struct {
	Position  int64      `json:"position"`
	Ahead     int64      `json:"ahead"`
	CostAhead int64      `json:"cost_ahead"`
	Cost      int64      `json:"cost"`
	Priority  string     `json:"priority"`
	Since     *time.Time `json:"since"`
	Waiting   int64      `json:"waiting"`
}

// eventJSON is a moment of a job's history; Next marks one to come.
type eventJSON struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
	Next bool      `json:"next,omitempty"`
}

// serveJob is GET /api/jobs/{id}[?queue=Q]: the job's page (jobDoc).
func (b *board) serveJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	in := asynq.NewInspectorFromRedisClient(b.cn.client)
	queues, err := jobQueues(in, r.URL.Query().Get("queue"))
	if err != nil {
		serveJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	found, err := tasksNamed(in, queues, id)
	if err != nil {
		serveJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	switch len(found) {
	case 0:
		serveJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no task %q in %s (a job that finished is gone)", id, queuesText(queues))})
		return
	case 1:
	default:
		serveJSON(w, http.StatusConflict, map[string]string{"error": fmt.Sprintf("task %q is in several queues: give the one you mean with ?queue=", id)})
		return
	}
	info := found[0]
	doc, x, err := explainTask(r.Context(), b.cn, info)
	if err != nil {
		serveJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	var text strings.Builder
	if err := writeExplain(&text, doc, x); err != nil {
		serveJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	b.mu.RLock()
	out := jobDoc{boardHeader: b.header(), Job: doc, Explain: text.String(), History: jobHistory(info, doc, x, time.Now()),
		AsynqURL: asynqRoot + "/queues/" + url.PathEscape(info.Queue) + "/tasks/" + url.PathEscape(info.ID)}
	if x != nil && x.Waiting {
		out.Line = &lineJSON{Position: x.Ahead + 1, Ahead: x.Ahead, CostAhead: x.CostAhead, Cost: x.Cost,
			Priority: taskspec.Priority(x.Priority).String(), Since: timePtr(x.Lined)}
		if tr := b.tracks[doc.Tenant]; tr != nil {
			out.Line.Waiting = tr.stats.Waiting
		}
	}
	b.mu.RUnlock()
	serveJSON(w, http.StatusOK, out)
}

// jobHistory is what asynq and the tenant's line know of a job's way, in
// time order: when it joined its line, its last failure, its completion,
// where it stands now, and what comes next. asynq keeps a job's last
// failure only, not every attempt.
func jobHistory(info *asynq.TaskInfo, doc explainDoc, x *throttle.Explanation, now time.Time) []eventJSON {
	var out []eventJSON
	if x != nil && x.Waiting {
		now = x.Now
		out = append(out, eventJSON{At: x.Lined, What: fmt.Sprintf("joined tenant %s's line in queue %s", human.Text(doc.Tenant), human.Text(info.Queue))})
	}
	if !info.LastFailedAt.IsZero() {
		out = append(out, eventJSON{At: info.LastFailedAt, What: fmt.Sprintf("failed (retried %d of %d): %s", info.Retried, info.MaxRetry, human.Line(info.LastErr, 200))})
	}
	if !info.CompletedAt.IsZero() {
		out = append(out, eventJSON{At: info.CompletedAt, What: "completed"})
	}
	out = append(out, eventJSON{At: now, What: "now: " + explainState(doc, x)})
	switch {
	case x != nil && x.Waiting && x.HeldBy != "turn" && x.HeldBy != "concurrency" && x.Expected.After(x.Now):
		out = append(out, eventJSON{At: x.Expected, What: "expected to start (held by " + x.HeldBy + ")", Next: true})
	case doc.NextProcessAt != nil && doc.NextProcessAt.After(now) && (info.State == asynq.TaskStateScheduled || info.State == asynq.TaskStateRetry):
		out = append(out, eventJSON{At: *doc.NextProcessAt, What: "asynq runs it again", Next: true})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

func serveJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
