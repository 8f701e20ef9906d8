package main

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Outcomes of an arrival at the downstream.
const (
	accepted uint8 = iota
	rejectedRate
	rejectedConc
)

// arrival is one request as the downstream saw it.
type arrival struct {
	at time.Duration // since the run's start
	// delay is the time from the start of the job's handler to this
	// arrival (the request's X-Started header, see stampStart);
	// unknownDelay when the request did not say when its handler started.
	delay time.Duration
	// sinceAdmit is the time from sluice's gate admitting the job (the
	// Redis time of its decision) to this arrival, a little below 0 when
	// the job started just before its reserved slot; unknownDelay when
	// the request did not say (set-ups 1 and 2).
	sinceAdmit time.Duration
	job        int32
	conc       int32 // the tenant's requests in progress, this one included
	status     uint8
}

// unknownDelay is an arrival's delay (or time since admission) when its
// request did not carry the time it is measured from.
const unknownDelay time.Duration = math.MinInt64

// gcra is a strict leaky bucket (the virtual scheduling form of GCRA): a
// request at now conforms when now ≥ tat − (burst−1)·interval − allowance.
// The allowance forgives the jitter between a throttler's decision and the
// request's arrival; it is the same for every set-up.
type gcra struct {
	interval  time.Duration
	burst     int64
	allowance time.Duration
	tat       time.Duration
}

// newGCRA returns a GCRA of perSecond with burst; a rate below 1/s limits
// nothing.
func newGCRA(perSecond, burst int64, allowance time.Duration) gcra {
	g := gcra{burst: max(burst, 1), allowance: allowance}
	if perSecond >= 1 {
		g.interval = time.Second / time.Duration(perSecond)
	}
	return g
}

// conforms reports whether a request at now conforms, without charging it.
func (g *gcra) conforms(now time.Duration) bool {
	return g.tat-now <= time.Duration(g.burst-1)*g.interval+g.allowance
}

// charge records a conforming request at now.
func (g *gcra) charge(now time.Duration) { g.tat = max(g.tat, now) + g.interval }

// dsTenant is what the downstream enforces and records for one tenant.
type dsTenant struct {
	mu       sync.Mutex
	rate     *gcra
	cap      int64
	hold     time.Duration
	running  int64
	arrivals []arrival
}

// downstream is the API the jobs call: it enforces each tenant's limits
// strictly (a GCRA per tenant and a concurrency cap), answers 429 with
// Retry-After: 1 when one is exceeded, holds an accepted request for the
// tenant's hold time, and records every arrival.
type downstream struct {
	start   time.Time
	url     string
	srv     *http.Server
	ln      net.Listener
	tenants []*dsTenant
	served  []atomic.Uint32 // 2xx answers per job
	done    atomic.Int64    // jobs answered 2xx at least once
	lastOK  atomic.Int64    // time of the last 2xx answer, since start (ns)
}

// startDownstream listens on a free loopback port.
func startDownstream(w *workload, allowance time.Duration, start time.Time) (*downstream, error) {
	d := &downstream{start: start, served: make([]atomic.Uint32, len(w.jobs))}
	for _, t := range w.tenants {
		dt := &dsTenant{cap: t.conc, hold: t.hold, arrivals: make([]arrival, 0, t.jobs)}
		if t.rate > 0 {
			g := newGCRA(t.rate, t.burst, allowance)
			dt.rate = &g
		}
		d.tenants = append(d.tenants, dt)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("downstream: %w", err)
	}
	d.ln = ln
	d.url = "http://" + ln.Addr().String() + "/call"
	d.srv = &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.srv.Serve(ln) }()
	return d, nil
}

func (d *downstream) close() { _ = d.srv.Close() }

// ServeHTTP handles one call: headers X-Tenant and X-Job carry the
// tenant's and the job's index, X-Started and X-Admitted (optional) when
// its handler started and when sluice's gate admitted it.
func (d *downstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ti, err1 := strconv.Atoi(r.Header.Get("X-Tenant"))
	ji, err2 := strconv.Atoi(r.Header.Get("X-Job"))
	if err1 != nil || err2 != nil || ti < 0 || ti >= len(d.tenants) || ji < 0 || ji >= len(d.served) {
		http.Error(w, "bad X-Tenant or X-Job header", http.StatusBadRequest)
		return
	}
	stamp := func(h string) int64 {
		v, err := strconv.ParseInt(r.Header.Get(h), 10, 64)
		if err != nil {
			return -1
		}
		return v
	}
	started, admitted := stamp(startedHeader), stamp(admittedHeader)
	t := d.tenants[ti]
	t.mu.Lock()
	wall := time.Now()
	now := wall.Sub(d.start)
	a := arrival{at: now, delay: unknownDelay, sinceAdmit: unknownDelay, job: int32(ji), conc: int32(t.running + 1)}
	// wall clock against wall clock: the handler's start was read in
	// another process, the admission in Redis
	if started >= 0 {
		a.delay = time.Duration(wall.UnixNano() - started)
	}
	if admitted >= 0 {
		a.sinceAdmit = time.Duration(wall.UnixNano() - admitted)
	}
	switch {
	case t.cap > 0 && t.running >= t.cap:
		a.status = rejectedConc
	case t.rate != nil && !t.rate.conforms(now):
		a.status = rejectedRate
	default:
		if t.rate != nil {
			t.rate.charge(now)
		}
		t.running++
	}
	t.arrivals = append(t.arrivals, a)
	t.mu.Unlock()
	if a.status != accepted {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many requests", http.StatusTooManyRequests)
		return
	}
	time.Sleep(t.hold)
	t.mu.Lock()
	t.running--
	t.mu.Unlock()
	// Counted before the answer leaves, so that the run's end is never
	// seen before the last answer.
	if d.served[ji].Add(1) == 1 {
		d.done.Add(1)
	}
	d.lastOK.Store(int64(time.Since(d.start)))
	w.WriteHeader(http.StatusOK)
}

// snapshot returns a copy of every tenant's arrivals.
func (d *downstream) snapshot() [][]arrival {
	out := make([][]arrival, len(d.tenants))
	for i, t := range d.tenants {
		t.mu.Lock()
		out[i] = append([]arrival(nil), t.arrivals...)
		t.mu.Unlock()
	}
	return out
}
