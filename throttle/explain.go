package throttle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Explaining a wait: for a job in its tenant's line, what holds it (a
// rule, a learned limit, a cooldown, the concurrency cap, or its turn in
// the fleet) and when it is expected to start, from the tenant's meters
// (and @global's) and the jobs ahead of it in its line. Read-only.
//
// The estimate: under a rate rule of interval I (cost 1) and burst B whose
// meter stands at TAT, a job with C units of cost ahead of it in its line
// and cost c starts at TAT + (C + c − B) × I, or now if that is past (the
// leaky bucket's own arithmetic). Every rate rule, the window (an upper
// bound: it assumes the starts in the window leave it only at its end),
// the quota (the start of the window with room for it) and a cooldown
// give a time; the latest is the estimate, and the rule that gives it
// holds the job. A concurrency cap gives no time: it says how many of the
// tenant's running jobs must end first (their durations are the
// handlers').
//
// Error model: the rate estimate is what the meters promise if the line
// ahead is served without pause; a job leaves its line up to PromoteLead
// (50 ms) before its slot and starts at the slot (the gate holds it), so
// it starts at its estimate plus the scheduling delays of the pump, asynq
// and the worker, its own and those of the jobs ahead of it, which a rule
// of burst 1 never makes up (TestExplainEstimates measures them). A cooldown set, a
// learned limit or a policy changed after the reading moves it; a fleet
// without room (fair share among tenants) or a concurrency cap delays it
// beyond the estimate; @global's rules are counted with the job's own line
// only, not other tenants' jobs that compete for them.

// Explanation says what holds a waiting job and when it is expected to
// start.
type Explanation struct {
	Tenant, Queue, ID string
	// Key is the job's key below its tenant ("" for none): its policy's
	// holds are named with "KEY " before the rule (the jobs of its key
	// ahead of it count there).
	Key string
	// Now is the Redis time of the reading.
	Now time.Time
	// Waiting reports that the job is in its tenant's line; the fields
	// below are zero otherwise.
	Waiting bool
	// Ahead is how many jobs wait ahead of it in its line, CostAhead their
	// cost; Cost is its own, Lined when it joined the line.
	Ahead, CostAhead, Cost int64
	Lined                  time.Time
	// Priority is its level in the line: 1 high, 0 normal, -1 low (the
	// jobs of higher levels are all ahead of it).
	Priority int
	// Expected is when it is expected to start: the latest time any hold
	// gives, Now when none holds it.
	Expected time.Time
	// HeldBy names what holds it: a rule ("rate[0]", "window", "quota",
	// "@global rate[0]", ...), "cooldown", "concurrency" (RunningFirst of
	// the tenant's running jobs must end first), or "turn" (every rule
	// lets it start: it waits for a pump's turn and room in the fleet,
	// shared fairly among tenants).
	HeldBy string
	// Holds lists every rule that holds it, with the time it gives.
	Holds []Hold
	// RunningFirst is how many of the tenant's running jobs must end
	// before a concurrency slot is free for it; 0 without a cap.
	RunningFirst int64
	// Learned is the limit learned from the tenant's downstream, when one
	// is in place; HeldBy is its rule when it holds the job.
	Learned *LearnedLimit
}

// Hold is one reason a job waits.
type Hold struct {
	// Rule names it: "rate[1]", "window", "quota", "cooldown",
	// "concurrency", with "@global " before @global's.
	Rule string
	// Until is when it lets the job start; zero for a concurrency cap.
	Until time.Time
	// Why says it in words.
	Why string
}

// maxExplainScan bounds how far Explain looks along a line for a job.
const maxExplainScan = 1_000_000

// ErrNotWaiting is returned by Explain for a job that is not in its
// tenant's line of the queue (it runs, waits in asynq, or is gone).
var ErrNotWaiting = errors.New("not waiting in its tenant's line")

// Explain says what holds job id of tenant, waiting in its line of queue
// ("" for asynq's default), and when it is expected to start; it returns
// ErrNotWaiting (with an Explanation of the tenant's state) when the job
// is not in the line. It reads the tenant's state and the line up to the
// job (a long line is read in pages), and changes nothing.
func (l *Limiter) Explain(ctx context.Context, tenant, queue, id string) (*Explanation, error) {
	if err := validateTenant(tenant); err != nil {
		return nil, err
	}
	queue = queueOf(queue)
	var ahead []lineEntry
	var found *lineEntry
	level := 0
	const page = 1000
	// the line's levels in the order they leave it: every job of a higher
	// level is ahead
	for i, key := range keysFor(l.cfg.Prefix, tenant).lines(queue) {
		for start := int64(0); found == nil && int64(len(ahead)) < maxExplainScan; start += page {
			ms, err := l.client.LRange(ctx, key, start, start+page-1).Result()
			if err != nil {
				return nil, fmt.Errorf("explain job %s of tenant %q: %w", id, tenant, err)
			}
			for _, m := range ms {
				e, ok := parseLineEntry(m)
				if !ok {
					continue
				}
				if e.id == id {
					found, level = &e, priorities[i]
					break
				}
				ahead = append(ahead, e)
			}
			if len(ms) < page {
				break
			}
		}
		if found != nil {
			break
		}
	}
	st, gst, err := l.explainStats(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if found == nil {
		x := &Explanation{Tenant: tenant, Queue: queue, ID: id, Now: st.Now, Learned: st.Learned}
		return x, fmt.Errorf("job %s of tenant %q in queue %q: %w", id, tenant, queue, ErrNotWaiting)
	}
	var costAhead int64
	var k keyAhead
	for _, e := range ahead {
		costAhead += e.cost
		k.add(found.key, e)
	}
	kst, err := l.keyStats(ctx, tenant, found.key, nil)
	if err != nil {
		return nil, err
	}
	x := explainAt(st, gst, *found, int64(len(ahead)), costAhead)
	x.addKey(kst, found.key, k)
	x.Priority = level
	return &x, nil
}

// keyAhead counts the jobs of one key ahead of a job in its line, and
// their cost.
type keyAhead struct{ n, cost int64 }

func (k *keyAhead) add(key string, e lineEntry) {
	if key != "" && e.key == key {
		k.n++
		k.cost += e.cost
	}
}

// keyStats reads the state of tenant's key when its policy has rules (nil
// otherwise); seen keeps those read already.
func (l *Limiter) keyStats(ctx context.Context, tenant, key string, seen map[string]*Stats) (*Stats, error) {
	if key == "" {
		return nil, nil
	}
	if st, ok := seen[key]; ok {
		return st, nil
	}
	var st *Stats
	_, c, err := l.policies.keyPolicy(ctx, tenant, key)
	if err == nil && c.policy.HasRules() {
		st, err = l.Stats(ctx, keyPolicyName(tenant, key))
	}
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	if seen != nil {
		seen[key] = st
	}
	return st, nil
}

// addKey adds the holds of the job's key (kst: its state; nil when its
// policy has no rules) with k of its jobs ahead of it.
func (x *Explanation) addKey(kst *Stats, key string, k keyAhead) {
	x.Key = key
	if kst == nil {
		return
	}
	x.Holds = append(x.Holds, holdsOf(kst, key+" ", k.cost+x.Cost, k.n, nil)...)
	sort.SliceStable(x.Holds, func(i, j int) bool { return x.Holds[i].Until.After(x.Holds[j].Until) })
	for _, h := range x.Holds {
		if h.Until.After(x.Expected) {
			x.Expected, x.HeldBy = h.Until, h.Rule
		}
		if h.Until.IsZero() && x.HeldBy == "turn" {
			// the key's concurrency cap: its running jobs end first
			x.HeldBy = h.Rule
		}
	}
}

// ExplainLine explains the first n jobs (0: every job) of tenant's line of
// queue, in line order, from one reading of the tenant's state.
func (l *Limiter) ExplainLine(ctx context.Context, tenant, queue string, n int64) ([]Explanation, error) {
	if err := validateTenant(tenant); err != nil {
		return nil, err
	}
	queue = queueOf(queue)
	es, levels, err := l.lineJobs(ctx, tenant, queue, n)
	if err != nil {
		return nil, fmt.Errorf("explain the line: %w", err)
	}
	st, gst, err := l.explainStats(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Explanation, 0, len(es))
	var ahead, costAhead int64
	seen := map[string]*Stats{}
	keys := map[string]keyAhead{}
	for i, e := range es {
		x := explainAt(st, gst, e, ahead, costAhead)
		kst, err := l.keyStats(ctx, tenant, e.key, seen)
		if err != nil {
			return nil, err
		}
		x.addKey(kst, e.key, keys[e.key])
		x.Priority = levels[i]
		out = append(out, x)
		ahead++
		costAhead += e.cost
		if e.key != "" {
			k := keys[e.key]
			k.add(e.key, e)
			keys[e.key] = k
		}
	}
	return out, nil
}

// explainStats reads the tenant's state and, when @global has rules,
// @global's.
func (l *Limiter) explainStats(ctx context.Context, tenant string) (*Stats, *Stats, error) {
	st, err := l.Stats(ctx, tenant)
	if err != nil {
		return nil, nil, fmt.Errorf("explain: %w", err)
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil || !r.global.HasRules() {
		return st, nil, err
	}
	gst, err := l.Stats(ctx, GlobalPolicy)
	if err != nil {
		return nil, nil, fmt.Errorf("explain: %w", err)
	}
	return st, gst, nil
}

// explainAt is the explanation of line entry e with ahead jobs of
// costAhead ahead of it, under the tenant's state st and @global's gst
// (nil: no rules).
func explainAt(st, gst *Stats, e lineEntry, ahead, costAhead int64) Explanation {
	x := Explanation{Tenant: st.Tenant, Queue: e.queue, ID: e.id, Now: st.Now, Waiting: true,
		Ahead: ahead, CostAhead: costAhead, Cost: e.cost, Lined: e.lined, Learned: st.Learned}
	x.Holds = holdsOf(st, "", costAhead+e.cost, ahead, &x)
	if gst != nil {
		x.Holds = append(x.Holds, holdsOf(gst, GlobalPolicy+" ", costAhead+e.cost, ahead, nil)...)
	}
	x.Expected, x.HeldBy = x.Now, "turn"
	for _, h := range x.Holds {
		if h.Until.After(x.Expected) {
			x.Expected, x.HeldBy = h.Until, h.Rule
		}
	}
	if x.HeldBy == "turn" && x.RunningFirst > 0 {
		x.HeldBy = "concurrency"
	}
	return x
}

// holdsOf lists what st's rules say of a job that needs units of cost
// (its own and the line's ahead of it) with ahead jobs before it.
func holdsOf(st *Stats, prefix string, units, ahead int64, x *Explanation) []Hold {
	now := st.Now
	var out []Hold
	add := func(rule string, until time.Time, why string) {
		if until.After(now) {
			out = append(out, Hold{Rule: prefix + rule, Until: until, Why: why})
		}
	}
	if !st.CooldownUntil.IsZero() {
		add("cooldown", st.CooldownUntil, "the tenant is paused (a downstream asked for it, or a handler returned RetryAfter)")
	}
	for _, r := range st.Rates {
		tat := now.Add(max(r.Ahead, r.StartedAhead))
		per := float64(r.Rate.Period) / float64(r.Rate.Limit)
		at := tat.Add(time.Duration(float64(units-r.Rate.burst()) * per))
		why := fmt.Sprintf("%s: %d units of cost ahead of it and its own, one every %s", r.Rate, units-1, time.Duration(per).Round(time.Microsecond))
		if st.Learned != nil && st.Learned.Rule == r.Rule {
			why += ", a limit learned from the downstream (" + st.Learned.Source + ")"
		}
		add(r.Rule, at, why)
	}
	if w := st.Window; w != nil {
		if over := w.Planned + units - w.Window.Limit; over > 0 {
			periods := (over + w.Window.Limit - 1) / w.Window.Limit
			add("window", now.Add(time.Duration(periods)*w.Window.Period),
				fmt.Sprintf("%s: %d started or reserved in the last %s; at the latest when they leave it", w.Window, w.Planned, formatDuration(w.Window.Period)))
		}
	}
	if q := st.Quota; q != nil {
		if over := q.Used + units - q.Quota.Limit; over > 0 {
			windows := (over + q.Quota.Limit - 1) / q.Quota.Limit
			at := q.WindowEnd.Add(time.Duration(windows-1) * q.WindowEnd.Sub(q.WindowStart))
			add("quota", at, fmt.Sprintf("%s: %d used; the job fits in the quota window that starts then", q.Quota, q.Used))
		}
	}
	if c := st.Concurrency; c != nil {
		if need := c.InFlight + ahead + 1 - c.Concurrency.Limit; need > 0 {
			if x != nil {
				x.RunningFirst = need
			}
			out = append(out, Hold{Rule: prefix + "concurrency",
				Why: fmt.Sprintf("%d running of %d; %d of the tenant's running jobs must end first", c.InFlight, c.Concurrency.Limit, need)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Until.After(out[j].Until) })
	return out
}

// String says the explanation in one line.
func (x *Explanation) String() string {
	if !x.Waiting {
		return fmt.Sprintf("job %s of tenant %q is not waiting in its line of %s", x.ID, x.Tenant, x.Queue)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "job %s of tenant %q", x.ID, x.Tenant)
	if x.Key != "" {
		fmt.Fprintf(&b, " (key %s)", x.Key)
	}
	fmt.Fprintf(&b, ": %d ahead of it in its line of %s; ", x.Ahead, x.Queue)
	switch {
	case x.HeldBy == "turn":
		b.WriteString("every rule lets it start now: it waits for its turn")
	case x.HeldBy == "concurrency":
		fmt.Fprintf(&b, "held by concurrency: %d running jobs must end first", x.RunningFirst)
	case x.Key != "" && x.HeldBy == x.Key+" concurrency":
		fmt.Fprintf(&b, "held by its key's concurrency: running jobs of key %s must end first", x.Key)
	default:
		fmt.Fprintf(&b, "held by %s, expected to start in %s", x.HeldBy, formatDuration(x.Expected.Sub(x.Now).Round(time.Millisecond)))
	}
	return b.String()
}
