package throttle

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Rate is a leaky bucket used as a meter (GCRA): Limit units per Period
// sustained, at most Burst back to back from a full bucket. The zero Burst
// means 1: perfectly even spacing.
//
// Its text form is "100/s" or "100/s burst 20" (String), and in a policy
// "rate=100/s burst=20". A policy may hold up to MaxRates of them.
type Rate struct {
	Limit  int64
	Period time.Duration
	Burst  int64
}

// MaxRates is the most rate rules one policy may have.
const MaxRates = 12

// PerSecond is a rate of n per second with burst 1.
func PerSecond(n int64) Rate { return Rate{Limit: n, Period: time.Second, Burst: 1} }

// PerMinute is a rate of n per minute with burst 1.
func PerMinute(n int64) Rate { return Rate{Limit: n, Period: time.Minute, Burst: 1} }

// PerHour is a rate of n per hour with burst 1.
func PerHour(n int64) Rate { return Rate{Limit: n, Period: time.Hour, Burst: 1} }

func (r Rate) burst() int64 {
	if r.Burst == 0 {
		return 1
	}
	return r.Burst
}

// String prints the rate as "100/s" or "100/s burst 20".
func (r Rate) String() string {
	s := fmt.Sprintf("%d/%s", r.Limit, formatPeriod(r.Period))
	if b := r.burst(); b != 1 {
		s += fmt.Sprintf(" burst %d", b)
	}
	return s
}

// ParseRate reads the String form of a Rate: "100/s", "100/s burst 20".
func ParseRate(text string) (Rate, error) {
	fields := strings.Fields(text)
	if len(fields) != 1 && !(len(fields) == 3 && fields[1] == "burst") {
		return Rate{}, fmt.Errorf("rate %q: want N/PERIOD optionally followed by \"burst B\", e.g. \"100/s burst 20\"", text)
	}
	n, p, err := parseLimitPeriod("rate", fields[0])
	if err != nil {
		return Rate{}, err
	}
	r := Rate{Limit: n, Period: p, Burst: 1}
	if len(fields) == 3 {
		if r.Burst, err = parseCount("burst", fields[2]); err != nil {
			return Rate{}, err
		}
	}
	return r, r.validate("rate")
}

// Interval is the time one unit of cost takes from the bucket: Period/Limit.
func (r Rate) Interval() time.Duration {
	if r.Limit <= 0 {
		return 0
	}
	return r.Period / time.Duration(r.Limit)
}

func (r Rate) validate(name string) error {
	if r.Limit <= 0 {
		return fmt.Errorf("%s %d/%s: the limit must be at least 1", name, r.Limit, formatPeriod(r.Period))
	}
	if r.Period < time.Millisecond {
		return fmt.Errorf("%s %d/%s: the period must be at least 1ms", name, r.Limit, r.Period)
	}
	if r.Burst < 0 {
		return fmt.Errorf("%s %s: burst %d must be at least 1", name, r.String(), r.Burst)
	}
	if r.Period/time.Duration(r.Limit) < time.Microsecond {
		return fmt.Errorf("%s %d/%s: more than one unit per microsecond is not supported; use a longer period", name, r.Limit, formatPeriod(r.Period))
	}
	if err := checkSpan("the period "+formatDuration(r.Period), r.Period); err != nil {
		return fmt.Errorf("%s %s: %v; use a quota (quota=N reset=\"CRON\") for limits over long periods", name, r, err)
	}
	if span, ok := r.span(); !ok || span > micros(MaxSpan) {
		full := float64(micros(r.Period)) * float64(r.burst()) / float64(r.Limit)
		return fmt.Errorf("%s %s: a full bucket spans %d × %s = %s; the engine computes exactly only up to %s: give burst %d or less, or use a quota (quota=N/day, /week, /month) for limits over long periods",
			name, r, r.burst(), formatDuration(r.Interval()), spanText(full), maxSpanText, r.maxBurst())
	}
	return nil
}

// span is the time a full bucket spans, in microseconds: the burst offset
// admit.lua adds to its meters (ceil(period × burst / limit)); false when
// it does not fit in 64 bits.
func (r Rate) span() (int64, bool) {
	return mulDivCeilExact(micros(r.Period), r.burst(), r.Limit)
}

// maxBurst is the largest burst whose bucket spans at most MaxSpan.
func (r Rate) maxBurst() int64 {
	hi, lo := bits.Mul64(uint64(micros(MaxSpan)), uint64(r.Limit))
	q, _ := bits.Div64(hi, lo, uint64(micros(r.Period)))
	return int64(q)
}

// uniqueRates drops each rate that is the same rule as an earlier one: the
// same interval and burst, hence the same arguments to admit.lua.
func uniqueRates(rates []Rate) []Rate {
	out := rates[:0]
	for _, r := range rates {
		same := false
		for _, o := range out {
			_, u1, b1 := rateArgs(r, 1)
			_, u2, b2 := rateArgs(o, 1)
			same = same || (u1 == u2 && b1 == b2)
		}
		if !same {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// rateArgs are the integers admit.lua uses for a rate rule and a cost: the
// increment of the meters for the cost, the increment for cost 1, and the
// burst offset.
func rateArgs(r Rate, cost int64) (inc, unit, off int64) {
	p := micros(r.Period)
	return mulDivCeil(p, cost, r.Limit), ceilDiv(p, r.Limit), mulDivCeil(p, r.burst(), r.Limit)
}

// RateStats is the state of one rate rule.
type RateStats struct {
	Rule string // rate[i]
	Rate Rate
	// Available is how many jobs of cost 1 could start back to back now
	// (at most the burst), by both meters.
	Available int64
	// Ahead is how far the planned meter runs ahead of now: the time it
	// takes to serve the reservations already made. Zero when idle.
	Ahead time.Duration
	// StartedAhead is how far the started meter (actual starts only) runs
	// ahead of now. Zero when idle.
	StartedAhead time.Duration
}

// The rate kind: p<i>/a<i> in a scope's hash are rate i's planned and
// started meters.
type rateKind struct{}

const kindRate = 1

func init() { registerKind(kindRate, rateKind{}) }

func (rateKind) options() []string { return []string{"rate", "burst"} }

func (rateKind) parse(p *Policy, key, val string, seen map[string]bool) error {
	if key == "rate" {
		n, per, err := parseLimitPeriod(key, val)
		if err != nil {
			return &PolicyError{key, val, strings.TrimPrefix(err.Error(), key+"="+val+": ")}
		}
		p.Rates = append(p.Rates, Rate{Limit: n, Period: per, Burst: 1})
		delete(seen, "burst") // each rate may have its own
		return nil
	}
	if len(p.Rates) == 0 {
		return &PolicyError{key, val, "burst belongs to a rate; write it after one, e.g. rate=100/s burst=20"}
	}
	if err := once(seen, key, val); err != nil {
		return err
	}
	b, err := strconv.ParseInt(val, 10, 64)
	if err != nil || b < 1 {
		return &PolicyError{key, val, "must be a whole number of at least 1 (1 spaces jobs evenly)"}
	}
	p.Rates[len(p.Rates)-1].Burst = b
	return nil
}

func (rateKind) format(p *Policy, parts []string) []string {
	for _, r := range p.Rates {
		parts = append(parts, fmt.Sprintf("rate=%d/%s", r.Limit, formatPeriod(r.Period)))
		if b := r.burst(); b != 1 {
			parts = append(parts, fmt.Sprintf("burst=%d", b))
		}
	}
	return parts
}

// yaml reads rate: "100/s", rate: "100/s burst 20" (or rate: 100/s with
// burst: 20), and lists of them. A burst merged from elsewhere (<<:) belongs
// to the merged rate: an entry that gives its own rate leaves it out.
func (rateKind) yaml(fields map[string]*yaml.Node, explicit map[string]bool) ([]string, error) {
	if explicit["rate"] && !explicit["burst"] {
		delete(fields, "burst")
	}
	r, ok := fields["rate"]
	if !ok {
		if b, ok := fields["burst"]; ok {
			return nil, fmt.Errorf("line %d: burst belongs to a rate; add rate:", b.Line)
		}
		return nil, nil
	}
	var rates []string
	switch r.Kind {
	case yaml.ScalarNode:
		rates = []string{r.Value}
	case yaml.SequenceNode:
		for _, item := range r.Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: each rate is written like \"100/s\" or \"100/s burst 20\"", item.Line)
			}
			rates = append(rates, item.Value)
		}
	default:
		return nil, fmt.Errorf("line %d: rate is \"100/s\", \"100/s burst 20\" or a list of them", r.Line)
	}
	if b, ok := fields["burst"]; ok && len(rates) != 1 {
		return nil, fmt.Errorf("line %d: with several rates give each its burst inside the list: \"100/s burst 20\"", b.Line)
	}
	var parts []string
	for _, text := range rates {
		f := strings.Fields(text)
		switch {
		case len(f) == 1:
			parts = append(parts, "rate="+f[0])
		case len(f) == 3 && f[1] == "burst":
			parts = append(parts, "rate="+f[0], "burst="+f[2])
		default:
			return nil, fmt.Errorf("line %d: rate %q: write \"100/s\" or \"100/s burst 20\"", r.Line, text)
		}
	}
	if _, ok := fields["burst"]; ok {
		b, err := yamlScalar(fields, "burst")
		if err != nil {
			return nil, err
		}
		parts = append(parts, "burst="+b)
	}
	return parts, nil
}

func (rateKind) has(p *Policy) bool { return len(p.Rates) > 0 }

func (rateKind) validate(p *Policy) error {
	if len(p.Rates) > MaxRates {
		return &PolicyError{"rate", strconv.Itoa(len(p.Rates)) + " rules", fmt.Sprintf("a policy has at most %d rate rules; combine them", MaxRates)}
	}
	for i, r := range p.Rates {
		if err := r.validate(fmt.Sprintf("rate[%d]", i)); err != nil {
			return &PolicyError{Msg: err.Error()}
		}
	}
	return nil
}

func (rateKind) maxCost(p *Policy, low func(int64, string)) {
	for i, r := range p.Rates {
		low(r.burst(), fmt.Sprintf("rate[%d] (%s)", i, r))
	}
}

func (rateKind) pace(p *Policy) time.Duration {
	var d time.Duration
	for _, r := range p.Rates {
		d = max(d, r.Period/time.Duration(r.Limit))
	}
	return d
}

// encode: the increment of cost 1 and the burst offset, then the period
// and limit (admit.lua works out the increment of any other cost from
// them, exactly as rateArgs does).
func (rateKind) encode(p *Policy, _ time.Time, args []any) ([]any, int) {
	for _, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		args = append(args, kindRate, unit, off, micros(r.Period), r.Limit)
	}
	return args, len(p.Rates)
}

func (rateKind) stats(p *Policy, raw *rawStats, s *Stats) {
	for i, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		planned := raw.hash["p"+strconv.Itoa(i+1)]
		started, ok := raw.hash["a"+strconv.Itoa(i+1)]
		if !ok {
			started = planned // not stored while equal
		}
		// meters charged at another interval: what they hold ahead of now
		// is scaled to this one, as admit.lua reads them (the started
		// meter's only for a lowered rate: the starts it holds were decided
		// already, and a raised rate does not move them closer)
		if was := raw.hash["i"+strconv.Itoa(i+1)]; was > 0 && was != unit {
			scale := func(t int64) int64 {
				if t <= raw.now {
					return t
				}
				return raw.now + int64(float64(t-raw.now)*(float64(unit)/float64(was)))
			}
			planned = scale(planned)
			if unit > was {
				started = scale(started)
			}
		}
		tat := max(planned, started, raw.now)
		s.Rates = append(s.Rates, RateStats{
			Rule:         fmt.Sprintf("rate[%d]", i),
			Rate:         r,
			Available:    max((raw.now+off-tat)/unit, 0),
			Ahead:        time.Duration(max(planned, raw.now)-raw.now) * time.Microsecond,
			StartedAhead: time.Duration(max(started, raw.now)-raw.now) * time.Microsecond,
		})
	}
}

func (rateKind) rule(index int64) string { return fmt.Sprintf("rate[%d]", index-1) }
