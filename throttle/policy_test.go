package throttle

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// canonicalPolicies are policy texts in their canonical form: String gives
// them back exactly.
var canonicalPolicies = []string{
	"",
	"rate=100/s",
	"rate=100/s burst=20",
	"rate=100/s burst=20 rate=5000/h",
	"rate=10/s burst=5 rate=600/min burst=50 rate=10000/h",
	"rate=10/5s",
	"rate=1/1m30s",
	"rate=3/day",
	"rate=5/2h",
	"rate=1/500ms",
	"rate=1000000/s",
	"window=600/min",
	"window=20/500ms",
	"quota=10000/day",
	"quota=10000/day tz=UTC",
	"quota=5/hour tz=Asia/Kolkata",
	"quota=5/week tz=Europe/Paris",
	"quota=5/month",
	`quota=25 reset="*/2 * * * *"`,
	`quota=500 reset="0 9 * * 1-5" tz=America/New_York`,
	`quota=7 reset="@daily"`,
	"concurrency=5",
	"concurrency=5 lease=30s",
	"concurrency=1 lease=2m",
	"concurrency=1 lease=1h30m",
	"overflow=defer",
	"overflow=drop",
	"overflow=wait",
	"overflow=wait max_wait=500ms",
	"backlog=50000",
	"weight=3",
	"fail_open=true",
	"rate=40/s learn=false",
	"rate=100/s burst=20 rate=5000/h window=600/min quota=10000/day tz=UTC concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000 weight=2 fail_open=true",
}

func TestPolicyCanonicalRoundTrip(t *testing.T) {
	t.Parallel()
	for _, text := range canonicalPolicies {
		p, err := ParsePolicy(text)
		require.NoError(t, err, text)
		require.Equal(t, text, p.String())
		again, err := ParsePolicy(p.String())
		require.NoError(t, err, text)
		require.Equal(t, p, again, text)
	}
}

func TestPolicyCanonicalForm(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"rate=100/s burst=1":            "rate=100/s",
		"rate=100/1s":                   "rate=100/s",
		"rate=100/sec":                  "rate=100/s",
		"rate=100/second":               "rate=100/s",
		"rate=1/60s":                    "rate=1/min",
		"rate=1/m":                      "rate=1/min",
		"rate=1/minute":                 "rate=1/min",
		"rate=1/60m":                    "rate=1/h",
		"rate=1/hour":                   "rate=1/h",
		"rate=5/24h":                    "rate=5/day",
		"rate=5/d":                      "rate=5/day",
		"rate=5/1000ms":                 "rate=5/s",
		"window=5/90s":                  "window=5/1m30s",
		`quota=5 reset="0 0 * * *"`:     "quota=5/day",
		`quota=5 reset="0 * * * *"`:     "quota=5/hour",
		"quota=5/day tz=UTC":            "quota=5/day tz=UTC",
		"concurrency=5 lease=30000ms":   "concurrency=5 lease=30s",
		"concurrency=5 lease=60s":       "concurrency=5 lease=1m",
		"fail_open=false shape=false":   "",
		"learn=true":                    "",
		"shape=1":                       "",
		"weight=1":                      "",
		"overflow=wait max_wait=1000ms": "overflow=wait max_wait=1s",
		"concurrency=2 rate=1/s":        "rate=1/s concurrency=2",
		"backlog=10 window=1/s":         "window=1/s backlog=10",
		"  rate=1/s,\tconcurrency=2\n":  "rate=1/s concurrency=2",
		// a rate given twice is one rule, kept once; a different burst is
		// a different rule
		"rate=1/s rate=1/s":                         "rate=1/s",
		"rate=1/s rate=10/min rate=1/s":             "rate=1/s rate=10/min",
		"rate=5/s burst=2 rate=5/s burst=2":         "rate=5/s burst=2",
		"rate=1/s rate=2/2s":                        "rate=1/s",
		"rate=1/s burst=5 rate=1/s":                 "rate=1/s burst=5 rate=1/s",
		"rate=100/s rate=100/s rate=100/s rate=1/h": "rate=100/s rate=1/h",
		"rate=100/s burst=20 rate=5000/h window=600/min quota=10000/day tz=UTC concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000 shape=true fail_open=false": "rate=100/s burst=20 rate=5000/h window=600/min quota=10000/day tz=UTC concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000",
	} {
		p, err := ParsePolicy(in)
		require.NoError(t, err, in)
		require.Equal(t, want, p.String(), in)
	}
}

func TestPolicyFields(t *testing.T) {
	t.Parallel()
	p, err := ParsePolicy(`rate=100/s burst=20 rate=5000/h window=600/min quota=10 reset="0 9 * * *" tz=Europe/Paris concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000 shape=true fail_open=true`)
	require.NoError(t, err)
	require.Equal(t, []Rate{{Limit: 100, Period: time.Second, Burst: 20}, {Limit: 5000, Period: time.Hour, Burst: 1}}, p.Rates)
	require.Equal(t, &Window{Limit: 600, Period: time.Minute}, p.Window)
	require.Equal(t, int64(10), p.Quota.Limit)
	require.Equal(t, "0 9 * * *", p.Quota.Reset)
	require.Equal(t, "Europe/Paris", p.Quota.TZ)
	require.Equal(t, &Concurrency{Limit: 5, Lease: 30 * time.Second}, p.Concurrency)
	require.Equal(t, OverflowWait, p.Overflow)
	require.Equal(t, 500*time.Millisecond, p.MaxWait)
	require.Equal(t, int64(50000), p.Backlog)
	require.True(t, p.FailOpen)
	require.True(t, p.HasRules())
	max, rule := p.maxCostOf()
	require.Equal(t, int64(1), max)
	require.Equal(t, "rate[1] (5000/h)", rule)

	empty, err := ParsePolicy("")
	require.NoError(t, err)
	require.Equal(t, &Policy{}, empty)
	require.False(t, empty.HasRules())
	max, _ = empty.maxCostOf()
	require.Equal(t, int64(-1), max)
	var none *Policy
	require.Equal(t, "", none.String())
	require.False(t, none.HasRules())
}

func TestPolicyPace(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]time.Duration{
		"":                                     0,
		"concurrency=5 quota=10/day":           0,
		"rate=100/s burst=20":                  10 * time.Millisecond,
		"rate=100/s rate=5000/h":               720 * time.Millisecond,
		"rate=100/s window=600/min":            100 * time.Millisecond,
		"window=3/s rate=1000/s":               time.Second / 3,
		"rate=2/day quota=1/day concurrency=1": 12 * time.Hour,
	} {
		p, err := ParsePolicy(text)
		require.NoError(t, err, text)
		require.Equal(t, want, p.pace(), text)
	}
	var none *Policy
	require.Zero(t, none.pace())
}

func TestPolicyInvalid(t *testing.T) {
	t.Parallel()
	// each error must contain every one of the strings: the field, the
	// value given, and what to do
	for _, c := range []struct {
		text string
		want []string
	}{
		{"rate=0/s", []string{"rate=0/s", "at least 1"}},
		{"rate=-5/s", []string{"rate=-5/s", "at least 1"}},
		{"rate=x/s", []string{"rate=x/s", "whole number"}},
		{"rate=10", []string{"rate=10", "N/PERIOD"}},
		{"rate=10/0s", []string{"rate=10/0s", "period"}},
		{"rate=10/-1s", []string{"rate=10/-1s", "period"}},
		{"rate=10/fortnight", []string{"rate=10/fortnight", "period", "fortnight"}},
		{"rate=1/500us", []string{"1/500µs", "at least 1ms"}},
		{"rate=2000000/s", []string{"2000000/s", "microsecond"}},
		{"rate=1/s burst=0", []string{"burst=0", "at least 1"}},
		{"rate=1/s burst=-2", []string{"burst=-2", "at least 1"}},
		{"rate=1/s burst=many", []string{"burst=many", "whole number"}},
		{"burst=5", []string{"burst=5", "belongs to a rate"}},
		{"rate=1/s burst=2 burst=3", []string{"burst=3", "twice"}},
		{"window=0/s", []string{"window=0/s", "at least 1"}},
		{"window=5/0ms", []string{"window=5/0ms", "period"}},
		{"window=5/100us", []string{"window 5/100µs", "at least 1ms"}},
		{"window=2000000/s", []string{"2000000/s", "1000000"}},
		{"window=1/s window=2/s", []string{"window=2/s", "twice"}},
		{"quota=0/day", []string{"quota=0/day", "at least 1"}},
		{"quota=-1/day", []string{"quota=-1/day", "at least 1"}},
		{"quota=5/year", []string{"quota=5/year", `"year"`, "hour, day, week or month"}},
		{"quota=5", []string{"quota=5", "reset="}},
		{`quota=5 reset="61 * * * *"`, []string{"61 * * * *", "cron"}},
		{`quota=5 reset="0 0 30 2 *"`, []string{"0 0 30 2 *", "never fires"}},
		{`quota=5 reset="CRON_TZ=UTC 0 0 * * *"`, []string{"CRON_TZ=UTC 0 0 * * *", "tz="}},
		{`quota=5/day reset="0 9 * * *"`, []string{"reset=0 9 * * *", "not both"}},
		{`reset="0 9 * * *"`, []string{"reset=0 9 * * *", "belongs to a quota"}},
		{"quota=5/day tz=Mars/Olympus", []string{"Mars/Olympus", "time zone"}},
		{"quota=5/day tz=Local", []string{`"Local"`, "time zone"}},
		{"tz=UTC", []string{"tz=UTC", "belongs to a quota"}},
		{"quota=5/day tz=UTC tz=UTC", []string{"tz=UTC", "twice"}},
		{"concurrency=0", []string{"concurrency=0", "at least 1"}},
		{"concurrency=-1", []string{"concurrency=-1", "at least 1"}},
		{"concurrency=2 lease=500ms", []string{"lease", "500ms", "at least 1s"}},
		{"concurrency=2 lease=0s", []string{"lease", "0s", "at least 1s"}},
		{"concurrency=2 lease=-5s", []string{"lease", "-5s", "at least 1s"}},
		{"concurrency=2 lease=soon", []string{"lease=soon", "duration"}},
		{"lease=30s", []string{"lease=30s", "belongs to concurrency"}},
		{"concurrency=1 concurrency=2", []string{"concurrency=2", "twice"}},
		{"overflow=retry", []string{"overflow=retry", "defer", "wait", "drop"}},
		{"max_wait=1s", []string{"max_wait=1s", "overflow=wait"}},
		{"overflow=drop max_wait=1s", []string{"max_wait=1s", "overflow=wait"}},
		{"overflow=wait max_wait=0s", []string{"max_wait", "0s", "positive"}},
		{"overflow=wait max_wait=-1s", []string{"max_wait", "-1s"}},
		{"overflow=wait max_wait=later", []string{"max_wait=later", "duration"}},
		{"backlog=0", []string{"backlog=0", "at least 1"}},
		{"backlog=-3", []string{"backlog=-3", "at least 1"}},
		{"shape=yes", []string{"shape=yes", "true or false"}},
		{"fail_open=maybe", []string{"fail_open=maybe", "true or false"}},
		{"learn=off", []string{"learn=off", "true or false"}},
		{"shape=true shape=true", []string{"shape=true", "twice"}},
		{"colour=blue", []string{"colour=blue", "unknown option"}},
		{"rate", []string{`"rate"`, "key=value"}},
		{"rate=", []string{`"rate="`, "key=value"}},
		{`quota=5 reset="0 0 * * *`, []string{"quote", "not closed"}},
		{"rate=1/s \xff", []string{"UTF-8"}},
		{"=5", []string{`"=5"`, "no option name before ="}},
		{"rate=1/s =5", []string{`"=5"`, "no option name before ="}},
		// Beyond what the engine computes exactly: its times are integer
		// microseconds in Lua numbers (doubles, exact to 2^53), and a rule's
		// span is added to the clock.
		{"rate=1/s burst=10000000000000", []string{"rate[0] 1/s burst 10000000000000", "spans 10000000000000 × 1s = 317098 years", "2^52 µs (about 142 years)", "burst 4503599627 or less", "quota"}},
		{"rate=1/h burst=3000000000", []string{"rate[0] 1/h burst 3000000000", "342466 years", "burst 1250999 or less"}},
		{"rate=1/day burst=200000000", []string{"rate[0] 1/day burst 200000000", "547945 years", "burst 52124 or less"}},
		{"rate=10/s rate=1/s burst=4503599628", []string{"rate[1] 1/s burst 4503599628", "143 years", "burst 4503599627 or less"}},
		{"rate=1/1251000h", []string{"rate[0] 1/1251000h", "the period 1251000h (143 years) is longer than the 2^52 µs (about 142 years)"}},
		{"rate=3/s burst=9223372036854775807", []string{"burst 9223372036854775807", "burst 13510798882 or less"}},
		{"window=5/1251000h", []string{"window 5/1251000h", "the duration 1251000h (143 years)", "2^52 µs (about 142 years)"}},
		{"quota=9007199254740993/day", []string{"quota 9007199254740993", "2^53 (9007199254740992)"}},
		{"concurrency=9007199254740993", []string{"concurrency 9007199254740993", "2^53 (9007199254740992)"}},
		{"concurrency=2 lease=1251000h", []string{"lease 1251000h", "2^52 µs (about 142 years)"}},
	} {
		p, err := ParsePolicy(c.text)
		require.Error(t, err, c.text)
		require.Nil(t, p, c.text)
		var pe *PolicyError
		require.ErrorAs(t, err, &pe, c.text)
		for _, w := range c.want {
			require.Contains(t, err.Error(), w, "policy %q", c.text)
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	// policies built in Go are checked like parsed ones
	for _, c := range []struct {
		p    Policy
		want string
	}{
		{Policy{Rates: []Rate{{Limit: 0, Period: time.Second}}}, "rate[0] 0/s"},
		{Policy{Rates: []Rate{PerSecond(1), {Limit: 1, Period: 0}}}, "rate[1] 1/0s"},
		{Policy{Rates: []Rate{{Limit: 1, Period: time.Second, Burst: -1}}}, "burst -1"},
		{Policy{Window: &Window{Limit: 1}}, "window 1/0s"},
		{Policy{Quota: &Quota{Limit: 1}}, "quota=1"},
		{Policy{Quota: &Quota{Limit: 1, Reset: "0 0 * * *", TZ: "Nowhere/Land"}}, `"Nowhere/Land"`},
		{Policy{Quota: &Quota{Limit: 0, Reset: "0 0 * * *"}}, "quota 0"},
		{Policy{Concurrency: &Concurrency{Limit: 1, Lease: time.Millisecond}}, "lease 1ms"},
		{Policy{Concurrency: &Concurrency{Limit: 0}}, "concurrency 0"},
		{Policy{Overflow: "later"}, "overflow=later"},
		{Policy{MaxWait: time.Second}, "max_wait=1s"},
		{Policy{Backlog: -1}, "backlog=-1"},
	} {
		require.ErrorContains(t, c.p.Validate(), c.want)
	}
	require.NoError(t, (&Policy{Rates: []Rate{{Limit: 1, Period: time.Second}}}).Validate(), "burst 0 means 1")
}

// TestPolicyRangeEdges: the largest spans and counts the engine computes
// exactly are accepted, one more is not.
func TestPolicyRangeEdges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ ok, bad string }{
		{"rate=1/s burst=4503599627", "rate=1/s burst=4503599628"},
		{"rate=3/s burst=13510798882", "rate=3/s burst=13510798883"},
		{"rate=1000000/s burst=4503599627370496", "rate=1000000/s burst=4503599627370497"},
		{"rate=1/day burst=52124", "rate=1/day burst=52125"},
		{"rate=1/1250999h", "rate=1/1251000h"},
		{"window=5/1250999h", "window=5/1251000h"},
		{"concurrency=9007199254740992 lease=1250999h", "concurrency=9007199254740992 lease=1251000h"},
		{"quota=9007199254740992/month", "quota=9007199254740993/month"},
	} {
		_, err := ParsePolicy(c.ok)
		require.NoError(t, err, c.ok)
		_, err = ParsePolicy(c.bad)
		require.Error(t, err, c.bad)
	}
	require.Equal(t, time.Duration(1<<52)*time.Microsecond, MaxSpan)
}

func TestRate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rate     Rate
		text     string
		interval time.Duration
	}{
		{PerSecond(100), "100/s", 10 * time.Millisecond},
		{PerMinute(30), "30/min", 2 * time.Second},
		{PerHour(7200), "7200/h", 500 * time.Millisecond},
		{Rate{Limit: 100, Period: time.Second, Burst: 10}, "100/s burst 10", 10 * time.Millisecond},
		{Rate{Limit: 3, Period: 10 * time.Second, Burst: 2}, "3/10s burst 2", 3333333333},
		{Rate{Limit: 1, Period: 24 * time.Hour}, "1/day", 24 * time.Hour},
	} {
		require.Equal(t, c.text, c.rate.String())
		require.Equal(t, c.interval, c.rate.Interval(), c.text)
		back, err := ParseRate(c.text)
		require.NoError(t, err, c.text)
		want := c.rate
		if want.Burst == 0 {
			want.Burst = 1
		}
		require.Equal(t, want, back)
	}
	for text, want := range map[string]string{
		"":                "N/PERIOD",
		"100/s burst":     "burst B",
		"100/s bust 2":    "burst B",
		"0/s":             "at least 1",
		"100/s burst 0":   "at least 1",
		"100/s burst x":   "whole number",
		"100/eon":         "eon",
		"100/s burst 2 3": "burst B",
	} {
		_, err := ParseRate(text)
		require.ErrorContains(t, err, want, text)
	}
}

func TestTenantRule(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "acme", "a{b}", "ünï code", strings.Repeat("é", 128), "x@y", "**", "a\u00a0b", "😀", "a\u00a0\u00ffb"} {
		require.NoError(t, validateTenant(ok), ok)
	}
	for bad, want := range map[string]string{
		"":                       "empty",
		strings.Repeat("x", 257): "257 bytes",
		"*":                      `"*"`,
		"@global":                `"@global"`,
		"@x":                     `"@x"`,
		"\xff":                   "UTF-8",
		"a\nb":                   `tenant "a\nb" has a control character (U+000A) at byte 1`,
		"\tacme":                 "control character (U+0009) at byte 0",
		"a\x00":                  "control character (U+0000)",
		"a\x7f":                  "control character (U+007F)",
		"a\u0085":                "control character (U+0085)",
		"é\u009f":                "control character (U+009F) at byte 2",
		"\x1b[31mred":            "control character (U+001B)",
	} {
		err := validateTenant(bad)
		require.ErrorIs(t, err, ErrInvalidTenant, bad)
		require.ErrorContains(t, err, want)
	}
	require.NoError(t, validatePolicyName(DefaultPolicy))
	require.NoError(t, validatePolicyName(GlobalPolicy))
	require.ErrorContains(t, validatePolicyName("@Globals"), `"@Globals"`)
	require.NoError(t, validatePolicyName("@globals"), "a shared pool's name")
	require.ErrorContains(t, validatePolicyName("a\rb"), "control character")
}

func TestParsePolicyFile(t *testing.T) {
	t.Parallel()
	file := `# policies of the fleet
"*": "rate=10/s concurrency=2"
"@global":
  rate: 1000/s
acme:
  rate: [100/s burst 20, 5000/h]
  window: 600/min
  quota: 10000/day
  tz: America/Los_Angeles
  concurrency: 5
  lease: 30s
  overflow: wait
  max_wait: 500ms
  backlog: 50000
  shape: true
  fail_open: false
globex:
  rate: 50/min
  burst: 5
  quota: 100
  reset: "0 9 * * 1-5"
initech: "window=5/s"
"a{b} c": {concurrency: 1}
empty: ""
`
	got, err := ParsePolicyFile([]byte(file))
	require.NoError(t, err)
	want := map[string]string{
		"*":       "rate=10/s concurrency=2",
		"@global": "rate=1000/s",
		"acme":    "rate=100/s burst=20 rate=5000/h window=600/min quota=10000/day tz=America/Los_Angeles concurrency=5 lease=30s overflow=wait max_wait=500ms backlog=50000",
		"globex":  `rate=50/min burst=5 quota=100 reset="0 9 * * 1-5"`,
		"initech": "window=5/s",
		"a{b} c":  "concurrency=1",
		"empty":   "",
	}
	texts := map[string]string{}
	for name, p := range got {
		texts[name] = p.String()
	}
	require.Equal(t, want, texts)

	// formatPolicyFile writes what ParsePolicyFile reads back
	formatted := formatPolicyFile(got)
	back, err := ParsePolicyFile(formatted)
	require.NoError(t, err, string(formatted))
	require.Equal(t, got, back)
	require.Equal(t, formatted, formatPolicyFile(back))
	require.True(t, strings.HasPrefix(string(formatted), "'*': "), string(formatted))

	// anchors, aliases and merge keys share settings between entries
	got, err = ParsePolicyFile([]byte(`
defaults: &defaults
  rate: 10/s
  burst: 5
  concurrency: 2
acme:
  <<: *defaults
  concurrency: 5
globex:
  <<: *defaults
  rate: 20/s
initech: *defaults
hooli:
  <<: [*defaults, {window: 5/s, concurrency: 9}]
  quota: 100/day
nothing:
tilde: ~
`))
	require.NoError(t, err)
	texts = map[string]string{}
	for name, p := range got {
		texts[name] = p.String()
	}
	require.Equal(t, map[string]string{
		"defaults": "rate=10/s burst=5 concurrency=2",
		"acme":     "rate=10/s burst=5 concurrency=5",
		"globex":   "rate=20/s concurrency=2", // the burst went with the merged rate
		"initech":  "rate=10/s burst=5 concurrency=2",
		"hooli":    "rate=10/s burst=5 window=5/s quota=100/day concurrency=2",
		"nothing":  "",
		"tilde":    "",
	}, texts)

	// names YAML would read as something else survive a round trip
	odd := map[string]*Policy{}
	for _, name := range []string{"yes", "no", "on", "null", "~", "123", "1e3", "a: b", "#x", "- x", "'q'", `"dq"`, "ünï code", "[x]", "{y}", "&a", "!t", "%7B"} {
		odd[name] = mustPolicy(t, "rate=1/s")
	}
	back, err = ParsePolicyFile(formatPolicyFile(odd))
	require.NoError(t, err, string(formatPolicyFile(odd)))
	require.Equal(t, odd, back)

	for _, empty := range []string{"", "# nothing yet\n", "{}"} {
		got, err := ParsePolicyFile([]byte(empty))
		require.NoError(t, err, empty)
		require.Empty(t, got, empty)
	}
	require.Empty(t, formatPolicyFile(nil))
}

func TestParsePolicyFileErrors(t *testing.T) {
	t.Parallel()
	// the error names the line, the entry and what is wrong with it
	for _, c := range []struct {
		file string
		want []string
	}{
		{"acme: rate=1/s\nglobex: rate=0/s\n", []string{"line 2", `"globex"`, "rate=0/s"}},
		{"acme:\n  rate: 1/s\nglobex:\n  concurrency: 0\n", []string{"line 4", `"globex"`, "concurrency=0"}},
		{"acme:\n  rate: 1/s\n  colour: blue\n", []string{"line 3", `"acme"`, `"colour"`}},
		{"acme:\n  rate: 1/s\n  rate: 2/s\n", []string{"line 3", `"acme"`, `"rate"`, "twice"}},
		{"acme: rate=1/s\nacme: rate=2/s\n", []string{"line 2", `"acme"`, "twice"}},
		{"acme:\n  burst: 5\n", []string{"line 2", `"acme"`, "burst"}},
		{"acme:\n  rate: [1/s, 2/min]\n  burst: 5\n", []string{"line 3", `"acme"`, "burst"}},
		{"acme:\n  rate: [1/s burst]\n", []string{"line 2", `"acme"`, `"1/s burst"`}},
		{"acme:\n  rate: {n: 1}\n", []string{"line 2", `"acme"`, "rate"}},
		{"acme:\n  window: [1/s]\n", []string{"line 2", `"acme"`, "window"}},
		{"acme:\n  lease: 30s\n", []string{`"acme"`, "lease=30s"}},
		{"acme:\n  quota: 5/day\n  tz: Mars/Olympus\n", []string{"line 2", `"acme"`, "Mars/Olympus"}},
		{"acme:\n  rate: 1/s\n  concurrency: 2\n  lease: 10ms\n", []string{"line 4", `"acme"`, "lease=10ms"}},
		{"acme:\n  rate: 1/s\n  overflow: later\n", []string{"line 3", `"acme"`, "overflow=later"}},
		{"acme: [rate=1/s]\n", []string{"line 1", `"acme"`}},
		{"'*': rate=1/s\n'@Globals': rate=1/s\n", []string{"line 2", `"@Globals"`}},
		{"'': rate=1/s\n", []string{"line 1", "empty"}},
		{"- rate=1/s\n", []string{"line 1", "mapping"}},
		{"d: &d {rate: 1/s}\nacme:\n  <<: *d\n  colour: red\n", []string{"line 4", `"acme"`, `"colour"`}},
		{"d: &d {rate: 1/s, colour: red}\nacme:\n  <<: *d\n", []string{"line 1", `"d"`, `"colour"`}},
		{"acme:\n  <<: 5\n", []string{"line 2", `"acme"`, "<<"}},
		{"acme: [unclosed\n", []string{"YAML"}},
	} {
		got, err := ParsePolicyFile([]byte(c.file))
		require.Error(t, err, c.file)
		require.Nil(t, got)
		for _, w := range c.want {
			require.Contains(t, err.Error(), w, "file:\n%s", c.file)
		}
	}
}

// TestDuplicateRatesCollapse: a rate rule given twice is one rule (the
// engine would keep two identical meters): it is kept once, in text
// (TestPolicyCanonicalForm) and YAML alike.
func TestDuplicateRatesCollapse(t *testing.T) {
	t.Parallel()
	ps, err := ParsePolicyFile([]byte("acme:\n  rate: [1/s, 1/s]\n"))
	require.NoError(t, err)
	require.Equal(t, "rate=1/s", ps["acme"].String())
}

// formatPolicyFile writes policies as a YAML file that ParsePolicyFile
// should read back, one line per policy in its text form, sorted by name.
func formatPolicyFile(policies map[string]*Policy) []byte {
	names := slices.Sorted(maps.Keys(policies))
	var b bytes.Buffer
	for _, n := range names {
		key, _ := yaml.Marshal(n)
		val, _ := yaml.Marshal(policies[n].String())
		fmt.Fprintf(&b, "%s: %s", strings.TrimSpace(string(key)), val)
	}
	return b.Bytes()
}
