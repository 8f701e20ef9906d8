package throttle

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// model is a pure-Go reference of the admission rules, written from the
// semantics in DESIGN.md rather than from admit.lua, and fed the same random
// sequences as the scripts: both must reach identical decisions.
type model struct {
	cfg      Config
	policies map[string]*Policy
	scopes   map[string]*modelScope
	// jobPools, when set, names the shared pools each job draws from
	jobPools func(id string) []string
	// jobKey, when set, names the key below its tenant a job has ("" for
	// none)
	jobKey func(tenant, id string) string
	// charges are where each started job was charged, for its settlement
	charges map[string]modelCharge
}

// modelCharge is a started job's estimate and where it was charged: its
// planned meters at planned (its reservation, or its start), its started
// meters at started.
type modelCharge struct {
	cost, planned, started int64
}

type modelScope struct {
	planned, started []int64 // rate meters (TAT), by rule
	intervals        []int64 // the interval each rate's meters were charged at
	cooldown         int64
	quota            map[int64]int64 // window start -> units counted
	plannedLog       []int64         // window entries, sorted
	startedLog       []int64
	reservations     map[string]int64
	holders          map[string]int64 // id -> lease end
}

func newModel(cfg Config) *model {
	return &model{cfg: cfg.withDefaults(), policies: map[string]*Policy{}, scopes: map[string]*modelScope{}, charges: map[string]modelCharge{}}
}

// meters are rate i's planned and started meters as a decision at now
// reads them under an interval of unit: charged at another interval, the
// time they hold ahead of now is scaled to this one, the started meter's
// only for a longer interval (a lowered rate): it holds starts decided
// already, which a raised rate does not move closer.
func (s *modelScope) meters(i int, unit, now int64) (planned, started int64) {
	planned, started = s.planned[i], s.started[i]
	if i < len(s.intervals) && s.intervals[i] > 0 && s.intervals[i] != unit {
		scale := func(t int64) int64 {
			if t <= now {
				return t
			}
			return now + int64(math.Floor(float64(t-now)*(float64(unit)/float64(s.intervals[i]))))
		}
		planned = scale(planned)
		if unit > s.intervals[i] {
			started = scale(started)
		}
	}
	return planned, started
}

func (m *model) scope(name string) *modelScope {
	s := m.scopes[name]
	if s == nil {
		s = &modelScope{quota: map[int64]int64{}, reservations: map[string]int64{}, holders: map[string]int64{}}
		m.scopes[name] = s
	}
	return s
}

type modelScopeRef struct {
	key    string // state key: tenant or @global
	name   string // policy name reported
	policy *Policy
}

func (m *model) resolve(tenant, key string, pools ...string) []modelScopeRef {
	var out []modelScopeRef
	if tenant != "" {
		p, name := m.policies[tenant], tenant
		if p == nil {
			p, name = m.policies[DefaultPolicy], DefaultPolicy
		}
		if p == nil {
			p = &Policy{}
		}
		out = append(out, modelScopeRef{key: tenant, name: name, policy: p})
		// the job's key, right after its tenant: its own policy, else its
		// tenant's keys', else every tenant's keys'
		if name, p := m.keyPolicy(tenant, key); key != "" && p.HasRules() {
			out = append(out, modelScopeRef{key: tenant + "/" + key, name: name, policy: p})
		}
	}
	if g := m.policies[GlobalPolicy]; g.HasRules() {
		out = append(out, modelScopeRef{key: GlobalPolicy, name: GlobalPolicy, policy: g})
	}
	// the job's shared pools, each once, in the order named
	for i, name := range pools {
		if p := m.policies[name]; p.HasRules() && !slices.Contains(pools[:i], name) {
			out = append(out, modelScopeRef{key: name, name: name, policy: p})
		}
	}
	return out
}

// keyPolicy is the policy of tenant's key and its name (nil: none).
func (m *model) keyPolicy(tenant, key string) (string, *Policy) {
	for _, name := range []string{tenant + "/" + key, tenant + "/*", "*/*"} {
		if p := m.policies[name]; p != nil {
			return name, p
		}
	}
	return "", nil
}

// keyOf is the key job id of tenant has (none unless the scenario sets
// jobKey).
func (m *model) keyOf(tenant, id string) string {
	if m.jobKey == nil {
		return ""
	}
	return m.jobKey(tenant, id)
}

// poolsOf are the shared pools job id draws from (none unless the
// scenario sets jobPools).
func (m *model) poolsOf(id string) []string {
	if m.jobPools == nil {
		return nil
	}
	return m.jobPools(id)
}

// quota windows as the limiter sends them
func modelBounds(q *Quota, now int64) []int64 { return q.bounds(time.UnixMicro(now)) }

func windowOf(bounds []int64, t int64) int {
	for j := 0; j+1 < len(bounds); j++ {
		if bounds[j] <= t && t < bounds[j+1] {
			return j
		}
	}
	return -1
}

// countAfter counts log entries strictly after t.
func countAfter(log []int64, t int64) int64 {
	i := sort.Search(len(log), func(i int) bool { return log[i] > t })
	return int64(len(log) - i)
}

func insertSorted(log []int64, t int64, n int64) []int64 {
	for ; n > 0; n-- {
		i := sort.Search(len(log), func(i int) bool { return log[i] > t })
		log = append(log, 0)
		copy(log[i+1:], log[i:])
		log[i] = t
	}
	return log
}

type modelDecision struct {
	allowed                    bool
	retry                      int64
	rule                       string
	policy                     string
	remaining, reset, inflight int64
	slot                       int64
}

func (m *model) admit(now int64, tenant, id string, cost int64, flags int) modelDecision {
	refs := m.resolve(tenant, m.keyOf(tenant, id), m.poolsOf(id)...)
	if len(refs) == 0 {
		return modelDecision{allowed: true, retry: -1, remaining: -1, reset: -1, inflight: -1}
	}
	horizon, grace := micros(m.cfg.Horizon), micros(m.cfg.Grace)
	reserve, hold, dry, plan := flags&flagReserve != 0, flags&flagHold != 0, flags&flagDry != 0, flags&flagPlan != 0

	type sv struct {
		ref    modelScopeRef
		st     *modelScope
		R      int64
		hasR   bool
		bounds []int64
		cur    int
	}
	svs := make([]*sv, len(refs))
	// the meters as stored, to put back after a dry run: any other
	// decision keeps them re-timed to a changed interval
	type stored struct{ planned, started []int64 }
	raw := make([]stored, len(refs))
	defer func() {
		for i, v := range svs {
			if dry {
				copy(v.st.planned, raw[i].planned)
				copy(v.st.started, raw[i].started)
				continue
			}
			for k, r := range v.ref.policy.Rates {
				for len(v.st.intervals) <= k {
					v.st.intervals = append(v.st.intervals, 0)
				}
				_, unit, _ := rateArgs(r, 1)
				v.st.intervals[k] = unit
			}
		}
	}()
	for i, ref := range refs {
		v := &sv{ref: ref, st: m.scope(ref.key)}
		for len(v.st.planned) < len(ref.policy.Rates) {
			v.st.planned = append(v.st.planned, 0)
			v.st.started = append(v.st.started, 0)
		}
		raw[i] = stored{append([]int64(nil), v.st.planned...), append([]int64(nil), v.st.started...)}
		for k, r := range ref.policy.Rates {
			_, unit, _ := rateArgs(r, 1)
			v.st.planned[k], v.st.started[k] = v.st.meters(k, unit, now)
		}
		if q := ref.policy.Quota; q != nil {
			v.bounds = modelBounds(q, now)
			v.cur = windowOf(v.bounds, now)
		}
		if r, ok := v.st.reservations[id]; ok {
			v.R, v.hasR = r, true
			switch {
			case r+grace <= now:
				v.hasR = false
			case v.st.cooldown > now && r < v.st.cooldown:
				v.hasR = false
			case ref.policy.Quota != nil && r <= now && windowOf(v.bounds, r) != v.cur:
				v.hasR = false
			}
		}
		svs[i] = v
	}

	S := max(now, 0)
	rule, policy := "", ""
	push := func(t int64, r string, v *sv) {
		if t > S {
			S, rule, policy = t, r, v.ref.name
		}
	}
	for _, v := range svs {
		p := v.ref.policy
		if v.st.cooldown > now {
			push(v.st.cooldown, "cooldown", v)
		}
		if v.hasR {
			push(v.R, "reserved", v)
			continue
		}
		for i, r := range p.Rates {
			inc, _, off := rateArgs(r, cost)
			push(v.st.planned[i]+inc-off, ruleName(kindRate, int64(i+1)), v)
		}
		if w := p.Window; w != nil {
			d := micros(w.Period)
			live := v.st.plannedLog[len(v.st.plannedLog)-int(countAfter(v.st.plannedLog, now-d)):]
			if len(live) > 0 {
				push(live[len(live)-1], "window", v)
			}
			// the (limit-cost+1)-th newest live entry must leave the window
			if k := len(live) - int(w.Limit-cost) - 1; k >= 0 {
				push(live[k]+d, "window", v)
			}
		}
	}
	beyond := false
	used := func(v *sv, start int64) int64 { return v.st.quota[start] }
	for changed := true; changed; {
		changed = false
		for _, v := range svs {
			q := v.ref.policy.Quota
			if q == nil || v.hasR {
				continue
			}
			j := windowOf(v.bounds, S)
			for {
				if j < 0 || j > v.cur+1 {
					beyond = true
					break
				}
				if used(v, v.bounds[j])+cost <= q.Limit {
					break
				}
				j++
				if j >= len(v.bounds) {
					beyond = true
					break
				}
				if v.bounds[j] > S {
					push(v.bounds[j], "quota", v)
					changed = true
				}
			}
		}
	}

	charge := func(t int64) {
		for _, v := range svs {
			if v.hasR {
				continue
			}
			p := v.ref.policy
			for i, r := range p.Rates {
				inc, _, _ := rateArgs(r, cost)
				v.st.planned[i] = max(v.st.planned[i], t) + inc
			}
			if p.Window != nil {
				v.st.plannedLog = insertSorted(v.st.plannedLog, t, cost)
			}
			if p.Quota != nil {
				v.st.quota[v.bounds[windowOf(v.bounds, t)]] += cost
			}
		}
	}
	reserveAt := func(t int64) {
		for _, v := range svs {
			p := v.ref.policy
			if len(p.Rates) > 0 || p.Window != nil || p.Quota != nil {
				v.st.reservations[id] = t
			}
		}
	}

	d := modelDecision{retry: 0}
	if S > now {
		d.retry = S - now
		if reserve && !beyond && d.retry <= horizon {
			d.slot = S
			if !dry {
				charge(S)
				reserveAt(S)
			}
		} else if d.retry > horizon {
			d.retry = horizon
		}
	} else if plan {
		d.allowed, d.slot, rule, policy = true, now, "", ""
		if !dry {
			charge(now)
			reserveAt(now)
		}
	} else {
		concWait := int64(-1)
		if hold {
			for _, v := range svs {
				c := v.ref.policy.Concurrency
				if c == nil {
					continue
				}
				live, soonest := int64(0), int64(-1)
				for _, until := range v.st.holders {
					if until > now {
						live++
						if soonest < 0 || until < soonest {
							soonest = until
						}
					}
				}
				mine := v.st.holders[id] > now
				if !mine && live >= c.Limit {
					w := min(soonest-now, micros(m.cfg.ConcurrencyRetry))
					if concWait < 0 || w > concWait {
						concWait, rule, policy = w, "concurrency", v.ref.name
					}
				}
			}
		}
		if concWait >= 0 {
			d.retry = concWait
		} else {
			wait := int64(0)
			rule, policy = "", ""
			for _, v := range svs {
				p := v.ref.policy
				for i, r := range p.Rates {
					inc, unit, off := rateArgs(r, cost)
					tol := min(micros(m.cfg.Tolerance), unit/4)
					if over := max(v.st.started[i], now) + inc - now - off - tol; over > wait {
						wait, rule, policy = over, ruleName(kindRate, int64(i+1)), v.ref.name
					}
				}
				if w := p.Window; w != nil {
					dur := micros(w.Period)
					live := v.st.startedLog[len(v.st.startedLog)-int(countAfter(v.st.startedLog, now-dur)):]
					if k := len(live) - int(w.Limit-cost) - 1; k >= 0 {
						if over := live[k] + dur - now; over > wait {
							wait, rule, policy = over, "window", v.ref.name
						}
					}
				}
			}
			if wait > 0 {
				d.retry = wait
				if reserve && !dry {
					d.slot = now
					charge(now)
					reserveAt(now)
				}
			} else {
				d.allowed = true
				if !dry {
					planned := now
					for _, v := range svs {
						if v.hasR {
							planned = v.R
							break
						}
					}
					if !plan {
						m.charges[tenant+"/"+id] = modelCharge{cost: cost, planned: planned, started: now}
					}
					charge(now)
					for _, v := range svs {
						p := v.ref.policy
						for i, r := range p.Rates {
							inc, _, _ := rateArgs(r, cost)
							v.st.started[i] = max(v.st.started[i], now) + inc
						}
						if w := p.Window; w != nil {
							v.st.startedLog = insertSorted(v.st.startedLog, now, cost)
							v.st.startedLog = v.st.startedLog[len(v.st.startedLog)-int(countAfter(v.st.startedLog, now-micros(w.Period))):]
						}
						delete(v.st.reservations, id)
						if hold && p.Concurrency != nil {
							v.st.holders[id] = now + micros(p.Concurrency.lease())
						}
					}
				}
			}
		}
	}
	if d.allowed {
		d.retry = -1
		rule, policy = "", ""
	}
	d.rule, d.policy = rule, policy

	// what is left
	d.remaining, d.reset, d.inflight = -1, -1, -1
	low := func(n int64) {
		n = max(n, 0)
		if d.remaining < 0 || n < d.remaining {
			d.remaining = n
		}
	}
	high := func(t int64) { d.reset = max(d.reset, max(t, 0)) }
	for _, v := range svs {
		p := v.ref.policy
		for i, r := range p.Rates {
			_, unit, off := rateArgs(r, cost)
			tat := max(v.st.planned[i], now)
			low(floorDiv(now+off-tat, unit))
			high(tat - now)
		}
		if w := p.Window; w != nil {
			dur := micros(w.Period)
			n := countAfter(v.st.plannedLog, now-dur)
			low(w.Limit - n)
			if n > 0 {
				high(v.st.plannedLog[len(v.st.plannedLog)-1] + dur - now)
			} else {
				high(0)
			}
		}
		if q := p.Quota; q != nil {
			low(q.Limit - used(v, v.bounds[v.cur]))
			last := int64(0)
			for j := v.cur; j <= v.cur+1 && j+1 < len(v.bounds); j++ {
				if used(v, v.bounds[j]) > 0 {
					last = v.bounds[j+1]
				}
			}
			high(last - now)
		}
		if c := p.Concurrency; c != nil {
			live := int64(0)
			for _, until := range v.st.holders {
				if until > now {
					live++
				}
			}
			low(c.Limit - live)
			if d.inflight < 0 {
				d.inflight = live
			}
		}
	}
	return d
}

// floorDiv is Lua's math.floor(a / b) for the values the script sees.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func (m *model) release(tenant, id string) {
	for _, ref := range m.resolve(tenant, m.keyOf(tenant, id), m.poolsOf(id)...) {
		if ref.policy.Concurrency != nil {
			delete(m.scope(ref.key).holders, id)
		}
	}
}

func (m *model) renew(now int64, tenant, id string) bool {
	ok := true
	for _, ref := range m.resolve(tenant, m.keyOf(tenant, id), m.poolsOf(id)...) {
		c := ref.policy.Concurrency
		if c == nil {
			continue
		}
		st := m.scope(ref.key)
		if until, held := st.holders[id]; held && until > now {
			st.holders[id] = now + micros(c.lease())
		} else {
			delete(st.holders, id)
			ok = false
		}
	}
	return ok
}

func (m *model) cooldown(now int64, key string, d int64) int64 {
	st := m.scope(key)
	st.cooldown = max(st.cooldown, now+d)
	return st.cooldown
}

// settle moves the charges of job id of tenant from its estimate to actual,
// as DESIGN.md's settled costs say: a window's entries and a quota's count
// as if actual had been charged where the estimate was; a rate's meter by
// the difference of the increments where the job's charge is the last on
// it (the meter stands at the charge time + the estimate's increment) or
// for an extra charge, and a refund is kept on a meter others charged
// after; a meter charged at another interval (its policy changed since)
// is left alone. It reports whether the job had a charge to settle.
func (m *model) settle(now int64, tenant, id string, actual int64) bool {
	c, ok := m.charges[tenant+"/"+id]
	if !ok {
		return false
	}
	delete(m.charges, tenant+"/"+id)
	if actual == c.cost {
		return true
	}
	meter := func(v, t, ie, ic int64) int64 {
		if ic >= ie {
			if max(v, t+ie)+ic-ie <= now && v <= now {
				return v
			}
			return max(v, t+ie) + ic - ie
		}
		if v <= now || v != t+ie {
			return v
		}
		return t + ic
	}
	log := func(l []int64, t, dur, limit int64) []int64 {
		if t+dur <= now {
			return l
		}
		if actual > c.cost {
			return insertSorted(l, t, min(actual-c.cost, limit))
		}
		for n := c.cost - actual; n > 0; n-- {
			i := sort.Search(len(l), func(i int) bool { return l[i] >= t })
			if i == len(l) || l[i] != t {
				break
			}
			l = append(l[:i], l[i+1:]...)
		}
		return l
	}
	for _, ref := range m.resolve(tenant, m.keyOf(tenant, id), m.poolsOf(id)...) {
		st := m.scope(ref.key)
		p := ref.policy
		for i, r := range p.Rates {
			ie, unit, _ := rateArgs(r, c.cost)
			if i >= len(st.planned) || i >= len(st.intervals) || st.intervals[i] != unit {
				// charged at another interval: the policy changed since
				continue
			}
			ic, _, _ := rateArgs(r, actual)
			st.planned[i] = meter(st.planned[i], c.planned, ie, ic)
			st.started[i] = meter(st.started[i], c.started, ie, ic)
		}
		if w := p.Window; w != nil {
			dur := micros(w.Period)
			st.plannedLog = log(st.plannedLog, c.planned, dur, w.Limit)
			st.startedLog = log(st.startedLog, c.started, dur, w.Limit)
		}
		if q := p.Quota; q != nil {
			b := modelBounds(q, c.planned)
			if j := windowOf(b, c.planned); j >= 0 {
				if n, ok := st.quota[b[j]]; ok {
					st.quota[b[j]] = max(n+actual-c.cost, 0)
				}
			}
		}
	}
	return true
}

// modelBlock is a block the model granted: what its return needs.
type modelBlock struct {
	tenant, id string
	n          int64
	slots      int
	lease      int64
	units      []int64
	p1, a1     []int64 // the meters before it
	p2, a2     []int64 // and after it
}

// grantBlock is lua/block.lua's grant: a block for a tenant whose own
// policy has rate and concurrency rules only (and @global none), out of a
// cooldown, with its meters charged at the interval in force; its window a
// quarter of the smallest burst (at most vmax, at least 25 ms); as many
// starts as all conform at now with half the burst kept, charged as if at
// the window's end; a quarter of the free slots within half the limit.
func (m *model) grantBlock(now int64, tenant, id string, want int64, kwant int, vmax int64) (*modelBlock, int64, bool) {
	if tenant == "" || m.policies[GlobalPolicy].HasRules() {
		return nil, 0, false
	}
	p := m.resolve(tenant, "")[0].policy
	if p == nil || p.Window != nil || p.Quota != nil || p.Adapt != nil || (len(p.Rates) == 0 && p.Concurrency == nil) {
		return nil, 0, false
	}
	st := m.scope(tenant)
	if st.cooldown > now {
		return nil, 0, false
	}
	v := vmax
	for _, r := range p.Rates {
		_, _, off := rateArgs(r, 1)
		v = min(v, off/4)
	}
	if v < 25000 {
		return nil, 0, false
	}
	b := &modelBlock{tenant: tenant, id: id, n: want}
	for i, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		var P, A int64
		if i < len(st.planned) {
			P, A = st.planned[i], st.started[i]
			if i < len(st.intervals) && st.intervals[i] != 0 && st.intervals[i] != unit && (P > now || A > now) {
				return nil, 0, false
			}
		}
		top := now + off/2
		b.n = min(b.n, floorDiv(top-max(P, now+v), unit), floorDiv(top-max(A, now+v), unit))
		b.units, b.p1, b.a1 = append(b.units, unit), append(b.p1, P), append(b.a1, A)
	}
	if b.n < 2 {
		return nil, 0, false
	}
	if c := p.Concurrency; c != nil && kwant > 0 {
		live := int64(0)
		for _, until := range st.holders {
			if until > now {
				live++
			}
		}
		k := min(int64(kwant), c.Limit/2-live, floorDiv(c.Limit-live, 4))
		if k < 1 {
			return nil, 0, false
		}
		b.slots, b.lease = int(k), micros(c.lease())
	}
	for len(st.planned) < len(p.Rates) {
		st.planned, st.started, st.intervals = append(st.planned, 0), append(st.started, 0), append(st.intervals, 0)
	}
	for i, unit := range b.units {
		st.planned[i] = max(b.p1[i], now+v) + b.n*unit
		st.started[i] = max(b.a1[i], now+v) + b.n*unit
		st.intervals[i] = unit
		b.p2, b.a2 = append(b.p2, st.planned[i]), append(b.a2, st.started[i])
	}
	for j := 1; j <= b.slots; j++ {
		st.holders[fmt.Sprintf("b%s:%d", id, j)] = now + b.lease
	}
	return b, v, true
}

// returnBlock is lua/block.lua's return: the block's slots freed; on each
// meter where its charge is still the last, the used starts charged from
// the meter before it as if all came at last (at most the window's end),
// or the meter as before it when none was used.
func (m *model) returnBlock(b *modelBlock, unused, last int64) {
	st := m.scope(b.tenant)
	for j := 1; j <= b.slots; j++ {
		delete(st.holders, fmt.Sprintf("b%s:%d", b.id, j))
	}
	used := b.n - unused
	for i, unit := range b.units {
		if i >= len(st.intervals) || st.intervals[i] != unit {
			continue
		}
		back := func(m, m1, m2 int64) int64 {
			if used == 0 {
				return m1
			}
			return max(m1, min(last, m2-b.n*unit)) + used*unit
		}
		P, A := st.planned[i], st.started[i]
		if P == b.p2[i] {
			st.planned[i] = back(P, b.p1[i], b.p2[i])
		}
		if A == b.a2[i] {
			st.started[i] = back(A, b.a1[i], b.a2[i])
		}
	}
}

// renewBlock is lua/block.lua's renew: the block's live slots get a new
// lease; it returns how many.
func (m *model) renewBlock(now int64, b *modelBlock) int {
	st := m.scope(b.tenant)
	n := 0
	for j := 1; j <= b.slots; j++ {
		h := fmt.Sprintf("b%s:%d", b.id, j)
		if until, ok := st.holders[h]; ok && until > now {
			st.holders[h] = now + b.lease
			n++
		}
	}
	return n
}
