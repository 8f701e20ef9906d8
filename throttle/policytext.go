package throttle

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The pieces of a policy's text form that every rule kind uses.

// The range the engine computes exactly. admit.lua keeps times as integer
// microseconds since 1970 in Lua numbers, which are doubles: exact up to
// 2^53 µs. A rule's span (a full rate bucket, a window, a lease) is added to
// the clock, so half of that range is left to the clock (2^52 µs from 1970
// reaches the year 2112) and half to a rule: about 142 years. Counts
// (limits) are exact up to 2^53.
const (
	// MaxSpan is the longest time a rule may span: a rate's full bucket
	// (burst × period / limit), a window's duration, a lease.
	MaxSpan = time.Duration(1<<52) * time.Microsecond
	// MaxCount is the largest limit of a quota or a concurrency rule.
	MaxCount = 1 << 53
)

const (
	maxSpanText  = "2^52 µs (about 142 years)"
	maxCountText = "2^53 (9007199254740992)"
)

// spanText prints a span of micros microseconds for people: 1h30m,
// 54.2 days, 317098 years.
func spanText(micros float64) string {
	const day = 86400e6
	switch {
	case micros < 2*day:
		return formatDuration(time.Duration(micros) * time.Microsecond)
	case micros < 730*day:
		return fmt.Sprintf("%.1f days", micros/day)
	}
	return fmt.Sprintf("%.0f years", micros/(365*day))
}

// checkSpan refuses a duration longer than MaxSpan; what names it ("the
// period 1300h").
func checkSpan(what string, d time.Duration) error {
	if d <= MaxSpan {
		return nil
	}
	return fmt.Errorf("%s (%s) is longer than the %s the engine computes exactly", what, spanText(float64(d.Microseconds())), maxSpanText)
}

// checkCount refuses a limit above MaxCount.
func checkCount(n int64) error {
	if n <= MaxCount {
		return nil
	}
	return fmt.Errorf("the limit is above %s, the largest count the engine keeps exactly", maxCountText)
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

// once records that key was given, and refuses it a second time.
func once(seen map[string]bool, key, val string) error {
	if seen[key] {
		return &PolicyError{key, val, fmt.Sprintf("given twice; give %s once", key)}
	}
	seen[key] = true
	return nil
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
