package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testRulesWithPromtool runs promtool (Debian's prometheus package; make
// deps installs it) on the rules, their unit tests and the compose file's
// Prometheus configuration.
func testRulesWithPromtool(t *testing.T, _ binaries) {
	promtool, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is needed: make deps installs it (Debian's prometheus package), or install Prometheus's promtool")
	for _, args := range [][]string{
		{"check", "rules", "prometheus/rules.yml"},
		{"test", "rules", "prometheus/rules_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s: %s", strings.Join(args, " "), out)
	}
	// the configuration, with its rule file where this checkout has it
	raw, err := os.ReadFile("prometheus/prometheus.yml")
	require.NoError(t, err)
	rules, err := filepath.Abs("prometheus/rules.yml")
	require.NoError(t, err)
	cfg := filepath.Join(t.TempDir(), "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(raw), "/etc/prometheus/rules.yml", rules, 1)), 0o644))
	out, err := exec.Command(promtool, "check", "config", cfg).CombinedOutput()
	require.NoError(t, err, "promtool check config: %s", out)
}
