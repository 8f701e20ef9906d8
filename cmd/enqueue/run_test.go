package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// These tests call run in process, for what a child process makes hard to
// control: when the input arrives and when the interrupt comes.

func setupRun(t *testing.T) (*cli, func(string) string) {
	p := redistest.Prefix(t)
	c := &cli{url: redistest.URL(t), prefix: p, queue: strings.ReplaceAll(p, ":", ".")}
	return c, func(k string) string {
		if k == "SLUICE_REDIS_URL" {
			return c.url
		}
		return ""
	}
}

// piped is enqueue --file - running in process on a pipe the test writes
// ten lines to (the fourth one broken when broken is set), until the test
// cancels it.
type piped struct {
	cancel         context.CancelFunc
	code           chan int
	stdout, stderr clitest.SyncBuffer
}

func runPiped(t *testing.T, c *cli, env func(string) string, broken bool, flags ...string) *piped {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	p := &piped{cancel: cancel, code: make(chan int, 1)}
	args := append([]string{"--prefix", c.prefix, "--queue", c.queue, "--file", "-", "--tenant", "acme", "--type", "sleep"}, flags...)
	go func() { p.code <- run(ctx, args, pr, &p.stdout, &p.stderr, env) }()
	for i := 1; i <= 10; i++ {
		line := `{"payload":{"n":` + fmt.Sprint(i) + `}}`
		if broken && i == 4 {
			line = `{"payload":`
		}
		_, err := io.WriteString(pw, line+"\n")
		require.NoError(t, err)
	}
	return p
}

// interrupt cancels the run and returns its exit code.
func (p *piped) interrupt(t *testing.T) int {
	p.cancel()
	select {
	case got := <-p.code:
		return got
	case <-time.After(20 * time.Second):
		t.Fatal("enqueue did not stop within 20s of the interrupt")
		return 0
	}
}

// Ctrl-C while lines are still coming (--partial): enqueue stops and names
// exactly what it enqueued.
func TestInterruptFile(t *testing.T) {
	c, env := setupRun(t)
	p := runPiped(t, c, env, true, "--partial")
	deadline := time.Now().Add(20 * time.Second)
	for len(c.tasks(t)) < 9 {
		require.True(t, time.Now().Before(deadline), "9 jobs enqueued within 20s: %s", p.stderr.String())
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, exitFailure, p.interrupt(t))
	require.Equal(t, "interrupted after line 10 of standard input: enqueued 9 jobs, 1 failed; the lines after 10 were not enqueued; run the same file again to enqueue the rest (the jobs already enqueued are skipped)\n", p.stdout.String())
	require.Equal(t, "enqueue: line 4: not valid JSON: unexpected end of JSON input at byte 11\n", p.stderr.String())
	require.Len(t, c.tasks(t), 9)
}

// Ctrl-C before standard input ends: the file is not whole yet, so nothing
// is enqueued.
func TestInterruptWhileReadingFile(t *testing.T) {
	c, env := setupRun(t)
	p := runPiped(t, c, env, false)
	require.Equal(t, exitFailure, p.interrupt(t))
	require.Empty(t, p.stdout.String())
	require.Equal(t, "enqueue: interrupted while reading standard input: nothing was enqueued\n", p.stderr.String())
	require.Empty(t, c.tasks(t))
}

// Without a terminal, progress comes as plain lines on stderr.
func TestPlainProgress(t *testing.T) {
	c, env := setupRun(t)
	old := plainInterval
	plainInterval = time.Nanosecond
	defer func() { plainInterval = old }()
	var stdout, stderr clitest.SyncBuffer
	got := run(context.Background(), []string{"--prefix", c.prefix, "--queue", c.queue, "--tenant", "acme", "--type", "sleep", "--count", "600"}, nil, &stdout, &stderr, env)
	require.Equal(t, exitOK, got, stderr.String())
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	require.Len(t, lines, 3, "one line per batch of 256")
	for i, want := range []int{256, 512, 600} {
		require.Regexp(t, fmt.Sprintf(`^enqueue: %d of 600 jobs enqueued, 0 failed \(\d+/s(, about \d+s left)?\)$`, want), lines[i])
	}
	require.Regexp(t, `^enqueued 600 of 600 jobs for tenant acme in `, stdout.String())
}

// A file's total is counted first, for the time left.
func TestCountLines(t *testing.T) {
	require.EqualValues(t, -1, countLines(strings.NewReader("a\nb\n")), "not a file")
}
