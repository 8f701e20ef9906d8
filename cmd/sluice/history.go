package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Where a tenant page's history comes from.
const (
	historyMemory     = "memory"
	historyPrometheus = "prometheus"
)

// Bounds of the queries to Prometheus.
const (
	// maxHistoryPoints bounds the points of one query_range: a long
	// --history is drawn with a coarser step.
	maxHistoryPoints = 600
	// minRateWindow is the least window of the rate() the history asks for:
	// four scrapes at Prometheus's common 15 s interval.
	minRateWindow = time.Minute
	// maxPrometheusBody bounds what one answer reads.
	maxPrometheusBody = 32 << 20
	// historyFresh is how long a tenant's history from Prometheus is
	// reused: a page asks every --interval, and the points since come
	// from the dashboard's own samples.
	historyFresh = 10 * time.Second
	// maxCachedHistories bounds the tenants whose history is kept.
	maxCachedHistories = 100
)

// promHistory reads the tenants' history from a Prometheus server that
// scrapes the workers (--prometheus), over its HTTP API's query_range: it
// outlives the dashboard's restarts and every worker that came and went.
// It is safe for concurrent use.
type promHistory struct {
	base   *url.URL
	client *http.Client

	mu    sync.Mutex
	fresh map[string]cachedHistory // by tenant
}

type cachedHistory struct {
	at     time.Time
	points []point
}

// newPromHistory checks raw, the URL of a Prometheus server (its API is at
// /api/v1/ below it).
func newPromHistory(raw string) (*promHistory, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return nil, fmt.Errorf("want the URL of a Prometheus server that scrapes the workers, such as http://127.0.0.1:9090 (its API is below it, at /api/v1/)")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return &promHistory{base: u, client: &http.Client{Timeout: 10 * time.Second}, fresh: map[string]cachedHistory{}}, nil
}

func (p *promHistory) close() { p.client.CloseIdleConnections() }

// tenant returns the tenant's points between from and to, every step (or
// coarser), from the workers' series labelled with it: starts per second,
// decisions by rule, jobs in flight and waiting. The limit and the cap are
// the row's (its policy's now); reservations are not in Prometheus. No
// series at all (workers without --tenant-labels) is no points. An answer
// is reused for historyFresh.
func (p *promHistory) tenant(ctx context.Context, tenant string, from, to time.Time, step time.Duration, row rowJSON) ([]point, error) {
	p.mu.Lock()
	c, ok := p.fresh[tenant]
	p.mu.Unlock()
	if ok && time.Since(c.at) < historyFresh {
		return slices.Clone(c.points), nil
	}
	points, err := p.ask(ctx, tenant, from, to, step, row)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if len(p.fresh) >= maxCachedHistories {
		clear(p.fresh)
	}
	p.fresh[tenant] = cachedHistory{at: time.Now(), points: points}
	p.mu.Unlock()
	return slices.Clone(points), nil
}

// ask queries Prometheus for the tenant's points.
func (p *promHistory) ask(ctx context.Context, tenant string, from, to time.Time, step time.Duration, row rowJSON) ([]point, error) {
	step = max(step, time.Second, to.Sub(from)/maxHistoryPoints)
	step = step.Round(time.Second)
	window := promDuration(max(4*step, minRateWindow))
	t := promString(tenant)
	queries := []struct {
		name, expr string
	}{
		{"allowed", `sum(rate(sluice_worker_decisions_total{verdict="allowed", tenant=` + t + `}[` + window + `]))`},
		{"fail_open", `sum(rate(sluice_worker_decisions_total{verdict="fail_open", tenant=` + t + `}[` + window + `]))`},
		{"denied", `sum by (rule) (rate(sluice_worker_decisions_total{verdict="denied", tenant=` + t + `}[` + window + `]))`},
		{"in_flight", `sum(sluice_worker_in_flight{tenant=` + t + `})`},
		{"waiting", `max(sluice_room_waiting{tenant=` + t + `})`},
	}
	byT := map[int64]*point{}
	at := func(ts int64) *point {
		pt := byT[ts]
		if pt == nil {
			pt = &point{T: ts, LimitPerS: row.LimitPerS, Cap: row.Cap, Decisions: &decisionsJSON{Denied: map[string]float64{}}}
			byT[ts] = pt
		}
		return pt
	}
	for _, q := range queries {
		series, err := p.queryRange(ctx, q.expr, from, to, step)
		if err != nil {
			return nil, err
		}
		for _, s := range series {
			for _, v := range s.values {
				pt := at(v.t)
				switch q.name {
				case "allowed":
					pt.StartsPerS = round2(v.v)
					pt.Decisions.Allowed = round2(v.v)
				case "fail_open":
					pt.Decisions.FailOpen = round2(v.v)
				case "denied":
					pt.Decisions.Denied[s.metric["rule"]] = round2(v.v)
				case "in_flight":
					pt.InFlight = int64(v.v)
				case "waiting":
					pt.Waiting = int64(v.v)
				}
			}
		}
	}
	out := make([]point, 0, len(byT))
	for _, pt := range byT {
		out = append(out, *pt)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out, nil
}

// joinHistory is Prometheus's points followed by the dashboard's own that
// are newer than its last.
func joinHistory(prom, own []point) []point {
	if len(prom) == 0 {
		return own
	}
	last := prom[len(prom)-1].T
	for i, pt := range own {
		if pt.T > last {
			return append(prom, own[i:]...)
		}
	}
	return prom
}

// promSeries is one series of a range query's answer.
type promSeries struct {
	metric map[string]string
	values []promValue
}

type promValue struct {
	t int64 // Unix ms
	v float64
}

// queryRange asks /api/v1/query_range and reads its matrix.
func (p *promHistory) queryRange(ctx context.Context, expr string, from, to time.Time, step time.Duration) ([]promSeries, error) {
	u := *p.base
	u.Path += "/api/v1/query_range"
	u.RawQuery = url.Values{
		"query": {expr},
		"start": {promTime(from)},
		"end":   {promTime(to)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("prometheus %s: %w", p.base.Redacted(), err)
	}
	defer resp.Body.Close()
	var doc struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPrometheusBody)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("prometheus %s answered %s, not its API's JSON: is it a Prometheus server?", p.base.Redacted(), resp.Status)
	}
	if doc.Status != "success" {
		return nil, fmt.Errorf("prometheus %s: %s: %s", p.base.Redacted(), doc.ErrorType, doc.Error)
	}
	if doc.Data.ResultType != "matrix" {
		return nil, fmt.Errorf("prometheus %s: a range query answered %q, not a matrix", p.base.Redacted(), doc.Data.ResultType)
	}
	out := make([]promSeries, 0, len(doc.Data.Result))
	for _, r := range doc.Data.Result {
		s := promSeries{metric: r.Metric}
		for _, pair := range r.Values {
			ts, okT := pair[0].(float64)
			text, okV := pair[1].(string)
			v, err := strconv.ParseFloat(text, 64)
			if !okT || !okV || err != nil {
				return nil, fmt.Errorf("prometheus %s: unreadable sample %v", p.base.Redacted(), pair)
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			s.values = append(s.values, promValue{t: int64(math.Round(ts * 1000)), v: v})
		}
		out = append(out, s)
	}
	return out, nil
}

// promTime writes t as the API's Unix seconds, to the millisecond.
func promTime(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

// promDuration writes d in PromQL's duration form (whole seconds).
func promDuration(d time.Duration) string {
	return strconv.FormatInt(int64(d.Round(time.Second)/time.Second), 10) + "s"
}

// promString quotes s as a PromQL string literal.
func promString(s string) string { return strconv.Quote(s) }
