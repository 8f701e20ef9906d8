// Package clitest runs the sluice binaries in tests the way a user's
// script does: a clean environment, the exit code and both outputs, golden
// files for output that is an interface.
package clitest

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// Command is bin with args, ready to start under ctx, with only PATH, a
// fresh HOME and env in its environment, and stdin when not nil.
func Command(ctx context.Context, tb testing.TB, bin string, stdin []byte, env map[string]string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tb.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return cmd
}

// Run runs Command to its end (a minute at most) and returns the exit code
// and what the binary wrote to stdout and stderr.
func Run(tb testing.TB, bin string, stdin []byte, env map[string]string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := Command(ctx, tb, bin, stdin, env, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		require.True(tb, errors.As(err, &ee), "run %s %v: %v", filepath.Base(bin), args, err)
		code = ee.ExitCode()
	}
	return code, out.String(), errOut.String()
}

// Golden compares got with testdata/NAME.golden, or rewrites that file
// when the test runs with -update.
func Golden(tb testing.TB, name, got string) {
	tb.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(tb, os.MkdirAll("testdata", 0o755))
		require.NoError(tb, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(tb, err, "run the test with -update to create it")
	require.Equal(tb, string(want), got)
}

// SyncBuffer is a bytes.Buffer that a running process writes while the
// test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
