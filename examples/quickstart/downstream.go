package main

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// jitterAllowance is how much the fake API forgives in its rate limits:
// the time between sluice admitting a job and the job's request reaching
// the API (scheduling, the HTTP round trip) varies by a few milliseconds
// from job to job, and by more on a busy machine.
const jitterAllowance = 100 * time.Millisecond

// windowAllowance is the same for a sliding window, whose limit is reached
// by a whole burst of requests at once: the first requests of a burst reach
// the API later than the rest when the machine is busy.
func windowAllowance(w *throttle.Window) time.Duration {
	return max(jitterAllowance, w.Period/10)
}

// api is the fake downstream: an HTTP API that enforces each tenant's
// limits itself, as a real third-party API would, answers 429 with
// Retry-After when one is exceeded, and counts what it saw.
type api struct {
	srv   *http.Server
	url   string
	start time.Time

	mu      sync.Mutex
	tenants map[string]*apiTenant
}

// apiTenant is what the API enforces and records for one tenant.
type apiTenant struct {
	rate   *throttle.Rate
	window *throttle.Window
	cap    int64 // concurrency; 0 when not limited
	hold   time.Duration

	tat      time.Time   // GCRA theoretical arrival time
	arrivals []time.Time // accepted requests
	running  int64
	peak     int64
	served   map[string]int // job id → 2xx answers
	rejected int
	maxInWin int // most accepted requests in one window
}

// startAPI starts the API on a free loopback port with the limits of the
// tenants' policies.
func startAPI(tenants []tenantSpec) (*api, error) {
	a := &api{start: time.Now(), tenants: map[string]*apiTenant{}}
	for _, t := range tenants {
		at := &apiTenant{window: t.policy.Window, hold: t.hold, served: map[string]int{}}
		if len(t.policy.Rates) > 0 {
			r := t.policy.Rates[0]
			at.rate = &r
		}
		if c := t.policy.Concurrency; c != nil {
			at.cap = c.Limit
		}
		a.tenants[t.name] = at
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake API: %w", err)
	}
	a.url = "http://" + ln.Addr().String() + "/v1/send"
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/send", a.send)
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

func (a *api) close() { _ = a.srv.Close() }

// send is the API's one endpoint: it checks the caller's limits, holds the
// request for the tenant's job duration, and answers 200.
func (a *api) send(w http.ResponseWriter, r *http.Request) {
	tenant, job := r.Header.Get("X-Tenant"), r.Header.Get("X-Job")
	a.mu.Lock()
	t := a.tenants[tenant]
	if t == nil {
		a.mu.Unlock()
		http.Error(w, "unknown tenant", http.StatusBadRequest)
		return
	}
	now := time.Now()
	if why := t.admit(now); why != "" {
		t.rejected++
		a.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "429 too many requests: "+why, http.StatusTooManyRequests)
		return
	}
	a.mu.Unlock()

	time.Sleep(t.hold)

	a.mu.Lock()
	t.running--
	t.served[job]++
	a.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// admit applies the tenant's limits to a request arriving at now and
// records it; it returns why the request is refused, or "".
func (t *apiTenant) admit(now time.Time) string {
	if t.cap > 0 && t.running >= t.cap {
		return fmt.Sprintf("more than %d requests at once", t.cap)
	}
	var tat time.Time
	if r := t.rate; r != nil {
		interval := r.Interval()
		tat = t.tat
		if tat.Before(now) {
			tat = now
		}
		burst := max(r.Burst, 1)
		if tat.Sub(now) > time.Duration(burst-1)*interval+jitterAllowance {
			return fmt.Sprintf("more than %s", r)
		}
		tat = tat.Add(interval)
	}
	inWin := 0
	if w := t.window; w != nil {
		from := now.Add(-(w.Period - windowAllowance(w)))
		i := sort.Search(len(t.arrivals), func(i int) bool { return t.arrivals[i].After(from) })
		inWin = len(t.arrivals) - i
		if int64(inWin) >= w.Limit {
			return fmt.Sprintf("more than %d in %s", w.Limit, w.Period)
		}
	}
	if t.rate != nil {
		t.tat = tat
	}
	t.arrivals = append(t.arrivals, now)
	t.maxInWin = max(t.maxInWin, inWin+1)
	t.running++
	t.peak = max(t.peak, t.running)
	return ""
}

// tenantView is a snapshot of one tenant as the API saw it.
type tenantView struct {
	done       int // distinct jobs answered 2xx
	duplicates int // 2xx answers beyond the first for a job
	rejected   int
	running    int64
	peak       int64
	maxInWin   int
	lastSecond int // requests accepted in the last second
	first      time.Time
	last       time.Time
	accepted   int
}

func (a *api) view(tenant string) tenantView {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tenants[tenant]
	v := tenantView{rejected: t.rejected, running: t.running, peak: t.peak, maxInWin: t.maxInWin, accepted: len(t.arrivals)}
	for _, n := range t.served {
		v.done++
		v.duplicates += n - 1
	}
	if n := len(t.arrivals); n > 0 {
		v.first, v.last = t.arrivals[0], t.arrivals[n-1]
		from := time.Now().Add(-time.Second)
		v.lastSecond = n - sort.Search(n, func(i int) bool { return t.arrivals[i].After(from) })
	}
	return v
}
