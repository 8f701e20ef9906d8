package throttle

import (
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Window is an exact sliding window: never more than Limit units start in
// any interval of length Period. It keeps one entry per unit started in the
// last Period, so its memory grows with Limit. In a policy:
// "window=600/min".
type Window struct {
	Limit  int64
	Period time.Duration
}

// MaxWindowLimit bounds a sliding window's size: the window stores one entry
// per unit, so its memory and the cost of a decision grow with the limit.
const MaxWindowLimit = 1_000_000

// String prints the window as "600/min".
func (w Window) String() string { return fmt.Sprintf("%d/%s", w.Limit, formatPeriod(w.Period)) }

func (w Window) validate() error {
	if w.Limit <= 0 {
		return fmt.Errorf("window %d/%s: the limit must be at least 1", w.Limit, formatPeriod(w.Period))
	}
	if w.Period < time.Millisecond {
		return fmt.Errorf("window %d/%s: the duration must be at least 1ms", w.Limit, w.Period)
	}
	if w.Limit > MaxWindowLimit {
		return fmt.Errorf("window %s: at most %d entries per window are kept; use a rate rule or a quota for larger limits", w, MaxWindowLimit)
	}
	if err := checkSpan("the duration "+formatDuration(w.Period), w.Period); err != nil {
		return fmt.Errorf("window %s: %v; use a quota (quota=N reset=\"CRON\") for limits over long periods", w, err)
	}
	return nil
}

// WindowStats is the state of the sliding window.
type WindowStats struct {
	Window Window
	// Started is how many units started in the last window length.
	Started int64
	// Planned counts started and reserved units from the last window length on.
	Planned int64
}

// The window kind: a scope's planned and started zsets hold its entries,
// and n in its hash their sequence.
type windowKind struct{}

const kindWindow = 2

func init() { registerKind(kindWindow, windowKind{}) }

func (windowKind) options() []string { return []string{"window"} }

func (windowKind) parse(p *Policy, key, val string, seen map[string]bool) error {
	if err := once(seen, key, val); err != nil {
		return err
	}
	n, per, err := parseLimitPeriod(key, val)
	if err != nil {
		return &PolicyError{key, val, strings.TrimPrefix(err.Error(), key+"="+val+": ")}
	}
	p.Window = &Window{Limit: n, Period: per}
	return nil
}

func (windowKind) format(p *Policy, parts []string) []string {
	if p.Window != nil {
		parts = append(parts, "window="+p.Window.String())
	}
	return parts
}

func (k windowKind) yaml(fields map[string]*yaml.Node, _ map[string]bool) ([]string, error) {
	return yamlOptions(fields, k.options())
}

func (windowKind) has(p *Policy) bool { return p.Window != nil }

func (windowKind) validate(p *Policy) error {
	if p.Window == nil {
		return nil
	}
	if err := p.Window.validate(); err != nil {
		return &PolicyError{Msg: err.Error()}
	}
	return nil
}

func (windowKind) maxCost(p *Policy, low func(int64, string)) {
	if p.Window != nil {
		low(p.Window.Limit, fmt.Sprintf("window (%s)", p.Window))
	}
}

func (windowKind) pace(p *Policy) time.Duration {
	if w := p.Window; w != nil {
		return w.Period / time.Duration(w.Limit)
	}
	return 0
}

func (windowKind) encode(p *Policy, _ time.Time, args []any) ([]any, int) {
	if w := p.Window; w != nil {
		return append(args, kindWindow, w.Limit, micros(w.Period)), 1
	}
	return args, 0
}

func (windowKind) stats(p *Policy, raw *rawStats, s *Stats) {
	if p.Window != nil {
		s.Window = &WindowStats{Window: *p.Window, Started: raw.windowStarted, Planned: raw.windowPlanned}
	}
}

func (windowKind) rule(int64) string { return "window" }
