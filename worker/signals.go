package worker

import (
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Reading what a downstream says about its rate limits: Retry-After, the
// IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers, its current
// and older forms) and the common X-RateLimit-* headers. ParseSignal is
// pure; Observe (downstream.go) acts on what it reads.

// Signal is what one response of a downstream says about its rate limits.
// A field the response does not give (or gives in a form that cannot be
// read) is -1 (0 for Window); malformed values change nothing and are
// listed in Malformed.
type Signal struct {
	// Status is the response's HTTP status.
	Status int
	// Limit is the quota the downstream declares: Limit requests per
	// Window. -1 when none is declared.
	Limit int64
	// Window is the quota's time window; 0 when the response does not say
	// (X-RateLimit-Limit alone declares none).
	Window time.Duration
	// Remaining is how many requests the quota has left; -1 when unknown.
	Remaining int64
	// Reset is how long until the quota is restored; -1 when unknown.
	Reset time.Duration
	// RetryAfter is the response's Retry-After; -1 when absent.
	RetryAfter time.Duration
	// LimitFrom and RemainingFrom name the headers Limit (and Window) and
	// Remaining (and Reset) came from: RateLimit-Policy, RateLimit,
	// RateLimit-Limit, X-RateLimit-Limit, ...
	LimitFrom, RemainingFrom string
	// Malformed lists the headers present whose values could not be read,
	// as "Header: value".
	Malformed []string

	read, bad []string // signal kinds, for the metrics
}

// Signal kinds, the kind label of sluice_downstream_signals_total.
const (
	signalRetryAfter = "retry_after"
	signalIETF       = "ratelimit"        // RateLimit and RateLimit-Policy, current and draft-7 forms
	signalDraft      = "ratelimit_draft"  // RateLimit-Limit, -Remaining, -Reset
	signalX          = "x_ratelimit"      // X-RateLimit-* and X-Rate-Limit-*
	signalVendor     = "vendor_ratelimit" // OpenAI, Anthropic, Shopify
)

// epochThreshold tells a reset given as a Unix time from one given as
// seconds from now: no downstream resets its quota ten years ahead.
const epochThreshold = 10 * 365 * 24 * 3600

// ParseSignal reads the rate-limit signals of a response with status and
// header h, received at now. It never fails: what cannot be read is left
// out and listed in Malformed.
//
// When several header families are present, the most specific wins for
// each part: the IETF fields (RateLimit-Policy and RateLimit, current or
// draft-7 forms), then their older form (RateLimit-Limit, -Remaining,
// -Reset), then X-RateLimit-* (X-RateLimit-Reset-After before
// X-RateLimit-Reset), then vendor forms (OpenAI's x-ratelimit-*-requests,
// Anthropic's anthropic-ratelimit-requests-*, Shopify's
// X-Shopify-Shop-Api-Call-Limit).
func ParseSignal(status int, h http.Header, now time.Time) Signal {
	s := Signal{Status: status, Limit: -1, Remaining: -1, Reset: -1, RetryAfter: -1}
	if v, ok := header(h, "Retry-After"); ok {
		if d, ok := parseRetryAfterValue(v, now); ok {
			s.RetryAfter = d
			s.read = append(s.read, signalRetryAfter)
		} else {
			s.malformed(signalRetryAfter, "Retry-After", v)
		}
	}
	s.ietf(h)
	s.draft(h, now)
	s.xRateLimit(h, now)
	s.vendor(h, now)
	return s
}

// ParseResponse is ParseSignal of resp, received now.
func ParseResponse(resp *http.Response) Signal {
	return ParseSignal(resp.StatusCode, resp.Header, time.Now())
}

// HasLimit reports whether the response declared a quota with its window:
// a limit that can be learned.
func (s Signal) HasLimit() bool { return s.Limit > 0 && s.Window > 0 }

// Exhausted reports whether the response says the quota is used up until
// its reset: remaining 0 with a reset in the future.
func (s Signal) Exhausted() bool { return s.Remaining == 0 && s.Reset > 0 }

func (s *Signal) malformed(kind, name, value string) {
	s.bad = append(s.bad, kind)
	s.Malformed = append(s.Malformed, name+": "+value)
}

func (s *Signal) setLimit(n int64, w time.Duration, from string) {
	if s.Limit < 0 {
		s.Limit, s.Window, s.LimitFrom = n, w, from
	}
}

func (s *Signal) setRemaining(n int64, reset time.Duration, from string) {
	if s.Remaining < 0 {
		s.Remaining, s.Reset, s.RemainingFrom = n, reset, from
	}
}

// header is h's value of name (all its lines joined as one list), and
// whether it is present.
func header(h http.Header, name string) (string, bool) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return strings.TrimSpace(strings.Join(vs, ", ")), true
}

// parseRetryAfterValue reads delay-seconds (fractions are tolerated) or an
// HTTP date; a date in the past is 0.
func parseRetryAfterValue(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if d, ok := parseSeconds(v); ok {
		return d, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// parseSeconds reads a non-negative number of seconds, fractions allowed.
func parseSeconds(v string) (time.Duration, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) || f > float64(math.MaxInt64/int64(time.Second)) {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}

// parseCount reads a non-negative whole number.
func parseCountValue(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// parseReset reads a reset given as seconds from now or as a Unix time
// (seconds, or milliseconds), told apart by size: a value beyond ten
// years of seconds is a time. A time in the past is a reset of 0.
func parseReset(v string, now time.Time) (time.Duration, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	switch {
	case f <= epochThreshold:
		return time.Duration(f * float64(time.Second)), true
	case f > 1e15:
		return 0, false
	case f > 1e11: // a Unix time in milliseconds
		return max(time.UnixMilli(int64(f)).Sub(now), 0), true
	default:
		sec, frac := math.Modf(f)
		return max(time.Unix(int64(sec), int64(frac*1e9)).Sub(now), 0), true
	}
}

// sfMember is one member of a structured field list or dictionary
// (RFC 8941), read leniently: its bare item and its parameters.
type sfMember struct {
	item   string // a token, a string (unquoted) or a number, as text
	params map[string]string
}

// parseSFList splits a structured field list on commas outside quotes and
// each member on semicolons; false when a quote is not closed.
func parseSFList(v string) ([]sfMember, bool) {
	var parts []string
	var cur strings.Builder
	inQuote := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(v):
			cur.WriteByte(c)
			cur.WriteByte(v[i+1])
			i++
			continue
		case c == '"':
			inQuote = !inQuote
		case c == ',' && !inQuote:
			parts = append(parts, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	if inQuote {
		return nil, false
	}
	parts = append(parts, cur.String())
	var out []sfMember
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		fields := strings.Split(p, ";")
		m := sfMember{item: unquote(strings.TrimSpace(fields[0])), params: map[string]string{}}
		for _, f := range fields[1:] {
			k, val, _ := strings.Cut(strings.TrimSpace(f), "=")
			m.params[strings.ToLower(strings.TrimSpace(k))] = unquote(strings.TrimSpace(val))
		}
		out = append(out, m)
	}
	return out, true
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return strings.ReplaceAll(s[1:len(s)-1], `\"`, `"`)
	}
	return s
}

// ietf reads RateLimit-Policy and RateLimit, in the current draft's form
// (RateLimit-Policy: "default";q=100;w=60 and RateLimit: "default";r=0;t=10)
// and draft 7's (RateLimit-Policy: 100;w=60 and
// RateLimit: limit=100, remaining=0, reset=10).
func (s *Signal) ietf(h http.Header) {
	if v, ok := header(h, "RateLimit-Policy"); ok {
		if n, w, ok := parsePolicies(v); ok {
			s.setLimit(n, w, "RateLimit-Policy")
			s.read = append(s.read, signalIETF)
		} else {
			s.malformed(signalIETF, "RateLimit-Policy", v)
		}
	}
	v, ok := header(h, "RateLimit")
	if !ok {
		return
	}
	members, ok := parseSFList(v)
	if !ok || len(members) == 0 {
		s.malformed(signalIETF, "RateLimit", v)
		return
	}
	if k, _, _ := strings.Cut(members[0].item, "="); isDraft7Key(k) {
		s.ietfDraft7(v, members)
		return
	}
	// current form: one member per quota policy, r remaining, t seconds
	// to its reset; the most constrained one counts
	found := false
	for _, m := range members {
		r, rok := parseCountValue(m.params["r"])
		t, tok := parseSeconds(m.params["t"])
		if _, has := m.params["t"]; has && !tok {
			rok = false
		}
		if !rok {
			continue
		}
		if !tok {
			t = -1
		}
		if !found || r < s.Remaining || (r == s.Remaining && t > s.Reset) {
			if s.RemainingFrom == "" || s.RemainingFrom == "RateLimit" {
				s.Remaining, s.Reset, s.RemainingFrom = r, t, "RateLimit"
			}
		}
		found = true
	}
	if found {
		s.read = append(s.read, signalIETF)
	} else {
		s.malformed(signalIETF, "RateLimit", v)
	}
}

func isDraft7Key(k string) bool {
	switch strings.ToLower(strings.TrimSpace(k)) {
	case "limit", "remaining", "reset":
		return true
	}
	return false
}

// ietfDraft7 reads draft 7's dictionary: limit=100, remaining=0, reset=10.
func (s *Signal) ietfDraft7(v string, members []sfMember) {
	limit, remaining, reset := int64(-1), int64(-1), time.Duration(-1)
	for _, m := range members {
		k, val, _ := strings.Cut(m.item, "=")
		val = unquote(strings.TrimSpace(val))
		var ok bool
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "limit":
			limit, ok = parseCountValue(val)
		case "remaining":
			remaining, ok = parseCountValue(val)
		case "reset":
			reset, ok = parseSeconds(val)
		default:
			ok = true // other keys are not ours
		}
		if !ok {
			s.malformed(signalIETF, "RateLimit", v)
			return
		}
	}
	if remaining >= 0 {
		s.setRemaining(remaining, reset, "RateLimit")
	}
	if limit > 0 {
		// the window is RateLimit-Policy's (read above); without one the
		// limit is known but not its window
		s.setLimit(limit, 0, "RateLimit")
	}
	s.read = append(s.read, signalIETF)
}

// parsePolicies reads a list of quota policies, each "NAME";q=N;w=SECONDS
// (current draft) or N;w=SECONDS (draft 7 and older), and returns the one
// of the lowest rate. A member without a window counts only when no other
// has one.
func parsePolicies(v string) (int64, time.Duration, bool) {
	members, ok := parseSFList(v)
	if !ok || len(members) == 0 {
		return 0, 0, false
	}
	bestN, bestW := int64(-1), time.Duration(0)
	for _, m := range members {
		qText, hasQ := m.params["q"]
		if !hasQ {
			qText = m.item // N;w=60
		}
		n, ok := parseCountValue(qText)
		if !ok || n == 0 {
			return 0, 0, false
		}
		var w time.Duration
		if wText, has := m.params["w"]; has {
			if w, ok = parseSeconds(wText); !ok || w <= 0 {
				return 0, 0, false
			}
		}
		switch {
		case bestN < 0,
			bestW == 0 && w > 0,
			w > 0 && float64(n)/w.Seconds() < float64(bestN)/bestW.Seconds():
			bestN, bestW = n, w
		}
	}
	return bestN, bestW, true
}

// draft reads the older draft's RateLimit-Limit (which may list quota
// policies: 10, 10;w=1, 1000;w=3600), RateLimit-Remaining and
// RateLimit-Reset (seconds).
func (s *Signal) draft(h http.Header, now time.Time) {
	if v, ok := header(h, "RateLimit-Limit"); ok {
		if n, w, ok := parsePolicies(v); ok {
			s.setLimit(n, w, "RateLimit-Limit")
			s.read = append(s.read, signalDraft)
		} else {
			s.malformed(signalDraft, "RateLimit-Limit", v)
		}
	}
	s.remainingAndReset(h, signalDraft, "RateLimit-Remaining", "RateLimit-Reset", "", now)
}

// remainingAndReset reads a remaining count and its reset (after resetAfter
// when that header is present), kind's headers.
func (s *Signal) remainingAndReset(h http.Header, kind, remName, resetName, afterName string, now time.Time) {
	rv, hasR := header(h, remName)
	if !hasR {
		return
	}
	r, ok := parseCountValue(rv)
	if !ok {
		s.malformed(kind, remName, rv)
		return
	}
	reset := time.Duration(-1)
	if afterName != "" {
		if v, has := header(h, afterName); has {
			if d, ok := parseSeconds(v); ok {
				reset = d
			} else {
				s.malformed(kind, afterName, v)
			}
		}
	}
	if v, has := header(h, resetName); has && reset < 0 {
		if d, ok := parseReset(v, now); ok {
			reset = d
		} else {
			s.malformed(kind, resetName, v)
		}
	}
	s.setRemaining(r, reset, remName)
	s.read = append(s.read, kind)
}

// xRateLimit reads X-RateLimit-Limit, -Remaining, -Reset (seconds from now
// or a Unix time) and -Reset-After (seconds), and their X-Rate-Limit-*
// spelling (Twitter/X). X-RateLimit-Limit declares no window.
func (s *Signal) xRateLimit(h http.Header, now time.Time) {
	for _, base := range []string{"X-RateLimit-", "X-Rate-Limit-"} {
		if v, ok := header(h, base+"Limit"); ok {
			if n, ok := parseCountValue(v); ok && n > 0 {
				s.setLimit(n, 0, base+"Limit")
				s.read = append(s.read, signalX)
			} else {
				s.malformed(signalX, base+"Limit", v)
			}
		}
		s.remainingAndReset(h, signalX, base+"Remaining", base+"Reset", base+"Reset-After", now)
	}
}

// vendor reads OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// (resets as durations: 1s, 6m0s), Anthropic's
// anthropic-ratelimit-requests-{limit,remaining,reset} (reset as an RFC 3339
// time) and Shopify's X-Shopify-Shop-Api-Call-Limit (used/bucket). A quota
// of tokens used up counts as the quota used up.
func (s *Signal) vendor(h http.Header, now time.Time) {
	if v, ok := header(h, "X-Ratelimit-Limit-Requests"); ok {
		if n, ok := parseCountValue(v); ok && n > 0 {
			s.setLimit(n, 0, "X-Ratelimit-Limit-Requests")
			s.read = append(s.read, signalVendor)
		} else {
			s.malformed(signalVendor, "X-Ratelimit-Limit-Requests", v)
		}
	}
	for _, unit := range []string{"Requests", "Tokens"} {
		name := "X-Ratelimit-Remaining-" + unit
		rv, ok := header(h, name)
		if !ok {
			continue
		}
		r, rok := parseCountValue(rv)
		if !rok {
			s.malformed(signalVendor, name, rv)
			continue
		}
		reset := time.Duration(-1)
		if v, ok := header(h, "X-Ratelimit-Reset-"+unit); ok {
			if d, err := time.ParseDuration(v); err == nil && d >= 0 {
				reset = d
			} else if d, ok := parseSeconds(v); ok {
				reset = d
			} else {
				s.malformed(signalVendor, "X-Ratelimit-Reset-"+unit, v)
			}
		}
		s.read = append(s.read, signalVendor)
		switch {
		case unit == "Requests":
			s.setRemaining(r, reset, name)
		case r == 0 && (s.Remaining < 0 || s.RemainingFrom == "X-Ratelimit-Remaining-Requests"):
			// the tokens are used up: the quota is, whatever requests remain
			s.Remaining, s.Reset, s.RemainingFrom = 0, max(reset, s.Reset), name
		}
	}
	if v, ok := header(h, "Anthropic-Ratelimit-Requests-Limit"); ok {
		if n, ok := parseCountValue(v); ok && n > 0 {
			s.setLimit(n, 0, "Anthropic-Ratelimit-Requests-Limit")
			s.read = append(s.read, signalVendor)
		} else {
			s.malformed(signalVendor, "Anthropic-Ratelimit-Requests-Limit", v)
		}
	}
	if rv, ok := header(h, "Anthropic-Ratelimit-Requests-Remaining"); ok {
		if r, ok := parseCountValue(rv); ok {
			reset := time.Duration(-1)
			if v, ok := header(h, "Anthropic-Ratelimit-Requests-Reset"); ok {
				if t, err := time.Parse(time.RFC3339, v); err == nil {
					reset = max(t.Sub(now), 0)
				} else {
					s.malformed(signalVendor, "Anthropic-Ratelimit-Requests-Reset", v)
				}
			}
			s.setRemaining(r, reset, "Anthropic-Ratelimit-Requests-Remaining")
			s.read = append(s.read, signalVendor)
		} else {
			s.malformed(signalVendor, "Anthropic-Ratelimit-Requests-Remaining", rv)
		}
	}
	if v, ok := header(h, "X-Shopify-Shop-Api-Call-Limit"); ok {
		used, bucket, _ := strings.Cut(v, "/")
		u, uok := parseCountValue(used)
		b, bok := parseCountValue(bucket)
		if uok && bok && b > 0 && u <= b {
			s.setLimit(b, 0, "X-Shopify-Shop-Api-Call-Limit")
			s.setRemaining(b-u, -1, "X-Shopify-Shop-Api-Call-Limit")
			s.read = append(s.read, signalVendor)
		} else {
			s.malformed(signalVendor, "X-Shopify-Shop-Api-Call-Limit", v)
		}
	}
}

// String describes the signal in one line, for logs and tests.
func (s Signal) String() string {
	var parts []string
	parts = append(parts, "status "+strconv.Itoa(s.Status))
	if s.Limit >= 0 {
		p := "limit " + strconv.FormatInt(s.Limit, 10)
		if s.Window > 0 {
			p += " per " + s.Window.String()
		}
		parts = append(parts, p+" ("+s.LimitFrom+")")
	}
	if s.Remaining >= 0 {
		p := "remaining " + strconv.FormatInt(s.Remaining, 10)
		if s.Reset >= 0 {
			p += " reset in " + s.Reset.String()
		}
		parts = append(parts, p+" ("+s.RemainingFrom+")")
	}
	if s.RetryAfter >= 0 {
		parts = append(parts, "retry after "+s.RetryAfter.String())
	}
	if len(s.Malformed) > 0 {
		m := append([]string(nil), s.Malformed...)
		sort.Strings(m)
		parts = append(parts, "malformed: "+strings.Join(m, "; "))
	}
	return strings.Join(parts, ", ")
}
