package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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

// MaxRates is the most rate rules one policy may have.
const MaxRates = 12

// MaxTenantLen is the longest tenant name, in bytes.
const MaxTenantLen = 256

// Policy is the set of rules of one tenant. A job is admitted only when every
// rule allows it; the zero Policy allows everything.
//
// Its text form, used by the CLI and the policy store, lists options
// separated by spaces:
//
//	rate=100/s burst=20 rate=5000/h window=600/min quota=10000/day tz=UTC
//	concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000
//	shape=true fail_open=false
//
// burst applies to the rate before it; lease to concurrency; tz to quota.
type Policy struct {
	Rates       []Rate
	Window      *Window
	Quota       *Quota
	Concurrency *Concurrency

	// Overflow is what a worker does with a denied job; "" means defer.
	Overflow Overflow
	// MaxWait bounds how long OverflowWait holds a job.
	MaxWait time.Duration
	// Backlog caps the tenant's queued and deferred jobs; 0 is no cap.
	Backlog int64
	// Shape makes producers take each job's slot at enqueue time and
	// schedule the job for it.
	Shape bool
	// FailOpen lets jobs run unthrottled while Redis cannot be reached.
	// The default, false, defers them.
	FailOpen bool
}

// MaxWaitDefault is how long overflow=wait holds a job when max_wait is not set.
const MaxWaitDefault = time.Second

// OverflowMode is the policy's overflow, with the default filled in.
func (p *Policy) OverflowMode() Overflow {
	if p == nil || p.Overflow == "" {
		return OverflowDefer
	}
	return p.Overflow
}

// WaitLimit is the policy's max_wait, with the default filled in.
func (p *Policy) WaitLimit() time.Duration {
	if p == nil || p.MaxWait == 0 {
		return MaxWaitDefault
	}
	return p.MaxWait
}

// HasRules reports whether the policy limits anything.
func (p *Policy) HasRules() bool {
	return p != nil && (len(p.Rates) > 0 || p.Window != nil || p.Quota != nil || p.Concurrency != nil)
}

// String prints the policy in its text form; ParsePolicy reads it back.
func (p *Policy) String() string {
	if p == nil {
		return ""
	}
	var parts []string
	for _, r := range p.Rates {
		parts = append(parts, fmt.Sprintf("rate=%d/%s", r.Limit, formatPeriod(r.Period)))
		if b := r.burst(); b != 1 {
			parts = append(parts, fmt.Sprintf("burst=%d", b))
		}
	}
	if p.Window != nil {
		parts = append(parts, "window="+p.Window.String())
	}
	if q := p.Quota; q != nil {
		parts = append(parts, "quota="+q.String())
		if q.TZ != "" {
			parts = append(parts, "tz="+q.TZ)
		}
	}
	if c := p.Concurrency; c != nil {
		parts = append(parts, fmt.Sprintf("concurrency=%d", c.Limit))
		if c.Lease != 0 {
			parts = append(parts, "lease="+formatDuration(c.Lease))
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
	if p.Shape {
		parts = append(parts, "shape=true")
	}
	if p.FailOpen {
		parts = append(parts, "fail_open=true")
	}
	return strings.Join(parts, " ")
}

// PolicyError is a policy text or value that cannot be used. Field names
// the option and Value the text given.
type PolicyError struct {
	Field string
	Value string
	Msg   string
}

func (e *PolicyError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return fmt.Sprintf("%s=%s: %s", e.Field, e.Value, e.Msg)
}

// ParsePolicy reads a policy's text form (see Policy) and validates it.
// The empty text is the policy with no rules.
func ParsePolicy(text string) (*Policy, error) {
	tokens, err := splitPolicy(text)
	if err != nil {
		return nil, err
	}
	p := &Policy{}
	seen := map[string]bool{}
	once := func(key, val string) error {
		if seen[key] {
			return &PolicyError{key, val, fmt.Sprintf("given twice; give %s once", key)}
		}
		seen[key] = true
		return nil
	}
	var pendingQuotaUnit string
	for _, tok := range tokens {
		key, val, ok := strings.Cut(tok, "=")
		if !ok || val == "" {
			return nil, &PolicyError{Msg: fmt.Sprintf("%q: options are written key=value, e.g. rate=100/s", tok)}
		}
		switch key {
		case "rate":
			n, per, err := parseLimitPeriod(key, val)
			if err != nil {
				return nil, &PolicyError{key, val, strings.TrimPrefix(err.Error(), key+"="+val+": ")}
			}
			p.Rates = append(p.Rates, Rate{Limit: n, Period: per, Burst: 1})
			delete(seen, "burst")
		case "burst":
			if len(p.Rates) == 0 {
				return nil, &PolicyError{key, val, "burst belongs to a rate; write it after one, e.g. rate=100/s burst=20"}
			}
			if err := once(key, val); err != nil {
				return nil, err
			}
			b, err := strconv.ParseInt(val, 10, 64)
			if err != nil || b < 1 {
				return nil, &PolicyError{key, val, "must be a whole number of at least 1 (1 spaces jobs evenly)"}
			}
			p.Rates[len(p.Rates)-1].Burst = b
		case "window":
			if err := once(key, val); err != nil {
				return nil, err
			}
			n, per, err := parseLimitPeriod(key, val)
			if err != nil {
				return nil, &PolicyError{key, val, strings.TrimPrefix(err.Error(), key+"="+val+": ")}
			}
			p.Window = &Window{Limit: n, Period: per}
		case "quota":
			if err := once(key, val); err != nil {
				return nil, err
			}
			num, unit, hasUnit := strings.Cut(val, "/")
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				return nil, &PolicyError{key, val, "want N/day, N/hour, N/week, N/month, or N with reset=\"CRON SPEC\""}
			}
			if n < 1 {
				return nil, &PolicyError{key, val, "the limit must be at least 1"}
			}
			p.Quota = &Quota{Limit: n}
			if hasUnit {
				pendingQuotaUnit = unit
				found := false
				for _, s := range quotaShorthands {
					if s.name == unit {
						p.Quota.Reset, found = s.spec, true
					}
				}
				if !found {
					return nil, &PolicyError{key, val, fmt.Sprintf("unknown calendar unit %q; use hour, day, week or month, or reset=\"CRON SPEC\"", unit)}
				}
			}
		case "reset":
			if err := once(key, val); err != nil {
				return nil, err
			}
			if p.Quota == nil {
				return nil, &PolicyError{key, val, "reset belongs to a quota; write it after one, e.g. quota=500 reset=\"0 9 * * *\""}
			}
			if pendingQuotaUnit != "" {
				return nil, &PolicyError{key, val, fmt.Sprintf("quota already resets every %s; give either N/%s or reset=, not both", pendingQuotaUnit, pendingQuotaUnit)}
			}
			p.Quota.Reset = val
		case "tz":
			if err := once(key, val); err != nil {
				return nil, err
			}
			if p.Quota == nil {
				return nil, &PolicyError{key, val, "tz belongs to a quota; write it after one, e.g. quota=10000/day tz=Europe/Paris"}
			}
			p.Quota.TZ = val
		case "concurrency":
			if err := once(key, val); err != nil {
				return nil, err
			}
			n, err := parseCount(key, val)
			if err != nil {
				return nil, &PolicyError{key, val, "must be a whole number of at least 1"}
			}
			p.Concurrency = &Concurrency{Limit: n}
		case "lease":
			if err := once(key, val); err != nil {
				return nil, err
			}
			if p.Concurrency == nil {
				return nil, &PolicyError{key, val, "lease belongs to concurrency; write it after one, e.g. concurrency=5 lease=30s"}
			}
			d, err := time.ParseDuration(val)
			if err != nil {
				return nil, &PolicyError{key, val, "not a duration; use e.g. 30s or 2m"}
			}
			if d < time.Second {
				// 0 would silently mean the default lease
				return nil, &PolicyError{key, val, "must be at least 1s (it is renewed every lease/3 while a job runs)"}
			}
			p.Concurrency.Lease = d
		case "overflow":
			if err := once(key, val); err != nil {
				return nil, err
			}
			p.Overflow = Overflow(val)
		case "max_wait":
			if err := once(key, val); err != nil {
				return nil, err
			}
			d, err := time.ParseDuration(val)
			if err != nil {
				return nil, &PolicyError{key, val, "not a duration; use e.g. 500ms or 2s"}
			}
			if d <= 0 {
				// 0 would silently mean the default wait
				return nil, &PolicyError{key, val, fmt.Sprintf("must be positive; leave it out for the default (%s)", MaxWaitDefault)}
			}
			p.MaxWait = d
		case "backlog":
			if err := once(key, val); err != nil {
				return nil, err
			}
			n, err := parseCount(key, val)
			if err != nil {
				return nil, &PolicyError{key, val, "must be a whole number of at least 1 (leave it out for no cap)"}
			}
			p.Backlog = n
		case "shape", "fail_open":
			if err := once(key, val); err != nil {
				return nil, err
			}
			b, err := strconv.ParseBool(val)
			if err != nil {
				return nil, &PolicyError{key, val, "must be true or false"}
			}
			if key == "shape" {
				p.Shape = b
			} else {
				p.FailOpen = b
			}
		default:
			return nil, &PolicyError{key, val, "unknown option; known: rate burst window quota reset tz concurrency lease overflow max_wait backlog shape fail_open"}
		}
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// splitPolicy splits policy text on spaces, keeping double-quoted values
// (reset="0 0 * * 1") whole and unquoted.
func splitPolicy(text string) ([]string, error) {
	if !utf8.ValidString(text) {
		return nil, &PolicyError{Msg: fmt.Sprintf("policy %q is not valid UTF-8", text)}
	}
	var tokens []string
	var cur strings.Builder
	inQuote, has := false, false
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '"':
			inQuote = !inQuote
			has = true
		case !inQuote && (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ','):
			if has {
				tokens = append(tokens, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(c)
			has = true
		}
	}
	if inQuote {
		return nil, &PolicyError{Msg: fmt.Sprintf("policy %q: a quote is not closed", text)}
	}
	if has {
		tokens = append(tokens, cur.String())
	}
	return tokens, nil
}

// Validate checks every rule and option; the error names the field, the
// value and what to do instead.
func (p *Policy) Validate() error {
	if len(p.Rates) > MaxRates {
		return &PolicyError{"rate", strconv.Itoa(len(p.Rates)) + " rules", fmt.Sprintf("a policy has at most %d rate rules; combine them", MaxRates)}
	}
	for i, r := range p.Rates {
		if err := r.validate(fmt.Sprintf("rate[%d]", i)); err != nil {
			return &PolicyError{Msg: err.Error()}
		}
	}
	if p.Window != nil {
		if err := p.Window.validate(); err != nil {
			return &PolicyError{Msg: err.Error()}
		}
	}
	if p.Quota != nil {
		if p.Quota.Reset == "" {
			return &PolicyError{"quota", strconv.FormatInt(p.Quota.Limit, 10), "give a calendar unit (quota=N/day) or reset=\"CRON SPEC\""}
		}
		if err := p.Quota.compile(); err != nil {
			return &PolicyError{Msg: err.Error()}
		}
	}
	if p.Concurrency != nil {
		if err := p.Concurrency.validate(); err != nil {
			return &PolicyError{Msg: err.Error()}
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
	return nil
}

// maxCost is MaxCost's number alone, without describing the rule (the
// description is only needed for an error, and admissions check every time).
func (p *Policy) maxCost() int64 {
	max := int64(-1)
	if p == nil {
		return max
	}
	lower := func(n int64) {
		if max < 0 || n < max {
			max = n
		}
	}
	for _, r := range p.Rates {
		lower(r.burst())
	}
	if p.Window != nil {
		lower(p.Window.Limit)
	}
	if p.Quota != nil {
		lower(p.Quota.Limit)
	}
	return max
}

// MaxCost is the largest cost a job may have under this policy: a job that
// costs more than a rule's burst, window or quota could never be admitted.
// It returns -1 when no rule bounds the cost, and names the rule.
func (p *Policy) MaxCost() (int64, string) {
	max, rule := int64(-1), ""
	lower := func(n int64, r string) {
		if max < 0 || n < max {
			max, rule = n, r
		}
	}
	if p == nil {
		return max, rule
	}
	for i, r := range p.Rates {
		lower(r.burst(), fmt.Sprintf("rate[%d] (%s)", i, r))
	}
	if p.Window != nil {
		lower(p.Window.Limit, fmt.Sprintf("window (%s)", p.Window))
	}
	if p.Quota != nil {
		lower(p.Quota.Limit, fmt.Sprintf("quota (%s)", p.Quota))
	}
	return max, rule
}

// CostError is returned for a job whose cost no rule of its policy can ever
// admit (more than a rate's burst, a window or a quota).
type CostError struct {
	Tenant string
	Cost   int64
	Max    int64
	Rule   string
}

func (e *CostError) Error() string {
	return fmt.Sprintf("tenant %q: cost %d exceeds the %d that %s allows at once; raise that limit or split the job", e.Tenant, e.Cost, e.Max, e.Rule)
}

// ErrInvalidTenant is wrapped by the errors for tenant names that cannot be used.
var ErrInvalidTenant = errors.New("invalid tenant")

// ValidateTenant checks a job's tenant: 1 to 256 bytes of UTF-8, not one of
// the policy store's reserved names (* and names starting with @).
func ValidateTenant(tenant string) error {
	switch {
	case tenant == "":
		return fmt.Errorf("%w: the tenant is empty; give the customer, account or user the job is for", ErrInvalidTenant)
	case len(tenant) > MaxTenantLen:
		return fmt.Errorf("%w: tenant %q… is %d bytes; at most %d are allowed (use an id or a hash of the name)", ErrInvalidTenant, tenant[:32], len(tenant), MaxTenantLen)
	case !utf8.ValidString(tenant):
		return fmt.Errorf("%w: tenant %q is not valid UTF-8", ErrInvalidTenant, tenant)
	case tenant == DefaultPolicy || strings.HasPrefix(tenant, "@"):
		return fmt.Errorf("%w: tenant %q is a reserved name (* is the default policy, names starting with @ are sluice's); choose another", ErrInvalidTenant, tenant)
	}
	return nil
}

// validatePolicyName accepts a tenant, * or @global as the name of a policy.
func validatePolicyName(name string) error {
	if name == DefaultPolicy || name == GlobalPolicy {
		return nil
	}
	if strings.HasPrefix(name, "@") {
		return fmt.Errorf("%w: policy name %q: the only reserved names are * (default) and @global", ErrInvalidTenant, name)
	}
	return ValidateTenant(name)
}
