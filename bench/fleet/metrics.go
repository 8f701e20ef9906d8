package main

import (
	"math"
	"sort"
	"time"
)

// The report's pure computations: each takes times as parameters, so the
// tests check them without running anything.

// rateWindow is the window over which a tenant's sent rate is compared
// with its limit.
const rateWindow = 10 * time.Second

// rateExcess is how far a tenant's requests went over its rate limit: the
// most requests sent in any window of length w (starting at a request)
// beyond what the limit allows in w (burst + rate·w), as a fraction of
// rate·w. 0 when the limit was never exceeded. times must be sorted.
func rateExcess(times []time.Duration, perSecond, burst int64, w time.Duration) float64 {
	if perSecond <= 0 || w <= 0 {
		return 0
	}
	allowed := float64(max(burst, 1)) + float64(perSecond)*w.Seconds()
	most := 0
	j := 0
	for i := range times {
		for j < len(times) && times[j] < times[i]+w {
			j++
		}
		most = max(most, j-i)
	}
	return max(0, float64(most)-allowed) / (float64(perSecond) * w.Seconds())
}

// nonConforming counts the requests a strict GCRA (rate perSecond, burst,
// allowance) would refuse; a refused request is not charged. times must be
// sorted.
func nonConforming(times []time.Duration, perSecond, burst int64, allowance time.Duration) int {
	g := newGCRA(perSecond, burst, allowance)
	n := 0
	for _, t := range times {
		if !g.conforms(t) {
			n++
			continue
		}
		g.charge(t)
	}
	return n
}

// achievedRate is the rate of a backlogged tenant's requests: after the
// first burst, which starts at once, the rest over the time they took.
// times must be sorted; 0 when there are too few.
func achievedRate(times []time.Duration, burst int64) float64 {
	n := len(times)
	b := int(max(burst, 1))
	if n <= b {
		return 0
	}
	span := (times[n-1] - times[0]).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(n-b) / span
}

// percentile is the nearest-rank p-th percentile (0 < p ≤ 100) of sorted
// values; 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// peakConcurrency is the most requests of a tenant in progress at once at
// the downstream, counting each arriving request (accepted or not).
func peakConcurrency(arr []arrival) int {
	peak := 0
	for _, a := range arr {
		peak = max(peak, int(a.conc))
	}
	return peak
}

// perJob is deliveries divided by jobs (0 for no jobs).
func perJob(deliveries int64, jobs int) float64 { return perJobF(float64(deliveries), jobs) }

// perJobF is n divided by jobs (0 for no jobs).
func perJobF(n float64, jobs int) float64 {
	if jobs == 0 {
		return 0
	}
	return n / float64(jobs)
}

// lostAndDuplicated compares the enqueued jobs with the downstream's 2xx
// answers per job: a job enqueued and never answered 2xx is missing (lost,
// or unfinished if still queued), and answers beyond a job's first are
// duplicates.
func lostAndDuplicated(enqueued []bool, served []uint32) (missing, duplicates int) {
	for i, ok := range enqueued {
		if !ok {
			continue
		}
		switch s := served[i]; {
		case s == 0:
			missing++
		case s > 1:
			duplicates += int(s - 1)
		}
	}
	return missing, duplicates
}

// idealStarts is when each job could have started under its own tenant's
// limits alone, had nothing else been queued: a GCRA of the tenant's rate
// and burst, and conc slots each held for hold. enq must be sorted.
func idealStarts(enq []time.Duration, perSecond, burst, conc int64, hold time.Duration) []time.Duration {
	out := make([]time.Duration, len(enq))
	var g gcra
	if perSecond > 0 {
		g = newGCRA(perSecond, burst, 0)
	}
	var free []time.Duration // when each slot frees up
	if conc > 0 {
		free = make([]time.Duration, conc)
	}
	for i, t := range enq {
		start := t
		if perSecond > 0 {
			start = max(start, g.tat-time.Duration(g.burst-1)*g.interval)
		}
		slot := -1
		if conc > 0 {
			slot = 0
			for k := range free {
				if free[k] < free[slot] {
					slot = k
				}
			}
			start = max(start, free[slot])
		}
		if perSecond > 0 {
			g.charge(start)
		}
		if slot >= 0 {
			free[slot] = start + hold
		}
		out[i] = start
	}
	return out
}

// sortDurations sorts in place and returns its argument.
func sortDurations(d []time.Duration) []time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d
}

// stallMin is how long a tenant's waiting jobs must stand still to count
// as a stall: far longer than any tenant's own limits make a job wait
// between two starts (rates of 1/s or more, service times of at most
// 250 ms).
const stallMin = 10 * time.Second

// stallsOf finds the stretches of at least least in which a tenant had
// a job enqueued and not yet started while none of its requests reached
// the downstream: enq are its jobs' enqueue times and started their first
// 2xx arrival (−1: never), both per job; arrivals are all its requests,
// sorted by time; end closes a stretch still open at the run's end.
func stallsOf(enq, started []time.Duration, arrivals []time.Duration, end, least time.Duration) [][2]time.Duration {
	// waiting(t): jobs enqueued at or before t and not started before t
	type ev struct {
		at time.Duration
		d  int
	}
	evs := make([]ev, 0, 2*len(enq))
	for i, e := range enq {
		if e < 0 {
			continue
		}
		evs = append(evs, ev{e, +1})
		if started[i] >= 0 {
			evs = append(evs, ev{started[i], -1})
		}
	}
	sort.Slice(evs, func(a, b int) bool {
		if evs[a].at != evs[b].at {
			return evs[a].at < evs[b].at
		}
		return evs[a].d > evs[b].d
	})
	var out [][2]time.Duration
	waiting, k, ai := 0, 0, 0
	since := time.Duration(-1) // since when a job waits with no arrival
	for {
		// the next thing that happens: an arrival or a change of waiting
		next := end
		if ai < len(arrivals) {
			next = min(next, arrivals[ai])
		}
		if k < len(evs) {
			next = min(next, evs[k].at)
		}
		if since >= 0 && (ai < len(arrivals) && arrivals[ai] == next || next == end) {
			if next-since >= least {
				out = append(out, [2]time.Duration{since, next})
			}
			since = -1
		}
		if next >= end && (k >= len(evs) || evs[k].at >= end) && (ai >= len(arrivals) || arrivals[ai] >= end) {
			return out
		}
		for ai < len(arrivals) && arrivals[ai] == next {
			ai++
		}
		for k < len(evs) && evs[k].at == next {
			waiting += evs[k].d
			k++
		}
		if waiting > 0 && since < 0 {
			since = next
		}
		if waiting == 0 {
			since = -1
		}
	}
}

// refusal is a request the downstream refused over its tenant's rate, as
// replayed from the tenant's arrivals (refusals).
type refusal struct {
	// early is by how much it missed conformance: (tat − at) −
	// ((burst−1)·interval + allowance), always above 0.
	early time.Duration
	// delay is its delivery delay (handler start to arrival) and
	// prevDelay that of the tenant's previous accepted request;
	// unknownDelay when not known (no start recorded, or no accepted request before it).
	delay, prevDelay time.Duration
	// startEarly is by how much its handler's start missed conformance
	// when the same GCRA is replayed over the handlers' starts (at −
	// delay) instead of the arrivals: 0 or less when the start conformed,
	// so the request became early on its way. Known (startKnown) only
	// when every request of the tenant has a delay.
	startEarly time.Duration
	startKnown bool
	// admitEarly is the same over the times sluice's gate admitted the
	// jobs (at − sinceAdmit); known (admitKnown) only when every request
	// of the tenant says when it was admitted.
	admitEarly time.Duration
	admitKnown bool
}

// explained reports whether the difference in delivery alone accounts for
// the refusal: the previous accepted request took at least early longer
// to arrive than this one, so had both been delivered alike this one
// would have arrived that much later, conforming.
func (r refusal) explained() bool {
	return r.delay != unknownDelay && r.prevDelay != unknownDelay && r.prevDelay-r.delay >= r.early
}

// refusals replays a tenant's GCRA (perSecond, burst, allowance, as the
// downstream enforced it) over its arrivals, in the order the downstream
// saw them, and returns each request refused over the rate with how early
// it came and its and its predecessor's delivery delays; then again over
// the handlers' starts and over the admissions (replayEarly). Only
// accepted requests are charged, as in the downstream; a refused
// request's replay finds it early by more than 0 unless the arrivals are
// not the downstream's.
func refusals(arr []arrival, perSecond, burst int64, allowance time.Duration) []refusal {
	if perSecond <= 0 {
		return nil
	}
	g := newGCRA(perSecond, burst, allowance)
	slack := time.Duration(g.burst-1)*g.interval + g.allowance
	prev := unknownDelay
	var out []refusal
	for _, a := range arr {
		switch a.status {
		case accepted:
			g.charge(a.at)
			prev = a.delay
		case rejectedRate:
			out = append(out, refusal{early: g.tat - a.at - slack, delay: a.delay, prevDelay: prev})
		}
	}
	if len(out) == 0 {
		return out
	}
	starts := replayEarly(arr, perSecond, burst, allowance, func(a arrival) time.Duration { return a.delay })
	admits := replayEarly(arr, perSecond, burst, allowance, func(a arrival) time.Duration { return a.sinceAdmit })
	k := 0
	for i, a := range arr {
		if a.status != rejectedRate {
			continue
		}
		if starts != nil {
			out[k].startEarly, out[k].startKnown = starts[i], true
		}
		if admits != nil {
			out[k].admitEarly, out[k].admitKnown = admits[i], true
		}
		k++
	}
	return out
}

// replayEarly replays a tenant's GCRA over a time before each arrival,
// the arrival's time less lag(a) (a handler's start, an admission), in the
// order of those times, charging the requests the downstream accepted
// there; it returns, by index in arr, by how much each request refused
// over a rate missed conformance at its time (0 or less: it conformed).
// nil when an arrival's lag is not known (unknownDelay).
func replayEarly(arr []arrival, perSecond, burst int64, allowance time.Duration, lag func(arrival) time.Duration) map[int]time.Duration {
	order := make([]int, 0, len(arr))
	for i, a := range arr {
		if lag(a) == unknownDelay {
			return nil
		}
		order = append(order, i)
	}
	at := func(i int) time.Duration { return arr[i].at - lag(arr[i]) }
	sort.SliceStable(order, func(x, y int) bool { return at(order[x]) < at(order[y]) })
	g := newGCRA(perSecond, burst, allowance)
	slack := time.Duration(g.burst-1)*g.interval + g.allowance
	early := map[int]time.Duration{}
	for _, i := range order {
		switch arr[i].status {
		case accepted:
			g.charge(at(i))
		case rejectedRate:
			early[i] = g.tat - at(i) - slack
		}
	}
	return early
}

// lagStats gathers, over every arrival for which lag is known (ok), its
// value, sorted, and counts the others.
func lagStats(arrivals [][]arrival, lag func(arrival) (time.Duration, bool)) (known []time.Duration, unknown int) {
	for _, arr := range arrivals {
		for _, a := range arr {
			d, ok := lag(a)
			if !ok {
				unknown++
				continue
			}
			known = append(known, d)
		}
	}
	return sortDurations(known), unknown
}

// deliveryDelay is an arrival's delivery delay, when known.
func deliveryDelay(a arrival) (time.Duration, bool) { return a.delay, a.delay != unknownDelay }

// admitToStart is the time from an arrival's admission by sluice's gate
// to its handler's start, when both are known (it may be below 0: the
// gate's clock is Redis's).
func admitToStart(a arrival) (time.Duration, bool) {
	return a.sinceAdmit - a.delay, a.delay != unknownDelay && a.sinceAdmit != unknownDelay
}
