package readme_test

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/policylang"
)

// TestDocsTeachThePolicyLanguage requires the README's policy table and
// docs/policies.md to name every option of a policy's text form and a name
// of every form a policy's name takes, as internal/policylang lists them
// (which throttle's tests hold to the parser).
func TestDocsTeachThePolicyLanguage(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, doc := range []string{"README.md", filepath.Join("docs", "policies.md")} {
		text := readFile(t, filepath.Join(root, doc))
		for _, o := range policylang.Options {
			require.True(t, regexp.MustCompile("`"+regexp.QuoteMeta(o)+"=").MatchString(text), "%s names option %s=", doc, o)
		}
		for _, s := range policylang.Scopes {
			require.True(t, regexp.MustCompile("`"+regexp.QuoteMeta(s.Example)+"`").MatchString(text), "%s shows a policy name of the form %s", doc, s.Form)
		}
	}
}
