package throttle

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/policylang"
)

// TestPolicyLanguageLists holds internal/policylang, which the help texts
// are checked against, to the parser: its options are the ones ParsePolicy
// reads, and each option it lists parses.
func TestPolicyLanguageLists(t *testing.T) {
	t.Parallel()
	require.Equal(t, knownOptions(), policylang.Options, "internal/policylang.Options must list the parser's options, in text form order (then add the new one to sluice help)")

	// One valid use of each option, so that a listed option the parser
	// does not read fails here.
	uses := map[string]string{
		"rate": "rate=10/s", "burst": "rate=10/s burst=5", "window": "window=100/min",
		"quota": "quota=1000/day", "reset": `quota=5 reset="0 0 * * 1"`, "tz": "quota=1000/day tz=UTC",
		"concurrency": "concurrency=2", "lease": "concurrency=2 lease=10s",
		"overflow": "overflow=drop", "max_wait": "overflow=wait max_wait=200ms", "backlog": "backlog=10",
		"weight": "weight=3", "shape": "shape=true", "fail_open": "fail_open=true", "learn": "learn=false",
		"adapt": "rate=50/s adapt=10..200/s", "adapt_step": "rate=50/s adapt=10..200/s adapt_step=5",
		"adapt_every": "rate=50/s adapt=10..200/s adapt_every=2s", "adapt_latency": "rate=50/s adapt=10..200/s adapt_latency=500ms",
	}
	for _, o := range policylang.Options {
		text, ok := uses[o]
		require.True(t, ok, "a use of option %s", o)
		_, err := ParsePolicy(text)
		require.NoError(t, err, "option %s: %s", o, text)
	}
	_, err := ParsePolicy("nosuch=1")
	require.ErrorContains(t, err, "known: "+strings.Join(policylang.Options, " "))
}

// TestPolicyLanguageScopes holds internal/policylang.Scopes to the policy
// store's names: each form's example is a valid policy name of that form,
// and names of no form are refused.
func TestPolicyLanguageScopes(t *testing.T) {
	t.Parallel()
	form := func(name string) string {
		switch {
		case name == DefaultPolicy:
			return "*"
		case name == GlobalPolicy:
			return "@global"
		case strings.HasPrefix(name, ShadowPrefix):
			if of, _ := shadowOf(name); of == DefaultPolicy {
				return "@shadow:*"
			}
			return "@shadow:TENANT"
		case isPool(name):
			return "@NAME"
		}
		if tenant, key, ok := keyOf(name); ok {
			switch {
			case tenant == DefaultPolicy:
				return "*/*"
			case key == DefaultPolicy:
				return "TENANT/*"
			}
			return "TENANT/KEY"
		}
		return "TENANT"
	}
	seen := map[string]bool{}
	for _, s := range policylang.Scopes {
		require.NoError(t, validatePolicyName(s.Example), "%s (%s)", s.Example, s.Form)
		require.Equal(t, s.Form, form(s.Example), "the form of %s", s.Example)
		seen[s.Form] = true
	}
	require.Len(t, seen, len(policylang.Scopes), "each form once")
	for _, bad := range []string{"", "@", "@shadow:@global", "*/user-42", "acme/", "/x", "@Open AI"} {
		require.Error(t, validatePolicyName(bad), "%q is a name of no form", bad)
	}
}
