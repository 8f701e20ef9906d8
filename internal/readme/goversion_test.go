package readme_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/version"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGoDirectiveIsTheLowest requires the go directive of each of the
// repository's modules (the library, the benchmark programs, the browser
// test) to be the lowest its dependencies allow, the highest of theirs,
// so that sluice asks its users for no newer Go than it must; and the
// README to name the library's.
func TestGoDirectiveIsTheLowest(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	var library string
	for _, dir := range []string{root, filepath.Join(root, "bench"), filepath.Join(root, "e2e")} {
		directive, needed, by := goVersions(t, dir)
		rel, _ := filepath.Rel(root, filepath.Join(dir, "go.mod"))
		require.Equal(t, needed, directive, "%s: go %s, but the highest go line of its dependencies is %s (%s): write go %s there (go mod edit -go=%s)", rel, directive, needed, by, needed, needed)
		if dir == root {
			library = directive
		}
	}
	readme := strings.Join(strings.Fields(readFile(t, filepath.Join(root, "README.md"))), " ")
	minor := version.Lang("go" + library)[len("go"):]
	for _, want := range []string{"Go " + minor + " or newer", "(`go " + library + "` in go.mod)"} {
		require.True(t, strings.Contains(readme, want), "the README names the Go version the module needs: %q", want)
	}
}

// goVersions reads the go directive of the module in dir and the highest
// go line among its dependencies, with the module that has it.
func goVersions(t *testing.T, dir string) (directive, needed, by string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-json=Path,GoVersion,Main,Replace", "all")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list -m all in %s: %s", dir, stderr.String())
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m struct {
			Path, GoVersion string
			Main            bool
			Replace         *struct{ Path string }
		}
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		switch {
		case m.Main:
			directive = m.GoVersion
		case m.Replace != nil && strings.HasPrefix(m.Replace.Path, "."):
			// the library itself, for the benchmark and browser modules:
			// its own directive is checked on its own
		case version.Compare("go"+m.GoVersion, "go"+needed) > 0:
			needed, by = m.GoVersion, m.Path
		}
	}
	require.NotEmpty(t, directive)
	return directive, needed, by
}
