package worker

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseSignal(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return fmt.Sprint(now.Add(d).Unix()) }
	type want struct {
		limit     int64
		window    time.Duration
		remaining int64
		reset     time.Duration
		retry     time.Duration
		limitFrom string
		remFrom   string
		malformed int
	}
	none := want{limit: -1, remaining: -1, reset: -1, retry: -1}
	with := func(f func(*want)) want { w := none; f(&w); return w }
	cases := []struct {
		name   string
		status int
		h      map[string]string
		want   want
	}{
		{"no headers", 200, nil, none},
		{"Retry-After seconds", 429, map[string]string{"Retry-After": "120"}, with(func(w *want) { w.retry = 2 * time.Minute })},
		{"Retry-After HTTP date", 503, map[string]string{"Retry-After": now.Add(30 * time.Second).Format(http.TimeFormat)}, with(func(w *want) { w.retry = 30 * time.Second })},
		{"Retry-After date in the past", 503, map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, with(func(w *want) { w.retry = 0 })},
		{"IETF current draft", 200, map[string]string{
			"RateLimit-Policy": `"default";q=100;w=60`,
			"RateLimit":        `"default";r=0;t=10`,
		}, want{100, time.Minute, 0, 10 * time.Second, -1, "RateLimit-Policy", "RateLimit", 0}},
		{"IETF several policies: the lowest rate, the most constrained", 200, map[string]string{
			"RateLimit-Policy": `"burst";q=100;w=1, "day";q=1000;w=86400`,
			"RateLimit":        `"burst";r=50;t=1, "day";r=0;t=3600`,
		}, want{1000, 24 * time.Hour, 0, time.Hour, -1, "RateLimit-Policy", "RateLimit", 0}},
		{"IETF draft 7", 429, map[string]string{
			"RateLimit":        "limit=100, remaining=0, reset=10",
			"RateLimit-Policy": "100;w=60",
			"Retry-After":      "10",
		}, want{100, time.Minute, 0, 10 * time.Second, 10 * time.Second, "RateLimit-Policy", "RateLimit", 0}},
		{"IETF draft 7 without policy: no window", 200, map[string]string{
			"RateLimit": "limit=100, remaining=99, reset=50",
		}, want{100, 0, 99, 50 * time.Second, -1, "RateLimit", "RateLimit", 0}},
		{"older draft", 200, map[string]string{
			"RateLimit-Limit":     "10, 10;w=1, 1000;w=3600",
			"RateLimit-Remaining": "9",
			"RateLimit-Reset":     "1",
		}, want{1000, time.Hour, 9, time.Second, -1, "RateLimit-Limit", "RateLimit-Remaining", 0}},
		{"GitHub", 200, map[string]string{
			"X-RateLimit-Limit":     "5000",
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Used":      "5000",
			"X-RateLimit-Reset":     epoch(25 * time.Minute),
			"X-RateLimit-Resource":  "core",
		}, want{5000, 0, 0, 25 * time.Minute, -1, "X-RateLimit-Limit", "X-RateLimit-Remaining", 0}},
		{"GitHub secondary limit", 403, map[string]string{"Retry-After": "60"}, with(func(w *want) { w.retry = time.Minute })},
		{"Twitter/X", 429, map[string]string{
			"x-rate-limit-limit":     "900",
			"x-rate-limit-remaining": "0",
			"x-rate-limit-reset":     epoch(15 * time.Minute),
		}, want{900, 0, 0, 15 * time.Minute, -1, "X-Rate-Limit-Limit", "X-Rate-Limit-Remaining", 0}},
		{"Discord: Reset-After wins over Reset", 200, map[string]string{
			"X-RateLimit-Limit":       "5",
			"X-RateLimit-Remaining":   "0",
			"X-RateLimit-Reset":       fmt.Sprintf("%d.500", now.Add(2*time.Second).Unix()),
			"X-RateLimit-Reset-After": "1.234",
			"X-RateLimit-Bucket":      "abcd1234",
		}, want{5, 0, 0, 1234 * time.Millisecond, -1, "X-RateLimit-Limit", "X-RateLimit-Remaining", 0}},
		{"X-RateLimit-Reset as seconds from now", 200, map[string]string{
			"X-RateLimit-Remaining": "3",
			"X-RateLimit-Reset":     "42",
		}, with(func(w *want) { w.remaining, w.reset, w.remFrom = 3, 42*time.Second, "X-RateLimit-Remaining" })},
		{"X-RateLimit-Reset as Unix milliseconds", 200, map[string]string{
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset":     fmt.Sprint(now.Add(1500 * time.Millisecond).UnixMilli()),
		}, with(func(w *want) { w.remaining, w.reset, w.remFrom = 0, 1500*time.Millisecond, "X-RateLimit-Remaining" })},
		{"X-RateLimit-Reset in the past", 200, map[string]string{
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset":     epoch(-time.Minute),
		}, with(func(w *want) { w.remaining, w.reset, w.remFrom = 0, 0, "X-RateLimit-Remaining" })},
		{"Stripe: a 429 without limit headers", 429, map[string]string{
			"Stripe-Should-Retry": "true",
			"Request-Id":          "req_123",
		}, none},
		{"Shopify REST", 200, map[string]string{"X-Shopify-Shop-Api-Call-Limit": "39/40"},
			with(func(w *want) {
				w.limit, w.remaining, w.limitFrom, w.remFrom = 40, 1, "X-Shopify-Shop-Api-Call-Limit", "X-Shopify-Shop-Api-Call-Limit"
			})},
		{"OpenAI", 200, map[string]string{
			"x-ratelimit-limit-requests":     "60",
			"x-ratelimit-limit-tokens":       "150000",
			"x-ratelimit-remaining-requests": "59",
			"x-ratelimit-remaining-tokens":   "149984",
			"x-ratelimit-reset-requests":     "1s",
			"x-ratelimit-reset-tokens":       "6m0s",
		}, want{60, 0, 59, time.Second, -1, "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", 0}},
		{"OpenAI tokens used up", 429, map[string]string{
			"x-ratelimit-remaining-requests": "59",
			"x-ratelimit-reset-requests":     "1s",
			"x-ratelimit-remaining-tokens":   "0",
			"x-ratelimit-reset-tokens":       "20ms",
		}, with(func(w *want) { w.remaining, w.reset, w.remFrom = 0, time.Second, "X-Ratelimit-Remaining-Tokens" })},
		{"Anthropic", 200, map[string]string{
			"anthropic-ratelimit-requests-limit":     "50",
			"anthropic-ratelimit-requests-remaining": "0",
			"anthropic-ratelimit-requests-reset":     now.Add(3 * time.Second).Format(time.RFC3339),
		}, want{50, 0, 0, 3 * time.Second, -1, "Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", 0}},
		{"IETF wins over X-RateLimit", 200, map[string]string{
			"RateLimit-Policy":        `"default";q=40;w=1`,
			"RateLimit":               `"default";r=1;t=0`,
			"X-RateLimit-Limit":       "40",
			"X-RateLimit-Remaining":   "1",
			"X-RateLimit-Reset-After": "0.025",
		}, want{40, time.Second, 1, 0, -1, "RateLimit-Policy", "RateLimit", 0}},

		// malformed values change nothing and are listed
		{"Retry-After garbage", 429, map[string]string{"Retry-After": "soon"}, with(func(w *want) { w.malformed = 1 })},
		{"Retry-After negative", 429, map[string]string{"Retry-After": "-5"}, with(func(w *want) { w.malformed = 1 })},
		{"Retry-After empty", 429, map[string]string{"Retry-After": ""}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit-Policy without quota", 200, map[string]string{"RateLimit-Policy": `"default";w=60`}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit-Policy quota 0", 200, map[string]string{"RateLimit-Policy": `"default";q=0;w=60`}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit-Policy negative window", 200, map[string]string{"RateLimit-Policy": `"default";q=10;w=-1`}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit-Policy unclosed quote", 200, map[string]string{"RateLimit-Policy": `"default;q=10;w=1`}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit without r", 200, map[string]string{"RateLimit": `"default";t=10`}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit r not a number", 200, map[string]string{"RateLimit": `"default";r=lots;t=10`}, with(func(w *want) { w.malformed = 1 })},
		{"RateLimit draft 7 garbage", 200, map[string]string{"RateLimit": "limit=ten, remaining=0, reset=10"}, with(func(w *want) { w.malformed = 1 })},
		{"X-RateLimit-Remaining negative", 200, map[string]string{"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "10"}, with(func(w *want) { w.malformed = 1 })},
		{"X-RateLimit-Limit zero", 200, map[string]string{"X-RateLimit-Limit": "0"}, with(func(w *want) { w.malformed = 1 })},
		{"X-RateLimit-Reset garbage keeps remaining", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "tomorrow"},
			with(func(w *want) { w.remaining, w.remFrom, w.malformed = 0, "X-RateLimit-Remaining", 1 })},
		{"X-RateLimit-Reset NaN", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "NaN"},
			with(func(w *want) { w.remaining, w.remFrom, w.malformed = 0, "X-RateLimit-Remaining", 1 })},
		{"Shopify used over bucket", 200, map[string]string{"X-Shopify-Shop-Api-Call-Limit": "41/40"}, with(func(w *want) { w.malformed = 1 })},
		{"OpenAI reset garbage", 200, map[string]string{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "in a bit"},
			with(func(w *want) { w.remaining, w.remFrom, w.malformed = 0, "X-Ratelimit-Remaining-Requests", 1 })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.h {
				h.Set(k, v)
			}
			s := ParseSignal(c.status, h, now)
			got := want{s.Limit, s.Window, s.Remaining, s.Reset, s.RetryAfter, s.LimitFrom, s.RemainingFrom, len(s.Malformed)}
			require.Equal(t, c.want, got, "%s", s)
			require.Equal(t, len(s.Malformed), len(s.bad))
		})
	}
}
