package throttle

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Overflow says what a worker does with a job its policy denies.
type Overflow string

const (
	// OverflowDefer reschedules the job at its retry-after, without counting
	// a failure or using its retry budget. The default.
	OverflowDefer Overflow = "defer"
	// OverflowWait holds the job in the worker up to MaxWait, then defers it.
	OverflowWait Overflow = "wait"
	// OverflowDrop archives the job with the reason "throttled": for work
	// that is worthless late.
	OverflowDrop Overflow = "drop"
)

// Names with a meaning of their own in the policy store.
const (
	// DefaultPolicy is the policy of tenants that have none of their own.
	DefaultPolicy = "*"
	// GlobalPolicy applies to every job in addition to its tenant's policy.
	GlobalPolicy = "@global"
)

// Policy is the set of rules of one tenant. A job is admitted only when every
// rule allows it; the zero Policy allows everything.
//
// Its text form, used by the CLI and the policy store, lists options
// separated by spaces:
//
//	rate=100/s burst=20 rate=5000/h window=600/min quota=10000/day tz=UTC
//	concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000
//	weight=2 fail_open=false learn=false adapt=10..200/s adapt_step=4
//	adapt_every=1s adapt_latency=500ms
//
// burst applies to the rate before it; lease to concurrency; tz to quota;
// adapt to the rate of its period (rate=50/s adapt=10..200/s).
// shape=true, from before the waiting room, is accepted and has no effect:
// the waiting room does for every job what it asked for.
type Policy struct {
	Rates       []Rate
	Window      *Window
	Quota       *Quota
	Concurrency *Concurrency

	// Overflow is what a worker does with a denied job; "" means defer.
	Overflow Overflow
	// MaxWait bounds how long OverflowWait holds a job; 0 means
	// MaxWaitDefault.
	MaxWait time.Duration
	// Backlog caps the tenant's jobs waiting in its line (the waiting
	// room); past it queue.Client.Enqueue returns ErrBacklogFull. 0 is no
	// cap.
	Backlog int64
	// Weight is the tenant's share when the waiting room serves tenants in
	// turn: a tenant of weight 3 gets three jobs (by cost) for every one
	// of a tenant of weight 1. 0 means 1.
	Weight int64
	// FailOpen lets jobs run unthrottled while Redis cannot be reached.
	// The default, false, defers them.
	FailOpen bool
	// NoLearn pins the policy's limits (text form learn=false): a limit
	// the downstream declares (LearnedLimit) is recorded but not applied.
	// The default, false, lets a declared limit below the policy's lower
	// the tenant's rate until it lapses. It does not stop an adaptive
	// rule.
	NoLearn bool
	// Adapt, when set, makes the rate rule of its period adapt to what the
	// downstream answers (text form adapt=10..200/s; see AdaptRule).
	Adapt *AdaptRule
}

// MaxWaitDefault is how long overflow=wait holds a job when max_wait is not set.
const MaxWaitDefault = time.Second

// HasRules reports whether the policy limits anything.
func (p *Policy) HasRules() bool {
	if p == nil {
		return false
	}
	for _, k := range kinds {
		if k != nil && k.has(p) {
			return true
		}
	}
	return false
}

// String prints the policy in its text form; ParsePolicy reads it back.
func (p *Policy) String() string {
	if p == nil {
		return ""
	}
	var parts []string
	for _, k := range kinds {
		if k != nil {
			parts = k.format(p, parts)
		}
	}
	if p.Overflow != "" {
		parts = append(parts, "overflow="+string(p.Overflow))
	}
	if p.MaxWait != 0 {
		parts = append(parts, "max_wait="+formatDuration(p.MaxWait))
	}
	if p.Backlog != 0 {
		parts = append(parts, fmt.Sprintf("backlog=%d", p.Backlog))
	}
	if p.Weight > 1 {
		parts = append(parts, fmt.Sprintf("weight=%d", p.Weight))
	}
	if p.FailOpen {
		parts = append(parts, "fail_open=true")
	}
	if p.NoLearn {
		parts = append(parts, "learn=false")
	}
	parts = p.formatAdapt(parts)
	return strings.Join(parts, " ")
}

// policyOptions are the options of a policy that are not rules, in text
// form order.
var policyOptions = []string{"overflow", "max_wait", "backlog", "weight", "shape", "fail_open", "learn", "adapt", "adapt_step", "adapt_every", "adapt_latency"}

// optionKind finds the rule kind an option belongs to; nil for a policy
// option (or an unknown one).
func optionKind(key string) ruleKind {
	for _, k := range kinds {
		if k != nil && slices.Contains(k.options(), key) {
			return k
		}
	}
	return nil
}

// knownOptions lists every option of the text form, for error messages.
func knownOptions() []string {
	var out []string
	for _, k := range kinds {
		if k != nil {
			out = append(out, k.options()...)
		}
	}
	return append(out, policyOptions...)
}

// ParsePolicy reads a policy's text form (see Policy) and validates it.
// The empty text is the policy with no rules. A rate given twice (the same
// interval and burst, as rate=1/s rate=1/s or rate=1/s rate=2/2s) is one
// rule and is kept once.
func ParsePolicy(text string) (*Policy, error) {
	tokens, err := splitPolicy(text)
	if err != nil {
		return nil, err
	}
	p := &Policy{}
	seen := map[string]bool{}
	for _, tok := range tokens {
		key, val, ok := strings.Cut(tok, "=")
		if !ok || val == "" {
			return nil, &PolicyError{Msg: fmt.Sprintf("%q: options are written key=value, e.g. rate=100/s", tok)}
		}
		if key == "" {
			return nil, &PolicyError{Msg: fmt.Sprintf("%q: no option name before =; options are written key=value, e.g. rate=100/s (known: %s)", tok, strings.Join(knownOptions(), " "))}
		}
		if k := optionKind(key); k != nil {
			if err := k.parse(p, key, val, seen); err != nil {
				return nil, err
			}
			continue
		}
		if err := p.parseOption(key, val, seen); err != nil {
			return nil, err
		}
	}
	p.Rates = uniqueRates(p.Rates)
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// parseOption reads one of the policy's own options (not a rule).
func (p *Policy) parseOption(key, val string, seen map[string]bool) error {
	if !slices.Contains(policyOptions, key) {
		return &PolicyError{key, val, "unknown option; known: " + strings.Join(knownOptions(), " ")}
	}
	if err := once(seen, key, val); err != nil {
		return err
	}
	switch key {
	case "overflow":
		p.Overflow = Overflow(val)
	case "max_wait":
		d, err := time.ParseDuration(val)
		if err != nil {
			return &PolicyError{key, val, "not a duration; use e.g. 500ms or 2s"}
		}
		if d <= 0 {
			// 0 would silently mean the default wait
			return &PolicyError{key, val, fmt.Sprintf("must be positive; leave it out for the default (%s)", MaxWaitDefault)}
		}
		p.MaxWait = d
	case "backlog":
		n, err := parseCount(key, val)
		if err != nil {
			return &PolicyError{key, val, "must be a whole number of at least 1 (leave it out for no cap)"}
		}
		p.Backlog = n
	case "weight":
		n, err := parseCount(key, val)
		if err != nil || n > MaxWeight {
			return &PolicyError{key, val, fmt.Sprintf("must be a whole number from 1 to %d (the tenant's share in the waiting room's turns)", MaxWeight)}
		}
		p.Weight = n
	case "adapt", "adapt_step", "adapt_every", "adapt_latency":
		return p.parseAdapt(key, val)
	case "shape", "fail_open", "learn":
		b, err := strconv.ParseBool(val)
		if err != nil {
			return &PolicyError{key, val, "must be true or false"}
		}
		switch key {
		case "fail_open":
			p.FailOpen = b
		case "learn":
			p.NoLearn = !b
		}
	}
	return nil
}

// Validate checks every rule and option; the error names the field, the
// value and what to do instead.
func (p *Policy) Validate() error {
	for _, k := range kinds {
		if k == nil {
			continue
		}
		if err := k.validate(p); err != nil {
			return err
		}
	}
	switch p.Overflow {
	case "", OverflowDefer, OverflowWait, OverflowDrop:
	default:
		return &PolicyError{"overflow", string(p.Overflow), "use defer (the default), wait or drop"}
	}
	if p.MaxWait < 0 {
		return &PolicyError{"max_wait", p.MaxWait.String(), "must not be negative"}
	}
	if p.MaxWait > 0 && p.Overflow != OverflowWait {
		return &PolicyError{"max_wait", formatDuration(p.MaxWait), "only means something with overflow=wait; add overflow=wait or remove max_wait"}
	}
	if p.Backlog < 0 {
		return &PolicyError{"backlog", strconv.FormatInt(p.Backlog, 10), "must be at least 1 (leave it out for no cap)"}
	}
	if p.Weight < 0 || p.Weight > MaxWeight {
		return &PolicyError{"weight", strconv.FormatInt(p.Weight, 10), fmt.Sprintf("must be from 1 to %d", MaxWeight)}
	}
	return p.validateAdapt()
}

// weight is the tenant's share in the waiting room's turns (nil: 1).
func (p *Policy) weight() int64 {
	if p == nil || p.Weight < 1 {
		return 1
	}
	return p.Weight
}

// pace is the steady time between two starts the policy's rules impose on
// a long line of jobs of cost 1: the slowest rate's emission interval, or a
// window's period over its limit, whichever is longer; 0 when no rule
// spaces starts out (concurrency only, or no rules). The producer reads it
// (jobpath.Policies.Pace) to tell how long a tenant's line may take to
// drain.
func (p *Policy) pace() time.Duration {
	var d time.Duration
	if p == nil {
		return d
	}
	for _, k := range kinds {
		if k != nil {
			d = max(d, k.pace(p))
		}
	}
	return d
}

// MaxWeight is the largest weight= a policy may give a tenant.
const MaxWeight = 1000

// maxCostOf is the largest cost a job may have under this policy: a job that
// costs more than a rule's burst, window or quota could never be admitted.
// It returns -1 when no rule bounds the cost, and names the rule.
func (p *Policy) maxCostOf() (int64, string) {
	most, rule := int64(-1), ""
	if p == nil {
		return most, rule
	}
	for _, k := range kinds {
		if k != nil {
			k.maxCost(p, func(n int64, r string) {
				if most < 0 || n < most {
					most, rule = n, r
				}
			})
		}
	}
	return most, rule
}

// CostError is returned for a job whose cost no rule of its policy can ever
// admit (more than a rate's burst, a window or a quota). A job's cost must
// fit every rule it passes: under rate=2/s (burst 1) a job of cost 3 never
// starts. The message names the rule and the change that lets the job in.
type CostError struct {
	Tenant string
	Cost   int64
	Max    int64
	Rule   string
}

func (e *CostError) Error() string {
	fit, fix := e.fix()
	return fmt.Sprintf("tenant %q: a job of cost %d can never start: %s admits at most %d at once, and a job's cost must fit %s; %s, or split the job into jobs of cost %d or less",
		e.Tenant, e.Cost, e.Rule, e.Max, fit, fix, e.Max)
}

// costRuleRE reads the rule of a CostError: "rate[0] (2/s)", "window
// (3/s)", "quota (4/day)", after the scope's name.
var costRuleRE = regexp.MustCompile(`(rate\[\d+\]|window|quota) \(([^()]*)\)$`)

// fix says what a job's cost must fit and how to change the rule so that
// it does.
func (e *CostError) fix() (fit, fix string) {
	m := costRuleRE.FindStringSubmatch(e.Rule)
	if m == nil {
		return "every rule's limit", "raise that limit"
	}
	limit, per, _ := strings.Cut(strings.Fields(m[2])[0], "/")
	switch {
	case strings.HasPrefix(m[1], "rate"):
		return "its burst", fmt.Sprintf("give that rate burst=%d or more (rate=%s/%s burst=%d)", e.Cost, limit, per, e.Cost)
	case m[1] == "window":
		return "its window", fmt.Sprintf("raise the window to window=%d/%s or more", e.Cost, per)
	case per != "":
		return "its quota", fmt.Sprintf("raise the quota to quota=%d/%s or more", e.Cost, per)
	}
	return "its quota", fmt.Sprintf("raise the quota to quota=%d or more", e.Cost)
}
