package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/policylang"
)

// helpOf runs sluice with args in the process and returns what it prints.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, nil, &stdout, &stderr, func(string) string { return "" })
	require.Equal(t, 0, code, stderr.String())
	return stdout.String()
}

// TestHelpCoversThePolicyLanguage: sluice help and the policy commands'
// help name every option the policy parser reads and every form of a
// policy's name (internal/policylang, which throttle's tests hold to the
// parser), and say that a job's cost must fit its burst.
func TestHelpCoversThePolicyLanguage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"help", "policy"}, {"help", "policy", "set"}, {"help", "policy", "apply"}, {"policy", "set", "--help"}} {
		text := helpOf(t, args...)
		for _, o := range policylang.Options {
			require.Regexp(t, `(^|[\s\[])`+regexp.QuoteMeta(o)+`=`, text, "sluice %s names option %s=", strings.Join(args, " "), o)
		}
		_, names, ok := strings.Cut(text, "\nPolicy names")
		require.True(t, ok, "sluice %s has a section on policy names", strings.Join(args, " "))
		for _, s := range policylang.Scopes {
			require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(s.Form)+`\s`, names, "sluice %s explains the policy name %s", strings.Join(args, " "), s.Form)
		}
		require.Contains(t, text, "must fit each of them")
		require.Contains(t, text, "Under rate=2/s (burst 1) a job of cost 3 is refused\nevery time; give that rate burst=3 or more")
	}
}
