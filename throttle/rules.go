package throttle

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Rate is a leaky bucket used as a meter (GCRA): Limit units per Period
// sustained, at most Burst back to back from a full bucket. The zero Burst
// means 1: perfectly even spacing.
//
// Its text form is "100/s" or "100/s burst 20" (String), and in a policy
// "rate=100/s burst=20".
type Rate struct {
	Limit  int64
	Period time.Duration
	Burst  int64
}

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
	return nil
}

// Window is an exact sliding window: never more than Limit units start in
// any interval of length Period. It keeps one entry per unit started in the
// last Period, so its memory grows with Limit.
type Window struct {
	Limit  int64
	Period time.Duration
}

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
	return nil
}

// MaxWindowLimit bounds a sliding window's size: the window stores one entry
// per unit, so its memory and the cost of a decision grow with the limit.
const MaxWindowLimit = 1_000_000

// Quota allows Limit units per calendar window. Windows start at every time
// the cron spec Reset fires in the time zone TZ ("" is UTC), so a daily quota
// resets exactly at midnight in that zone, across daylight-saving changes.
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

// QuotaPer returns a quota of n per "hour", "day", "week" (from Monday 00:00)
// or "month", in time zone tz ("" is UTC).
func QuotaPer(n int64, unit, tz string) (Quota, error) {
	for _, s := range quotaShorthands {
		if s.name == unit {
			q := Quota{Limit: n, Reset: s.spec, TZ: tz}
			return q, q.compile()
		}
	}
	return Quota{}, fmt.Errorf("quota %d/%s: unknown calendar unit %q; use hour, day, week or month, or reset=\"CRON SPEC\"", n, unit, unit)
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

// WindowAt returns the calendar window [start, end) that contains t.
func (q *Quota) WindowAt(t time.Time) (start, end time.Time) {
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

// Boundaries returns successive window starts beginning with the start of
// the window containing from and ending with the first start after to, at
// most max of them.
func (q *Quota) Boundaries(from, to time.Time, max int) []time.Time {
	start, _ := q.WindowAt(from)
	if start.IsZero() {
		start = from.Add(-time.Second)
	}
	out := []time.Time{start}
	for t := start; len(out) < max; {
		t = q.schedule.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
		if t.After(to) {
			break
		}
	}
	return out
}

// Concurrency allows at most Limit jobs to run at once across the fleet.
// Each running job holds a lease of Lease, renewed while it runs; a holder
// that stops renewing (a crashed worker) loses its slot after Lease.
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
	if c.Lease != 0 && c.Lease < time.Second {
		return fmt.Errorf("lease %s: must be at least 1s (it is renewed every lease/3 while a job runs)", c.Lease)
	}
	return nil
}

// periodUnits maps the unit names a period may use to durations.
var periodUnits = map[string]time.Duration{
	"ms": time.Millisecond,
	"s":  time.Second, "sec": time.Second, "second": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute,
	"h": time.Hour, "hour": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour,
}

// parseLimitPeriod reads "N/UNIT" or "N/DURATION" (100/s, 600/min, 10/5s).
func parseLimitPeriod(field, text string) (int64, time.Duration, error) {
	num, per, ok := strings.Cut(text, "/")
	if !ok {
		return 0, 0, fmt.Errorf("%s=%s: want N/PERIOD such as 100/s, 600/min, 5000/h or 10/5s", field, text)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%s=%s: the limit %q is not a whole number", field, text, num)
	}
	if n <= 0 {
		return 0, 0, fmt.Errorf("%s=%s: the limit must be at least 1", field, text)
	}
	p, err := parsePeriod(per)
	if err != nil {
		return 0, 0, fmt.Errorf("%s=%s: %v", field, text, err)
	}
	return n, p, nil
}

func parsePeriod(text string) (time.Duration, error) {
	if d, ok := periodUnits[text]; ok {
		return d, nil
	}
	d, err := time.ParseDuration(text)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("period %q: use s, min, h, day or a duration such as 10s or 1m30s", text)
	}
	return d, nil
}

func parseCount(field, text string) (int64, error) {
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%s: not a whole number", field, text)
	}
	if n <= 0 {
		return 0, fmt.Errorf("%s=%s: must be at least 1", field, text)
	}
	return n, nil
}

// formatPeriod prints a period as its unit name where one fits (s, min, h,
// day), otherwise as a Go duration.
func formatPeriod(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	case 24 * time.Hour:
		return "day"
	}
	return formatDuration(d)
}

// formatDuration prints a duration without the trailing zero units Go adds
// ("1m0s" becomes "1m", "1h0m0s" becomes "1h").
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
