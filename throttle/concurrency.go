package throttle

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// Concurrency allows at most Limit jobs to run at once across the fleet.
// Each running job holds a lease of Lease, renewed while it runs; a holder
// that stops renewing (a crashed worker) loses its slot after Lease. In a
// policy: "concurrency=5 lease=30s".
type Concurrency struct {
	Limit int64
	Lease time.Duration
}

// LeaseDefault is the lease of a concurrency rule that does not give one.
const LeaseDefault = 30 * time.Second

func (c Concurrency) lease() time.Duration {
	if c.Lease == 0 {
		return LeaseDefault
	}
	return c.Lease
}

// String prints the rule as "5 lease 30s".
func (c Concurrency) String() string {
	return fmt.Sprintf("%d lease %s", c.Limit, formatDuration(c.lease()))
}

func (c Concurrency) validate() error {
	if c.Limit <= 0 {
		return fmt.Errorf("concurrency %d: the limit must be at least 1", c.Limit)
	}
	if err := checkCount(c.Limit); err != nil {
		return fmt.Errorf("concurrency %d: %v", c.Limit, err)
	}
	if c.Lease != 0 && c.Lease < time.Second {
		return fmt.Errorf("lease %s: must be at least 1s (it is renewed every lease/3 while a job runs)", c.Lease)
	}
	if err := checkSpan("the lease", c.Lease); err != nil {
		return fmt.Errorf("lease %s: %v; a crashed worker's slot frees itself within the lease, so keep it short (the default is 30s)", formatDuration(c.Lease), err)
	}
	return nil
}

// ConcurrencyStats is the state of the concurrency rule.
type ConcurrencyStats struct {
	Concurrency Concurrency
	InFlight    int64
	// Holders lists up to 100 running jobs and when their leases end.
	Holders []Holder
}

// Holder is a job holding a concurrency slot.
type Holder struct {
	ID       string
	LeaseEnd time.Time
}

// The concurrency kind: h:<job> (a slot: lease end and claim, lua/slot.lua),
// hc, hm and y in a scope's hash (admit.lua's header).
type concurrencyKind struct{}

const kindConcurrency = 4

func init() { registerKind(kindConcurrency, concurrencyKind{}) }

func (concurrencyKind) options() []string { return []string{"concurrency", "lease"} }

func (concurrencyKind) parse(p *Policy, key, val string, seen map[string]bool) error {
	if err := once(seen, key, val); err != nil {
		return err
	}
	if key == "concurrency" {
		n, err := parseCount(key, val)
		if err != nil {
			return &PolicyError{key, val, "must be a whole number of at least 1"}
		}
		p.Concurrency = &Concurrency{Limit: n}
		return nil
	}
	if p.Concurrency == nil {
		return &PolicyError{key, val, "lease belongs to concurrency; write it after one, e.g. concurrency=5 lease=30s"}
	}
	d, err := time.ParseDuration(val)
	if err != nil {
		return &PolicyError{key, val, "not a duration; use e.g. 30s or 2m"}
	}
	if d < time.Second {
		// 0 would silently mean the default lease
		return &PolicyError{key, val, "must be at least 1s (it is renewed every lease/3 while a job runs)"}
	}
	p.Concurrency.Lease = d
	return nil
}

func (concurrencyKind) format(p *Policy, parts []string) []string {
	if c := p.Concurrency; c != nil {
		parts = append(parts, fmt.Sprintf("concurrency=%d", c.Limit))
		if c.Lease != 0 {
			parts = append(parts, "lease="+formatDuration(c.Lease))
		}
	}
	return parts
}

func (k concurrencyKind) yaml(fields map[string]*yaml.Node, _ map[string]bool) ([]string, error) {
	return yamlOptions(fields, k.options())
}

func (concurrencyKind) has(p *Policy) bool { return p.Concurrency != nil }

func (concurrencyKind) validate(p *Policy) error {
	if p.Concurrency == nil {
		return nil
	}
	if err := p.Concurrency.validate(); err != nil {
		return &PolicyError{Msg: err.Error()}
	}
	return nil
}

// maxCost: a slot is one job, whatever it costs.
func (concurrencyKind) maxCost(*Policy, func(int64, string)) {}

func (concurrencyKind) pace(*Policy) time.Duration { return 0 }

func (concurrencyKind) encode(p *Policy, _ time.Time, args []any) ([]any, int) {
	if c := p.Concurrency; c != nil {
		return append(args, kindConcurrency, c.Limit, micros(c.lease())), 1
	}
	return args, 0
}

func (concurrencyKind) stats(p *Policy, raw *rawStats, s *Stats) {
	if c := p.Concurrency; c != nil {
		s.Concurrency = &ConcurrencyStats{Concurrency: *c, InFlight: raw.live, Holders: raw.holders}
	}
}

func (concurrencyKind) rule(int64) string { return "concurrency" }
