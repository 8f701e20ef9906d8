package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// Adaptive limits: a rate rule that adapts between a floor and a ceiling
// (rate=50/s adapt=10..200/s) to what its downstream answers, fleet-wide,
// by AIMD: it starts at the rule's rate, rises by a step per interval
// while the answers are good and the limit is used, and is cut to
// adaptCut of itself on throttled answers (429, 503) or too many slow
// ones, at most once per interval. The workers count what their
// downstream answered and report it at most once per interval per tenant
// (Limiter.Adapt); lua/adapt.lua decides for the fleet. Like a learned
// limit the adapted value is an overlay on the policy: it lives under the
// tenant's hash tag (PREFIX:{t:TENANT}:e, expiring adaptIdle after the
// last report), is read with the tenant's policy into the PolicyStore's
// cache, and is merged into the policy where it is resolved, as the rule's
// limit: admit.lua sees an ordinary rate. A change is announced as a
// learned limit's is, and drops that tenant's cached entry only.

// AdaptRule makes one rate rule of a policy adapt (text form
// adapt=FLOOR..CEILING/PERIOD, with adapt_step=N, adapt_every=DURATION and
// adapt_latency=DURATION): the rate of the policy whose period is Period
// starts at its limit and moves between Floor and Ceiling per Period.
type AdaptRule struct {
	Floor, Ceiling int64
	Period         time.Duration
	// Step is how much an increase adds (per Period); 0 means
	// max(1, Ceiling/50).
	Step int64
	// Every is the least time between two increases, and between two
	// decreases; 0 means AdaptEveryDefault.
	Every time.Duration
	// Latency, when set, also cuts the limit when more than a tenth of the
	// answers of a report took longer than it.
	Latency time.Duration
}

// AdaptEveryDefault is how often an adaptive limit may change at most
// (once up and once down) when adapt_every is not given.
const AdaptEveryDefault = time.Second

const (
	// adaptCut is the multiplicative decrease, in thousandths: a
	// throttled answer cuts the limit to three quarters.
	adaptCut = 750
	// adaptIdle is how long an adaptive limit outlives its last report:
	// past it, the rule starts again from the policy's rate.
	adaptIdle = 10 * time.Minute
	// adaptHistory is how many changes the state keeps.
	adaptHistory = 50
	// minAdaptEvery bounds adapt_every from below (each interval costs a
	// report per worker and a change a round trip per process).
	minAdaptEvery = 50 * time.Millisecond
	maxAdaptEvery = time.Hour
)

// step is the additive increase with the default filled in.
func (a *AdaptRule) step() int64 {
	if a.Step > 0 {
		return a.Step
	}
	return max(1, a.Ceiling/50)
}

// every is the interval with the default filled in.
func (a *AdaptRule) every() time.Duration { return cmp.Or(a.Every, AdaptEveryDefault) }

func (a *AdaptRule) rangeText() string {
	return fmt.Sprintf("%d..%d/%s", a.Floor, a.Ceiling, formatPeriod(a.Period))
}

// parseAdapt reads one of the adapt options into p.
func (p *Policy) parseAdapt(key, val string) error {
	if p.Adapt == nil {
		p.Adapt = &AdaptRule{}
	}
	a := p.Adapt
	switch key {
	case "adapt":
		lim, per, ok := strings.Cut(val, "/")
		lo, hi, ok2 := strings.Cut(lim, "..")
		if !ok || !ok2 {
			return &PolicyError{key, val, "want FLOOR..CEILING/PERIOD, e.g. rate=50/s adapt=10..200/s"}
		}
		floor, err1 := strconv.ParseInt(lo, 10, 64)
		ceil, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 != nil || err2 != nil {
			return &PolicyError{key, val, "the floor and the ceiling are whole numbers, e.g. adapt=10..200/s"}
		}
		period, err := parsePeriod(per)
		if err != nil {
			return &PolicyError{key, val, err.Error()}
		}
		a.Floor, a.Ceiling, a.Period = floor, ceil, period
	case "adapt_step":
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 1 {
			return &PolicyError{key, val, "must be a whole number of at least 1 (what an increase adds, in adapt's period)"}
		}
		a.Step = n
	case "adapt_every", "adapt_latency":
		d, err := time.ParseDuration(val)
		if err != nil || d <= 0 {
			return &PolicyError{key, val, "must be a positive duration such as 500ms or 2s"}
		}
		if key == "adapt_every" {
			a.Every = d
		} else {
			a.Latency = d
		}
	}
	return nil
}

// formatAdapt appends the adapt options of p's text form.
func (p *Policy) formatAdapt(parts []string) []string {
	a := p.Adapt
	if a == nil {
		return parts
	}
	parts = append(parts, "adapt="+a.rangeText())
	if a.Step > 0 {
		parts = append(parts, fmt.Sprintf("adapt_step=%d", a.Step))
	}
	if a.Every > 0 {
		parts = append(parts, "adapt_every="+formatDuration(a.Every))
	}
	if a.Latency > 0 {
		parts = append(parts, "adapt_latency="+formatDuration(a.Latency))
	}
	return parts
}

// adaptIndex is the index of the rate rule p's adapt rule adapts: the
// first rate of its period (a learned limit, appended last, is never it).
func (p *Policy) adaptIndex() int {
	if p == nil || p.Adapt == nil {
		return -1
	}
	return slices.IndexFunc(p.Rates, func(r Rate) bool { return r.Period == p.Adapt.Period })
}

// validateAdapt checks the adapt rule against the policy's rates.
func (p *Policy) validateAdapt() error {
	a := p.Adapt
	if a == nil {
		return nil
	}
	if a.Period == 0 {
		opt := "adapt_step"
		if a.Every > 0 {
			opt = "adapt_every"
		}
		if a.Latency > 0 {
			opt = "adapt_latency"
		}
		return &PolicyError{Msg: fmt.Sprintf("%s belongs to adapt; add adapt=FLOOR..CEILING/PERIOD, e.g. rate=50/s adapt=10..200/s", opt)}
	}
	r := a.rangeText()
	switch {
	case a.Floor < 1:
		return &PolicyError{"adapt", r, "the floor must be at least 1"}
	case a.Floor > a.Ceiling:
		return &PolicyError{"adapt", r, fmt.Sprintf("the floor %d is above the ceiling %d; write the lower first: adapt=%d..%d/%s", a.Floor, a.Ceiling, a.Ceiling, a.Floor, formatPeriod(a.Period))}
	case a.Step > a.Ceiling:
		return &PolicyError{"adapt_step", strconv.FormatInt(a.Step, 10), fmt.Sprintf("is above the ceiling %d; a step is what one increase adds", a.Ceiling)}
	case a.Every != 0 && (a.Every < minAdaptEvery || a.Every > maxAdaptEvery):
		return &PolicyError{"adapt_every", formatDuration(a.Every), fmt.Sprintf("must be from %s to %s", formatDuration(minAdaptEvery), formatDuration(maxAdaptEvery))}
	case a.Latency > time.Hour:
		return &PolicyError{"adapt_latency", formatDuration(a.Latency), "must be at most 1h"}
	}
	if err := (Rate{Limit: a.Ceiling, Period: a.Period, Burst: 1}).validate("adapt's ceiling"); err != nil {
		return &PolicyError{"adapt", r, err.Error()}
	}
	if len(p.Rates) == 0 {
		return &PolicyError{"adapt", r, fmt.Sprintf("adapts a rate rule and the policy has none; give the rate it starts from, e.g. rate=%d/%s adapt=%s", a.Ceiling, formatPeriod(a.Period), r)}
	}
	var same []string
	for _, rt := range p.Rates {
		if rt.Period == a.Period {
			same = append(same, rt.String())
		}
	}
	switch len(same) {
	case 0:
		var have []string
		for _, rt := range p.Rates {
			have = append(have, rt.String())
		}
		return &PolicyError{"adapt", r, fmt.Sprintf("no rate per %s to adapt (the policy's rates: %s); write adapt in the period of the rate it adapts, e.g. rate=50/s adapt=10..200/s", formatPeriod(a.Period), strings.Join(have, ", "))}
	case 1:
	default:
		return &PolicyError{"adapt", r, fmt.Sprintf("the policy has %d rates per %s (%s); adapt follows one, so give only one rate in adapt's period", len(same), formatPeriod(a.Period), strings.Join(same, ", "))}
	}
	start := p.Rates[p.adaptIndex()]
	if start.Limit < a.Floor || start.Limit > a.Ceiling {
		return &PolicyError{"adapt", r, fmt.Sprintf("the rate %s it starts from is outside %s; start inside it (rate=%d/%s) or widen the range", start, r, min(max(start.Limit, a.Floor), a.Ceiling), formatPeriod(a.Period))}
	}
	return nil
}

// adaptsGlobal refuses an adaptive rule in @global's policy: the state
// of an adaptive rule is a tenant's.
func adaptsGlobal(name string, p *Policy) error {
	if name == GlobalPolicy && p != nil && p.Adapt != nil {
		return &PolicyError{"adapt", p.Adapt.rangeText(), "@global cannot adapt (an adaptive limit is a tenant's); put adapt in the tenants' policies or the default \"*\""}
	}
	return nil
}

// atCeiling is p with its adaptive rule at its ceiling: the most the
// policy may allow (a declared limit is below the policy when it is below
// that).
func (p *Policy) atCeiling() *Policy {
	i := p.adaptIndex()
	if i < 0 {
		return p
	}
	cp := *p
	cp.Rates = slices.Clone(p.Rates)
	cp.Rates[i].Limit = p.Adapt.Ceiling
	return &cp
}

// AdaptiveLimit is the state of a tenant's adaptive rule.
type AdaptiveLimit struct {
	// Rule is the rule that adapts ("rate[0]"), and Rate its current rate
	// (the rule's burst kept): the one the tenant's jobs are admitted by.
	Rule string
	Rate Rate
	// Floor, Ceiling and Step are the policy's, per Rate.Period; Every
	// the interval.
	Floor, Ceiling, Step int64
	Every                time.Duration
	// Seq counts the changes since the state began; 0 when it has not
	// begun (no report yet, or it lapsed): the rate is the policy's.
	Seq int64
	// Increases and Decreases count them by kind.
	Increases, Decreases int64
	// Until is when the state lapses without reports (the limit starts
	// again from the policy's rate); zero when none is kept.
	Until time.Time
	// History lists the last changes, oldest first (Stats only).
	History []AdaptChange
}

// AdaptChange is one change of an adaptive limit: From and To are limits
// per the rule's period. Reason is "start" (the state began at the
// policy's rate), "policy" (the policy changed: a new rate starts again,
// a new floor or ceiling clamps), "increase", "throttled" (429 or 503) or
// "latency" (too many slow answers); "" when nothing changed (then From
// and To are the current limit).
type AdaptChange struct {
	At       time.Time
	From, To int64
	Reason   string
}

// AdaptReport is what a worker's downstream answered for one tenant since
// its last report: good answers, throttled ones (429, 503) and answers
// slower than the rule's latency target (not counted as good). Seq is the
// AdaptiveLimit.Seq the throttled and slow answers were sent under (the
// highest of them); 0 when unknown.
type AdaptReport struct {
	OK, Throttled, Slow int64
	Seq                 int64
}

// Adapt reports what tenant's downstream answered to the tenant's
// adaptive rule, which decides for the fleet (lua/adapt.lua): at most one
// increase and one decrease per interval, whoever reports. It returns the
// change it made, or the current limit (Reason empty). A tenant whose
// policy does not adapt gets the zero AdaptChange and nothing is written.
// Report at most once per interval per tenant and process: every call is
// a round trip, and a change is one more (the announcement).
func (l *Limiter) Adapt(ctx context.Context, tenant string, rep AdaptReport) (AdaptChange, error) {
	if err := validateTenant(tenant); err != nil {
		return AdaptChange{}, err
	}
	if rep.OK < 0 || rep.Throttled < 0 || rep.Slow < 0 || rep.Seq < 0 {
		return AdaptChange{}, fmt.Errorf("adapt tenant %q: report %+v: counts must not be negative", tenant, rep)
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return AdaptChange{}, fmt.Errorf("adapt tenant %q: %w", tenant, err)
	}
	p := r.stored
	i := p.adaptIndex()
	if i < 0 {
		return AdaptChange{}, nil
	}
	a := p.Adapt
	k := keysFor(l.cfg.Prefix, tenant)
	res, err := l.batch.run(ctx, lua.Adapt, []string{k.adapt}, []any{
		l.clockArg(), p.Rates[i].Limit, micros(a.Period), a.Floor, a.Ceiling, a.step(), micros(a.every()),
		rep.OK, rep.Throttled, rep.Slow, rep.Seq, adaptIdle.Milliseconds(), adaptHistory, adaptCut,
	})
	if err != nil {
		return AdaptChange{}, fmt.Errorf("adapt tenant %q: %w", tenant, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 6 {
		return AdaptChange{}, fmt.Errorf("adapt.lua: unexpected reply %v", res)
	}
	ints, err := int64s(arr[:5], 5)
	if err != nil {
		return AdaptChange{}, fmt.Errorf("adapt.lua: %w", err)
	}
	reason, _ := arr[5].(string)
	c := AdaptChange{At: time.UnixMicro(ints[3]), From: ints[4], To: ints[0], Reason: reason}
	if ints[2] == 0 {
		c.From, c.Reason = c.To, ""
		return c, nil
	}
	if err := l.policies.announceTenant(ctx, tenant); err != nil {
		return c, fmt.Errorf("adapt tenant %q: announce the change: %w", tenant, err)
	}
	return c, nil
}

// adaptState is a tenant's adaptive state as cached.
type adaptState struct {
	v, seq, ni, nd int64
	cfg            string
	until          time.Time // local time it lapses
}

// readAdapt adds to pipe the read of tenant's adaptive state; the
// function it returns decodes it once the pipeline ran (nil: none, or one
// that cannot be read, which lapses by itself).
func readAdapt(ctx context.Context, pipe redis.Pipeliner, key string) func(now time.Time) *adaptState {
	get := pipe.HMGet(ctx, key, "v", "n", "c", "ni", "nd")
	ttl := pipe.PTTL(ctx, key)
	return func(now time.Time) *adaptState {
		vals, err := get.Result()
		d, terr := ttl.Result()
		if err != nil || terr != nil || d <= 0 || len(vals) != 5 {
			return nil
		}
		var n [5]int64
		for i, v := range vals {
			s, ok := v.(string)
			if i == 2 {
				continue
			}
			if !ok {
				return nil
			}
			if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				return nil
			}
		}
		cfg, _ := vals[2].(string)
		if n[0] < 1 {
			return nil
		}
		return &adaptState{v: n[0], seq: n[1], cfg: cfg, ni: n[3], nd: n[4], until: now.Add(d)}
	}
}

// mergeAdapt is base with its adaptive rule at the state's limit (st nil:
// the policy's rate), and the rule's state; base itself when it does not
// adapt.
func mergeAdapt(base *Policy, st *adaptState) (*Policy, *AdaptiveLimit) {
	i := base.adaptIndex()
	if i < 0 {
		return base, nil
	}
	a := base.Adapt
	start := base.Rates[i]
	al := &AdaptiveLimit{Rule: fmt.Sprintf("rate[%d]", i), Rate: start, Floor: a.Floor, Ceiling: a.Ceiling, Step: a.step(), Every: a.every()}
	if st == nil {
		return base, al
	}
	al.Seq, al.Increases, al.Decreases, al.Until = st.seq, st.ni, st.nd, st.until
	v := st.v
	if st.cfg != adaptConfig(start.Limit, a) {
		// the policy changed since the last report, which will record it:
		// a new start (or period) starts from it, a new range clamps
		v = min(max(v, a.Floor), a.Ceiling)
		if ostart, rest, _ := strings.Cut(st.cfg, ":"); ostart != strconv.FormatInt(start.Limit, 10) ||
			!strings.HasPrefix(rest, strconv.FormatInt(micros(a.Period), 10)+":") {
			v = start.Limit
		}
	}
	if v == start.Limit {
		return base, al
	}
	p := *base
	p.Rates = slices.Clone(base.Rates)
	p.Rates[i].Limit = v
	al.Rate = p.Rates[i]
	return &p, al
}

// adaptConfig is what adapt.lua records of the policy it follows.
func adaptConfig(start int64, a *AdaptRule) string {
	return fmt.Sprintf("%d:%d:%d:%d", start, micros(a.Period), a.Floor, a.Ceiling)
}

// adaptive reads tenant's adaptive rule under policy p fresh from Redis,
// with its history (for Stats); nil when p does not adapt.
func (l *Limiter) adaptive(ctx context.Context, tenant string, p *Policy) (*AdaptiveLimit, error) {
	if p.adaptIndex() < 0 {
		return nil, nil
	}
	key := keysFor(l.cfg.Prefix, tenant).adapt
	var read func(time.Time) *adaptState
	var hist *redis.SliceCmd
	if _, err := l.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		read = readAdapt(ctx, pipe, key)
		hist = pipe.HMGet(ctx, key, "h")
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("adaptive limit of tenant %q: %w", tenant, err)
	}
	_, al := mergeAdapt(p, read(time.Now()))
	if vals, err := hist.Result(); err == nil && len(vals) == 1 {
		h, _ := vals[0].(string)
		al.History = parseAdaptHistory(h)
	}
	return al, nil
}

// parseAdaptHistory reads adapt.lua's history lines "ms from to reason";
// a line that cannot be read is left out.
func parseAdaptHistory(h string) []AdaptChange {
	var out []AdaptChange
	for _, line := range strings.Split(h, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			continue
		}
		ms, e1 := strconv.ParseInt(f[0], 10, 64)
		from, e2 := strconv.ParseInt(f[1], 10, 64)
		to, e3 := strconv.ParseInt(f[2], 10, 64)
		if e1 != nil || e2 != nil || e3 != nil {
			continue
		}
		out = append(out, AdaptChange{At: time.UnixMilli(ms), From: from, To: to, Reason: f[3]})
	}
	return out
}
