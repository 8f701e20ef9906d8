package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// decisionsMetric is the workers' counter of the gate's decisions, by
// verdict and rule, and by tenant when a worker labels tenants.
const decisionsMetric = "sluice_worker_decisions_total"

// maxMetricsBody bounds what one scrape reads.
const maxMetricsBody = 16 << 20

// decisionKey is one series of decisionsMetric.
type decisionKey struct{ tenant, verdict, rule string }

// decisionRates is what one round of scrapes measured.
type decisionRates struct {
	perSec   map[decisionKey]float64 // summed over the workers, per second
	labelled bool                    // some worker labels tenants
	sources  []sourceJSON
}

// sourceJSON is one worker's metrics endpoint and how its last scrape went.
// Worker is the worker's id in the fleet's registry, when the dashboard
// found it there; a worker found there that is down, or serves no
// metrics, has an Error and no scrape.
type sourceJSON struct {
	URL    string `json:"url"`
	Worker string `json:"worker,omitempty"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
}

// scraper reads the decisions counters of the workers' /metrics and turns
// the growth between two rounds into rates. It is used by one goroutine.
type scraper struct {
	client *http.Client
	prev   map[string]scrape // by URL, the last good scrape
}

type scrape struct {
	at       time.Time
	values   map[decisionKey]float64
	labelled bool
	err      error
}

func newScraper(timeout time.Duration) *scraper {
	return &scraper{
		client: &http.Client{Timeout: timeout},
		prev:   map[string]scrape{},
	}
}

func (s *scraper) close() { s.client.CloseIdleConnections() }

// round scrapes every URL at once and returns the rates since the previous
// round. A worker seen for the first time, or whose counters went back
// (it restarted), counts from its new values on the next round; one no
// longer among urls is forgotten.
func (s *scraper) round(ctx context.Context, urls []string) decisionRates {
	for u := range s.prev {
		if !slices.Contains(urls, u) {
			delete(s.prev, u)
		}
	}
	cur := make([]scrape, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cur[i] = s.get(ctx, u)
		}()
	}
	wg.Wait()
	out := decisionRates{perSec: map[decisionKey]float64{}}
	for i, u := range urls {
		c := cur[i]
		src := sourceJSON{URL: u, OK: c.err == nil}
		if c.err != nil {
			src.Error = c.err.Error()
			delete(s.prev, u)
			out.sources = append(out.sources, src)
			continue
		}
		out.labelled = out.labelled || c.labelled
		if p, ok := s.prev[u]; ok && c.at.After(p.at) {
			elapsed := c.at.Sub(p.at).Seconds()
			for k, v := range c.values {
				d := v - p.values[k]
				if d < 0 {
					d = v
				}
				out.perSec[k] += d / elapsed
			}
		}
		s.prev[u] = c
		out.sources = append(out.sources, src)
	}
	return out
}

func (s *scraper) get(ctx context.Context, u string) scrape {
	at := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return scrape{err: err}
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := s.client.Do(req)
	if err != nil {
		return scrape{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return scrape{err: fmt.Errorf("%s answered %s", u, resp.Status)}
	}
	values, labelled, err := parseDecisions(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return scrape{err: fmt.Errorf("%s: %w", u, err)}
	}
	return scrape{at: at, values: values, labelled: labelled}
}

// parseDecisions reads decisionsMetric from Prometheus's text format.
func parseDecisions(r io.Reader) (map[decisionKey]float64, bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, false, fmt.Errorf("not Prometheus metrics: %w", err)
	}
	out := map[decisionKey]float64{}
	labelled := false
	// the waiting room's errors (the pump's, the recoverer's, an asynq
	// layout the room does not know), counted beside the decisions
	if ef, ok := families[errorsMetric]; ok {
		for _, m := range ef.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && roomErrorKinds[l.GetValue()] {
					out[decisionKey{verdict: verdictRoomError, rule: l.GetValue()}] += m.GetCounter().GetValue() + m.GetUntyped().GetValue()
				}
			}
		}
	}
	f, ok := families[decisionsMetric]
	if !ok {
		// A worker that has decided nothing yet has no series of it.
		for name := range families {
			if strings.HasPrefix(name, "sluice_worker_") {
				return out, false, nil
			}
		}
		return nil, false, fmt.Errorf("no sluice_worker_* metrics: is this a sluice worker's /metrics?")
	}
	for _, m := range f.GetMetric() {
		var k decisionKey
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "tenant":
				k.tenant, labelled = l.GetValue(), true
			case "verdict":
				k.verdict = l.GetValue()
			case "rule":
				k.rule = l.GetValue()
			}
		}
		if c := m.GetCounter(); c != nil {
			out[k] += c.GetValue()
		} else {
			out[k] += m.GetUntyped().GetValue() // no # TYPE line
		}
	}
	return out, labelled, nil
}

// errorsMetric counts the workers' errors by kind; roomErrorKinds are the
// waiting room's, which the dashboard shows as a failing room.
const (
	errorsMetric     = "sluice_worker_errors_total"
	verdictRoomError = "room_error"
)

var roomErrorKinds = map[string]bool{"room": true, "recover": true, "asynq_layout": true}

// decisionsJSON is decisions per second, summed over the workers scraped:
// allowed, admitted because Redis failed and the policy fails open, and
// denied by rule (rate[0], window, quota, concurrency, cooldown, …); and
// the waiting room's errors per second by kind (room, recover,
// asynq_layout: the room is off), nonzero while the room is failing.
type decisionsJSON struct {
	Allowed    float64            `json:"allowed_per_s"`
	FailOpen   float64            `json:"fail_open_per_s"`
	Denied     map[string]float64 `json:"denied_per_s"`
	RoomErrors map[string]float64 `json:"room_errors_per_s,omitempty"`
}

func (d *decisionsJSON) add(verdict, rule string, v float64) {
	switch verdict {
	case verdictRoomError:
		if v > 0 {
			if d.RoomErrors == nil {
				d.RoomErrors = map[string]float64{}
			}
			d.RoomErrors[rule] += v
		}
	case "allowed":
		d.Allowed += v
	case "fail_open":
		d.FailOpen += v
	case "denied":
		d.Denied[rule] += v
	}
}

// fleet sums every tenant's decisions.
func (r decisionRates) fleet() *decisionsJSON {
	d := &decisionsJSON{Denied: map[string]float64{}}
	for k, v := range r.perSec {
		d.add(k.verdict, k.rule, v)
	}
	return d
}

// byTenant splits the decisions by tenant; nil when no worker labels
// tenants.
func (r decisionRates) byTenant() map[string]*decisionsJSON {
	if !r.labelled {
		return nil
	}
	out := map[string]*decisionsJSON{}
	for k, v := range r.perSec {
		if k.tenant == "" || k.verdict == verdictRoomError {
			continue
		}
		d := out[k.tenant]
		if d == nil {
			d = &decisionsJSON{Denied: map[string]float64{}}
			out[k.tenant] = d
		}
		d.add(k.verdict, k.rule, v)
	}
	return out
}
