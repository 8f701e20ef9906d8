package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// recordShadowStarts records n starts of jobs of tenant for its shadow, as
// the worker's gate does, and closes lim, which sends them.
func recordShadowStarts(t *testing.T, lim *throttle.Limiter, tenant string, n int) {
	t.Helper()
	path := jobpath.Of(lim).(jobpath.Engine[throttle.Request, throttle.Decision, *policies])
	for i := range n {
		path.Shadow(throttle.Request{Tenant: tenant, ID: fmt.Sprint("job-", i)}, time.Time{}, nil)()
	}
	require.NoError(t, lim.Close())
}

// testShadow: a shadow policy is set, shown, listed, applied from a file
// and deleted with --shadow beside the tenant's enforced policy; bad input
// is refused with the value and the fix, and changes nothing; stats shows
// what the shadow would have denied.
func testShadow(t *testing.T, c *cli) {
	c.mustRun(t, "policy", "set", "acme", "rate=100/s")
	require.Equal(t, "set policy @shadow:acme: rate=5/s\n"+
		"  a shadow: tried on acme's jobs as they start and counted, not enforced; see what it would deny with: sluice stats acme\n",
		c.mustRun(t, "policy", "set", "acme", "rate=5/s", "--shadow"))
	require.Equal(t, "set policy @shadow:acme: rate=5/s burst=2\n  was: rate=5/s\n"+
		"  a shadow: tried on acme's jobs as they start and counted, not enforced; see what it would deny with: sluice stats acme\n",
		c.mustRun(t, "policy", "set", "--shadow", "acme", "rate=5/s burst=2"))
	require.Equal(t, "rate=5/s burst=2\n", c.mustRun(t, "policy", "get", "acme", "--shadow"))
	require.Equal(t, "rate=100/s\n", c.mustRun(t, "policy", "get", "acme"), "the enforced policy stays")
	require.Equal(t, "{\n  \"name\": \"@shadow:acme\",\n  \"policy\": \"rate=5/s burst=2\",\n  \"shadow_of\": \"acme\"\n}\n",
		c.mustRun(t, "policy", "get", "acme", "--shadow", "--json"))
	// the full name works too
	require.Equal(t, "rate=5/s burst=2\n", c.mustRun(t, "policy", "get", "@shadow:acme"))

	require.Equal(t, "NAME          POLICY\n@shadow:acme  rate=5/s burst=2\nacme          rate=100/s\n", c.mustRun(t, "policy", "list"))
	require.Equal(t, "NAME          POLICY\n@shadow:acme  rate=5/s burst=2\n", c.mustRun(t, "policy", "list", "--shadow"))
	var list []listEntry
	require.NoError(t, json.Unmarshal([]byte(c.mustRun(t, "policy", "list", "--shadow", "--json")), &list))
	require.Equal(t, []listEntry{{Name: "@shadow:acme", Policy: "rate=5/s burst=2", ShadowOf: "acme"}}, list)

	// bad input: the value, the fix, and nothing changed
	before := c.policies(t)
	for _, tt := range []struct {
		args    []string
		wantMsg string
	}{
		{[]string{"policy", "set", "acme", "", "--shadow"}, "policy set acme --shadow: a shadow policy needs at least one rule (rate, window, quota or concurrency) to try, e.g. sluice policy set acme 'rate=5/s' --shadow; nothing was changed"},
		{[]string{"policy", "set", "acme", "overflow=drop", "--shadow"}, "policy set acme --shadow: a shadow policy needs at least one rule"},
		{[]string{"policy", "set", "acme", "rate=5/x", "--shadow"}, "policy set @shadow:acme: rate=5/x: "},
		{[]string{"policy", "set", "@global", "rate=5/s", "--shadow"}, "@global has no shadow policy: shadows are tried per tenant; give a tenant, or * for the tenants that follow the default policy"},
		{[]string{"policy", "set", "@shadow:@global", "rate=5/s"}, `invalid tenant: policy name "@shadow:@global": @global has no shadow (shadows are tried per tenant); try the limit as a tenant's shadow, or as the default's (@shadow:*)`},
		{[]string{"policy", "set", "@shadow:", "rate=5/s"}, `shadow policy "@shadow:": invalid tenant: the tenant is empty`},
		{[]string{"policy", "set", "@shadow:@x", "rate=5/s"}, `shadow policy "@shadow:@x": invalid tenant: tenant "@x" is a reserved name`},
		{[]string{"policy", "get", "@global", "--shadow"}, "@global has no shadow policy"},
		{[]string{"policy", "delete", "--invalid", "--shadow"}, "policy delete: give TENANT (with --shadow for its shadow) or --invalid, not both"},
	} {
		r := c.run(t, tt.args...)
		require.Equal(t, 2, r.code, "%q: %s", tt.args, r.stderr)
		require.Empty(t, r.stdout)
		require.True(t, strings.HasPrefix(r.stderr, "sluice: "+tt.wantMsg), "%q:\ngot  %q\nwant %q", tt.args, r.stderr, tt.wantMsg)
		require.Equal(t, before, c.policies(t), "%q changes nothing", tt.args)
	}
	// a file: all or nothing, a shadow without rules named with its line
	r := c.runWith(t, []byte("acme: rate=50/s\n\"@shadow:acme\": \"\"\n"), map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "policy", "apply", "-f", "-")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, `shadow policy "@shadow:acme" has no rules`)
	require.Contains(t, r.stderr, "nothing was changed")
	require.Equal(t, before, c.policies(t))
	r = c.runWith(t, []byte("acme: rate=100/s\n\"@shadow:acme\": {rate: 5/s}\n\"@shadow:*\": concurrency=2\n"), map[string]string{"SLUICE_REDIS_URL": c.url}, "--prefix", c.prefix, "policy", "apply", "-f", "-")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "updated    @shadow:acme  rate=5/s (was: rate=5/s burst=2)")
	require.Contains(t, r.stdout, "created    @shadow:*     concurrency=2")

	// a tenant that follows the default is tried under the default's shadow
	r = c.run(t, "policy", "get", "bob", "--shadow")
	require.Equal(t, result{code: 1, stderr: "sluice: no shadow policy for \"bob\" of its own; it follows the default policy *, whose shadow is tried on its jobs: concurrency=2; set one with: sluice policy set bob 'RULES' --shadow\n"}, r)
	c.mustRun(t, "policy", "delete", "*", "--shadow")
	r = c.run(t, "policy", "get", "bob", "--shadow")
	require.Equal(t, result{code: 1, stderr: "sluice: no shadow policy for \"bob\"; set one with: sluice policy set bob 'RULES' --shadow\n"}, r)

	// what it would have denied: 10 starts at once under rate=5/s
	recordShadowStarts(t, c.limiter(t), "acme", 10)
	stats := c.mustRun(t, "stats", "acme")
	require.Regexp(t, `(?m)^shadow +@shadow:acme: rate=5/s \(not enforced\) would have denied 9 of 10 \(90%\) starts in the last \S+; by rate\[0\] 9; each would have waited \S+ on average$`, stats)
	table := strings.Split(c.mustRun(t, "stats"), "\n")
	require.Regexp(t, `SHADOW WOULD DENY$`, table[0])
	require.Regexp(t, `^acme .* 9 of 10 \(90%\)$`, table[1])
	var doc statsDoc
	require.NoError(t, json.Unmarshal([]byte(c.mustRun(t, "stats", "acme", "--json")), &doc))
	sh := doc.Tenants[0].Shadow
	require.NotNil(t, sh)
	require.Equal(t, "@shadow:acme", sh.Name)
	require.Equal(t, int64(10), sh.Decisions)
	require.Equal(t, int64(9), sh.Denied)
	require.InDelta(t, 0.9, sh.DeniedShare, 1e-9)
	require.Equal(t, map[string]int64{"rate[0]": 9}, sh.DeniedBy)
	require.Positive(t, sh.RetryAfterMS)

	require.Equal(t, "deleted policy @shadow:acme (the shadow of acme; its enforced policy is unchanged)\n", c.mustRun(t, "policy", "delete", "acme", "--shadow"))
	require.Equal(t, "no policy @shadow:acme; nothing deleted\n", c.mustRun(t, "policy", "delete", "acme", "--shadow"))
	require.Equal(t, "rate=100/s\n", c.mustRun(t, "policy", "get", "acme"))
	require.NotContains(t, c.mustRun(t, "stats", "acme"), "shadow")
}

// TestTopShadow: top shows what a tenant's shadow would deny over the
// interval, in a column of its own only when a tenant shown has a shadow.
func TestTopShadow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	t1 := t0.Add(2 * time.Second)
	p, err := throttle.ParsePolicy("rate=5/s")
	require.NoError(t, err)
	shadow := func(decisions, denied int64) *throttle.ShadowStats {
		return &throttle.ShadowStats{Name: "@shadow:acme", Policy: p, Decisions: decisions, Denied: denied}
	}
	prev := topSample{
		"acme":   {Tenant: "acme", Now: t0, Started: 100, Shadow: shadow(100, 60)},
		"quiet":  {Tenant: "quiet", Now: t0, Started: 5, Shadow: shadow(5, 0)},
		"globex": {Tenant: "globex", Now: t0, Started: 10},
	}
	cur := topSample{
		"acme":   {Tenant: "acme", Policy: "acme", Now: t1, Started: 140, Shadow: shadow(140, 90)},
		"quiet":  {Tenant: "quiet", Policy: "quiet", Now: t1, Started: 5, Shadow: shadow(5, 0)},
		"globex": {Tenant: "globex", Policy: "globex", Now: t1, Started: 12},
	}
	rows := topRows(prev, cur)
	var b strings.Builder
	require.NoError(t, writeTop(&b, rows, 0, "\n"))
	// acme: 40 starts in 2 s, 30 of which the shadow would have denied
	require.Equal(t, `TENANT  STARTS/S  LIMIT  IN FLIGHT  RESERVED  COOLDOWN  WAITING  POLICY  SHADOW WOULD DENY
acme    20.0      -      -          0         -         0        acme    75% of 20.0/s
globex  1.0       -      -          0         -         0        globex  -
quiet   0.0       -      -          0         -         0        quiet   no starts
`, b.String())
	b.Reset()
	require.NoError(t, writeTop(&b, rows[1:2], 0, "\n"))
	require.NotContains(t, b.String(), "SHADOW", "no shadow shown, no column")
	doc := topDocOf(cur, rows, 2*time.Second, 0, nil)
	require.Equal(t, &topShadowJSON{Name: "@shadow:acme", Rules: "rate=5/s", DecisionsPerSec: 20, DeniedPerSec: 15, Decisions: 140, Denied: 90}, doc.Tenants[0].Shadow)
	require.Nil(t, doc.Tenants[1].Shadow)
}

// TestBoardShowsShadow: a tenant's shadow policy is on its dashboard row
// (what it would have denied, in all and over the last interval) and in
// its state.
func TestBoardShowsShadow(t *testing.T) {
	t.Parallel()
	e := newBoardEnv(t, boardConfig{readOnly: true})
	setPolicy(t, e.cn, "acme", "rate=100/s")
	setPolicy(t, e.cn, throttle.ShadowPrefix+"acme", "rate=5/s")
	_, row := e.row(t, "acme", "listed with its shadow", func(_ tenantsDoc, r rowJSON) bool { return r.Shadow != nil })
	require.Equal(t, "would have denied none yet", row.Shadow.Text)

	lim, err := throttle.NewLimiter(redistest.Client(t), &throttle.Config{Prefix: e.cn.prefix})
	require.NoError(t, err)
	recordShadowStarts(t, lim, "acme", 10)
	_, row = e.row(t, "acme", "the shadow's decisions", func(_ tenantsDoc, r rowJSON) bool { return r.Shadow.Decisions == 10 })
	require.Equal(t, "@shadow:acme", row.Shadow.Name)
	require.Equal(t, "rate=5/s", row.Shadow.Rules)
	require.Equal(t, int64(9), row.Shadow.Denied)
	require.Equal(t, map[string]int64{"rate[0]": 9}, row.Shadow.DeniedBy)
	require.Regexp(t, `^would have denied 9 of 10 \(90%\) starts in the last \S+$`, row.Shadow.Text, "the counts say their time range")
	require.NotNil(t, row.Shadow.Since)

	var detail tenantDoc
	require.Equal(t, http.StatusOK, e.get(t, "/api/tenants/acme", &detail))
	require.NotNil(t, detail.Stats.Shadow)
	require.Equal(t, int64(9), detail.Stats.Shadow.Denied)
}
