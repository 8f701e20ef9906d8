package throttle

import (
	"time"

	"gopkg.in/yaml.v3"
)

// A rule kind is one kind of rule a policy may hold (rate, window, quota,
// concurrency). Its file holds the rule's type, its text form, validation,
// cost bound, its arguments to lua/admit.lua (where it has a branch in each
// phase) and its part of Stats, and registers the kind; everything that
// handles a policy's rules (the text form, YAML, the script's arguments,
// Stats, the CLI's stats) loops over the kinds. docs/architecture.md has the
// checklist for adding one.
type ruleKind interface {
	// options are the kind's keys in a policy's text form (and its YAML
	// fields), its own first: "quota", then "reset" and "tz".
	options() []string
	// parse reads one of its options into p.
	parse(p *Policy, key, val string, seen map[string]bool) error
	// format appends the text form of p's rules of this kind.
	format(p *Policy, parts []string) []string
	// yaml turns the kind's fields of a YAML policy entry into options of
	// the text form; explicit tells the fields the entry gives itself
	// (others come from a merge key).
	yaml(fields map[string]*yaml.Node, explicit map[string]bool) ([]string, error)
	// has reports whether p holds a rule of this kind.
	has(p *Policy) bool
	// validate checks p's rules of this kind.
	validate(p *Policy) error
	// maxCost offers low the most each of p's rules of this kind admits at
	// once (a job costing more could never start), naming the rule.
	maxCost(p *Policy, low func(n int64, rule string))
	// pace is the steady time between two starts p's rules of this kind
	// impose on a long line of jobs of cost 1 (the slowest of them), or 0
	// for a kind that does not space starts out in time.
	pace(p *Policy) time.Duration
	// encode appends, for each of p's rules of this kind, its kind code and
	// arguments to admit.lua; it returns the args and how many rules it
	// added. now picks calendar windows.
	encode(p *Policy, now time.Time, args []any) ([]any, int)
	// stats fills the kind's part of s from a scope's raw state.
	stats(p *Policy, raw *rawStats, s *Stats)
	// rule names one of the kind's rules in decisions: "window", or for a
	// kind a policy may hold several of, "rate[0]" (index counts from 1).
	rule(index int64) string
}

// kinds are the rule kinds by their code, which is also their place in a
// policy's text form and among admit.lua's arguments, and the rule code of
// a decision one of their rules makes. Each kind's file registers it with
// its code (kindRate, …); codes from ruleCooldown up are not kinds.
var kinds []ruleKind

func registerKind(code int, k ruleKind) {
	for len(kinds) <= code {
		kinds = append(kinds, nil)
	}
	kinds[code] = k
}

// eachKind calls f for every registered kind, in order.
func eachKind(f func(k ruleKind) error) error {
	for _, k := range kinds {
		if k != nil {
			if err := f(k); err != nil {
				return err
			}
		}
	}
	return nil
}
