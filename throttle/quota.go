package throttle

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"gopkg.in/yaml.v3"
)

// Quota allows Limit units per calendar window. Windows start at every time
// the cron spec Reset fires in the time zone TZ ("" is UTC), so a daily quota
// resets exactly at midnight in that zone, across daylight-saving changes.
// In a policy: "quota=10000/day tz=America/Los_Angeles", or with any cron
// spec, `quota=500 reset="0 9 * * *"`.
type Quota struct {
	Limit int64
	Reset string
	TZ    string

	schedule cron.Schedule
	loc      *time.Location
}

// Quota shorthands and the cron specs they stand for.
var quotaShorthands = []struct{ name, spec string }{
	{"hour", "0 * * * *"},
	{"day", "0 0 * * *"},
	{"week", "0 0 * * 1"},
	{"month", "0 0 1 * *"},
}

// String prints the quota as "10000/day" or `10000 reset="0 9 * * *"` (the
// time zone is printed separately, as tz=).
func (q Quota) String() string {
	for _, s := range quotaShorthands {
		if s.spec == q.Reset {
			return fmt.Sprintf("%d/%s", q.Limit, s.name)
		}
	}
	return fmt.Sprintf("%d reset=%q", q.Limit, q.Reset)
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

func (q *Quota) compile() error {
	if q.Limit <= 0 {
		return fmt.Errorf("quota %d: the limit must be at least 1", q.Limit)
	}
	if err := checkCount(q.Limit); err != nil {
		return fmt.Errorf("quota %d: %v", q.Limit, err)
	}
	loc, err := time.LoadLocation(q.TZ)
	if err != nil || q.TZ == "Local" {
		return fmt.Errorf("quota tz %q: unknown time zone; use an IANA name such as UTC or America/Los_Angeles", q.TZ)
	}
	if strings.Contains(q.Reset, "TZ=") {
		return fmt.Errorf("quota reset %q: give the time zone with tz=, not inside the cron spec", q.Reset)
	}
	sched, err := cronParser.Parse(q.Reset)
	if err != nil {
		return fmt.Errorf("quota reset %q: not a cron spec (%v); use five fields like \"0 0 * * *\" or a shorthand like quota=N/day", q.Reset, err)
	}
	q.schedule, q.loc = sched, loc
	// A spec that never fires (e.g. "0 0 30 2 *") would make one window forever.
	if next := sched.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, loc)); next.IsZero() {
		return fmt.Errorf("quota reset %q: the spec never fires; give one that does", q.Reset)
	}
	return nil
}

// windowAt returns the calendar window [start, end) that contains t.
func (q *Quota) windowAt(t time.Time) (start, end time.Time) {
	if q.schedule == nil {
		if err := q.compile(); err != nil {
			return time.Time{}, time.Time{}
		}
	}
	t = t.In(q.loc)
	end = q.schedule.Next(t)
	// Find the last firing at or before t: step back until a firing lands
	// at or before t, then walk forward.
	for _, back := range []time.Duration{time.Minute, time.Hour, 25 * time.Hour, 8 * 24 * time.Hour, 32 * 24 * time.Hour, 367 * 24 * time.Hour, 5 * 367 * 24 * time.Hour} {
		s := q.schedule.Next(t.Add(-back).Add(-time.Second))
		if s.IsZero() || s.After(t) {
			continue
		}
		for {
			n := q.schedule.Next(s)
			if n.IsZero() || n.After(t) {
				return s, end
			}
			s = n
		}
	}
	return time.Time{}, end
}

// bounds are the starts of the quota windows admit.lua is sent around now:
// the window containing now (give or take clock skew) and the two after it.
func (q *Quota) bounds(now time.Time) []int64 {
	const skew = 2 * time.Second
	start, _ := q.windowAt(now.Add(-skew))
	if start.IsZero() {
		start = now.Add(-skew).Add(-time.Second)
	}
	starts := []time.Time{start}
	for t := start; len(starts) < 16; {
		if t = q.schedule.Next(t); t.IsZero() {
			break
		}
		starts = append(starts, t)
		if t.After(now.Add(skew)) {
			break
		}
	}
	for i := 0; i < 2; i++ {
		if n := q.schedule.Next(starts[len(starts)-1]); !n.IsZero() {
			starts = append(starts, n)
		}
	}
	out := make([]int64, len(starts))
	for i, t := range starts {
		out[i] = t.UnixMicro()
	}
	return out
}

// QuotaStats is the state of the calendar quota.
type QuotaStats struct {
	Quota                  Quota
	Used                   int64
	WindowStart, WindowEnd time.Time
	ReservedInNextWindow   int64
	Remaining              int64
}

// The quota kind: qa/qc and qb/qd in a scope's hash are two window starts
// and their counts.
type quotaKind struct{}

const kindQuota = 3

func init() { registerKind(kindQuota, quotaKind{}) }

func (quotaKind) options() []string { return []string{"quota", "reset", "tz"} }

func (quotaKind) parse(p *Policy, key, val string, seen map[string]bool) error {
	if err := once(seen, key, val); err != nil {
		return err
	}
	switch key {
	case "quota":
		num, unit, hasUnit := strings.Cut(val, "/")
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return &PolicyError{key, val, "want N/day, N/hour, N/week, N/month, or N with reset=\"CRON SPEC\""}
		}
		if n < 1 {
			return &PolicyError{key, val, "the limit must be at least 1"}
		}
		p.Quota = &Quota{Limit: n}
		if hasUnit {
			for _, s := range quotaShorthands {
				if s.name == unit {
					p.Quota.Reset = s.spec
					seen["quota/unit"] = true
					return nil
				}
			}
			return &PolicyError{key, val, fmt.Sprintf("unknown calendar unit %q; use hour, day, week or month, or reset=\"CRON SPEC\"", unit)}
		}
	case "reset":
		if p.Quota == nil {
			return &PolicyError{key, val, "reset belongs to a quota; write it after one, e.g. quota=500 reset=\"0 9 * * *\""}
		}
		if seen["quota/unit"] {
			unit := strings.TrimPrefix(Quota{Limit: 1, Reset: p.Quota.Reset}.String(), "1/")
			return &PolicyError{key, val, fmt.Sprintf("quota already resets every %s; give either N/%s or reset=, not both", unit, unit)}
		}
		p.Quota.Reset = val
	case "tz":
		if p.Quota == nil {
			return &PolicyError{key, val, "tz belongs to a quota; write it after one, e.g. quota=10000/day tz=Europe/Paris"}
		}
		p.Quota.TZ = val
	}
	return nil
}

func (quotaKind) format(p *Policy, parts []string) []string {
	if q := p.Quota; q != nil {
		parts = append(parts, "quota="+q.String())
		if q.TZ != "" {
			parts = append(parts, "tz="+q.TZ)
		}
	}
	return parts
}

func (k quotaKind) yaml(fields map[string]*yaml.Node, _ map[string]bool) ([]string, error) {
	return yamlOptions(fields, k.options())
}

func (quotaKind) has(p *Policy) bool { return p.Quota != nil }

func (quotaKind) validate(p *Policy) error {
	if p.Quota == nil {
		return nil
	}
	if p.Quota.Reset == "" {
		return &PolicyError{"quota", strconv.FormatInt(p.Quota.Limit, 10), "give a calendar unit (quota=N/day) or reset=\"CRON SPEC\""}
	}
	if err := p.Quota.compile(); err != nil {
		return &PolicyError{Msg: err.Error()}
	}
	return nil
}

func (quotaKind) maxCost(p *Policy, low func(int64, string)) {
	if p.Quota != nil {
		low(p.Quota.Limit, fmt.Sprintf("quota (%s)", p.Quota))
	}
}

// pace: a quota does not space starts; it stops them until its calendar
// window turns.
func (quotaKind) pace(*Policy) time.Duration { return 0 }

func (quotaKind) encode(p *Policy, now time.Time, args []any) ([]any, int) {
	q := p.Quota
	if q == nil {
		return args, 0
	}
	bounds := q.bounds(now)
	args = append(args, kindQuota, q.Limit, len(bounds))
	for _, b := range bounds {
		args = append(args, b)
	}
	return args, 1
}

func (quotaKind) stats(p *Policy, raw *rawStats, s *Stats) {
	q := p.Quota
	if q == nil {
		return
	}
	start, end := q.windowAt(s.Now)
	qs := &QuotaStats{Quota: *q, WindowStart: start, WindowEnd: end}
	for _, slot := range [][2]string{{"qa", "qc"}, {"qb", "qd"}} {
		switch raw.hash[slot[0]] {
		case start.UnixMicro():
			qs.Used = raw.hash[slot[1]]
		case end.UnixMicro():
			qs.ReservedInNextWindow = raw.hash[slot[1]]
		}
	}
	qs.Remaining = max(q.Limit-qs.Used, 0)
	s.Quota = qs
}

func (quotaKind) rule(int64) string { return "quota" }
