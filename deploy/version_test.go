package deploy

import (
	"archive/zip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// installVersion is the version the test publishes sluice at.
const installVersion = "v0.9.7"

// testGoInstallVersion publishes this checkout as sluice installVersion
// on a module proxy in a directory and installs its commands from there
// with go install …@installVersion, as a user does: each prints that
// version.
func testGoInstallVersion(t *testing.T, _ binaries) {
	dir := t.TempDir()
	proxy := filepath.Join(dir, "proxy", "github.com", "sluicehq", "sluice", "@v")
	require.NoError(t, os.MkdirAll(proxy, 0o755))
	writeModuleZip(t, filepath.Join(proxy, installVersion+".zip"))
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(proxy, installVersion+".mod"), mod, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(proxy, installVersion+".info"), []byte(`{"Version":"`+installVersion+`","Time":"`+time.Now().UTC().Format(time.RFC3339)+`"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(proxy, "list"), []byte(installVersion+"\n"), 0o644))

	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	require.NoError(t, err)
	cached := "file://" + filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
	gobin := filepath.Join(dir, "bin")
	cmd := exec.Command("go", "install", "-trimpath", "github.com/sluicehq/sluice/cmd/...@"+installVersion)
	cmd.Dir = dir
	// sluice from the directory, its dependencies from the module cache this
	// machine has; a module cache of the test's own, so nothing of it stays
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOPROXY=file://"+filepath.Join(dir, "proxy")+","+cached,
		"GOSUMDB=off", "GOFLAGS=-modcacherw", "GOMODCACHE="+filepath.Join(dir, "modcache"), "GOWORK=off", "CGO_ENABLED=0")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "go install: %s", out)
	for _, bin := range []string{"sluice", "worker", "enqueue"} {
		args := []string{"--version"}
		if bin == "sluice" {
			args = []string{"version"}
		}
		code, stdout, stderr := run(t, filepath.Join(gobin, bin), nil, args...)
		require.Equal(t, 0, code, stderr)
		require.True(t, strings.HasPrefix(stdout, bin+" "+installVersion+" go"), "%s: %q", bin, stdout)
	}
}

// writeModuleZip writes the module zip of this checkout: its files as git
// sees them (tracked, or new and not ignored), but those of the modules
// nested in it, under github.com/sluicehq/sluice@installVersion/.
func writeModuleZip(t *testing.T, path string) {
	t.Helper()
	ls := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	out, err := ls.Output()
	require.NoError(t, err)
	var nested []string
	files := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, f := range files {
		if filepath.Base(f) == "go.mod" && f != "go.mod" {
			nested = append(nested, filepath.Dir(f)+"/")
		}
	}
	zf, err := os.Create(path)
	require.NoError(t, err)
	zw := zip.NewWriter(zf)
	prefix := "github.com/sluicehq/sluice@" + installVersion + "/"
next:
	for _, f := range files {
		for _, n := range nested {
			if strings.HasPrefix(f, n) {
				continue next
			}
		}
		data, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		require.NoError(t, err)
		w, err := zw.Create(prefix + f)
		require.NoError(t, err)
		_, err = w.Write(data)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	require.NoError(t, zf.Close())
}
