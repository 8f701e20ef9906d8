package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// root is the repository's root, from this module's directory.
const root = ".."

// binaries are sluice's three commands, built static (CGO_ENABLED=0) as
// for the image.
type binaries struct{ worker, enqueue, sluice string }

// TestDeploy builds the binaries once and checks every file of deploy/
// and docs/metrics.md against them and a running worker.
func TestDeploy(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+string(filepath.Separator), "./cmd/worker", "./cmd/enqueue", "./cmd/sluice")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	b := binaries{worker: filepath.Join(dir, "worker"), enqueue: filepath.Join(dir, "enqueue"), sluice: filepath.Join(dir, "sluice")}
	for name, fn := range map[string]func(*testing.T, binaries){
		"Metrics":       testMetrics,
		"Compose":       testCompose,
		"Kubernetes":    testKubernetes,
		"Containerfile": testContainerfile,
		"Rules":         testRulesWithPromtool,
		"GoInstall":     testGoInstallVersion,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// run runs bin with args and env to its end.
func run(t *testing.T, bin string, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return clitest.Run(t, bin, nil, env, args...)
}

// proc is a binary started by a test, stopped when the test ends.
type proc struct {
	cmd    *exec.Cmd
	stdout *clitest.SyncBuffer
	stderr *clitest.SyncBuffer
	done   chan struct{}
	err    error
}

func start(t *testing.T, bin string, env map[string]string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	p := &proc{stdout: &clitest.SyncBuffer{}, stderr: &clitest.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = clitest.Command(ctx, t, bin, nil, env, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// stop sends SIGTERM and returns the exit code and how long the process
// took to exit.
func (p *proc) stop(t *testing.T) (int, time.Duration) {
	t.Helper()
	begin := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not stop within a minute of SIGTERM; stderr: %s", p.cmd.Path, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(begin)
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpClient keeps no connection between requests: no goroutine outlives
// a test.
var httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get returns the status and body of url; status 0 when nothing answers.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// adminOf waits for a worker's log line "worker started" (JSON logs) and
// returns its admin address.
func adminOf(t *testing.T, p *proc) string {
	t.Helper()
	var admin string
	waitFor(t, "the worker to start", 30*time.Second, func() bool {
		select {
		case <-p.done:
			t.Fatalf("the worker ended: %v\n%s", p.err, p.stderr.String())
		default:
		}
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "worker started" {
				admin, _ = rec["admin"].(string)
				return true
			}
		}
		return false
	})
	require.True(t, strings.HasPrefix(admin, "http://"), "the worker's admin endpoints: %q", admin)
	return strings.TrimPrefix(admin, "http://")
}
