package readme_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// notRun are the README's commands this test does not run, and why.
var notRun = map[string]string{
	"go run ./examples/quickstart": "it takes about 25 s; examples/quickstart has its own test",
	"make test":                    "this test is part of make test",
	"go install github.com/sluicehq/sluice/cmd/...@latest": "it downloads the released module; the tour builds the same commands from this checkout",
}

// block is a fenced block of the README.
type block struct {
	line int // of the opening fence
	info string
	text []string
}

// command is one "$ " line of a sh block and the output lines after it.
type command struct {
	line   int
	text   string // without the comment
	codes  []int  // exit statuses allowed: 0, or those the comment names
	bg     bool   // ends with &: runs in the background for the rest of the README
	expect []string
}

func readBlocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var (
		out []block
		cur *block
	)
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		l := s.Text()
		if strings.HasPrefix(l, "```") {
			if cur == nil {
				cur = &block{line: n, info: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
			} else {
				out = append(out, *cur)
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.text = append(cur.text, l)
		}
	}
	require.NoError(t, s.Err())
	require.Nil(t, cur, "a fence of %s is not closed", path)
	return out
}

var exitRE = regexp.MustCompile(`exit status ([^)]*)`)

// commands reads the "$ " lines of a sh block with the output after each.
func commands(b block) []command {
	var out []command
	for i, l := range b.text {
		if text, ok := strings.CutPrefix(l, "$ "); ok {
			c := command{line: b.line + 1 + i, codes: []int{0}}
			comment := ""
			if k := strings.Index(text, " #"); k >= 0 {
				text, comment = text[:k], text[k+2:]
			}
			if m := exitRE.FindStringSubmatch(comment); m != nil {
				c.codes = nil
				for _, d := range regexp.MustCompile(`\d+`).FindAllString(m[1], -1) {
					n, _ := strconv.Atoi(d)
					c.codes = append(c.codes, n)
				}
			}
			text = strings.TrimSpace(text)
			if bg, ok := strings.CutSuffix(text, "&"); ok {
				c.bg, text = true, strings.TrimSpace(bg)
			}
			c.text = text
			out = append(out, c)
			continue
		}
		if len(out) > 0 && strings.TrimSpace(l) != "" {
			out[len(out)-1].expect = append(out[len(out)-1].expect, l)
		}
	}
	return out
}

// The parts of output that change from run to run, masked alike in what
// the README shows and what the commands print.
var masks = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`), "<uuid>"},
	{regexp.MustCompile(`\bline-[0-9a-f]{32}\b`), "<id>"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT[0-9:.]+Z`), "<time>"},
	{regexp.MustCompile(`\btime=\S+`), "time=<time>"},
	{regexp.MustCompile(`\(\d+/s\)`), "(<n>/s)"},
	{regexp.MustCompile(`\b(\d+h)?(\d+m)?\d+(\.\d+)?(ns|µs|ms|s)\b|\b\d+h(\d+m)?\b|\b\d+m\b`), "<dur>"},
}

var digits = regexp.MustCompile(`\d+`)

// normalize folds white space (tables' columns depend on their contents)
// and masks what changes; with volatile it masks every number too (the
// figures of live views).
func normalize(s string, volatile bool) string {
	s = strings.Join(strings.Fields(s), " ")
	for _, m := range masks {
		s = m.re.ReplaceAllString(s, m.with)
	}
	if volatile {
		s = digits.ReplaceAllString(s, "#")
	}
	return s
}

// volatile commands show live figures; they are read-only, so they are
// run again until their output matches (the worker catches up).
func volatile(cmd string) bool {
	for _, p := range []string{"./bin/sluice top", "./bin/sluice stats", "./bin/sluice admit", "curl "} {
		if strings.HasPrefix(cmd, p) {
			return true
		}
	}
	return strings.HasPrefix(cmd, "./bin/sluice jobs") && !strings.HasPrefix(cmd, "./bin/sluice jobs run") && !strings.HasPrefix(cmd, "./bin/sluice jobs delete")
}

// expectRE turns an expected line into a pattern: "…" stands for any text.
func expectRE(line string, vol bool) *regexp.Regexp {
	parts := strings.Split(normalize(line, vol), "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

// mismatch returns "" when the expected lines appear in out, in order,
// each matching a line of its own; otherwise what is missing.
func mismatch(expect []string, out string, vol bool) string {
	lines := strings.Split(out, "\n")
	next := 0
	for _, e := range expect {
		re := expectRE(e, vol)
		found := false
		for next < len(lines) && !found {
			found = re.MatchString(normalize(lines[next], vol))
			next++
		}
		if !found {
			return fmt.Sprintf("no line like %q (as %q) after the lines matched before", e, re)
		}
	}
	return ""
}

// copyTree copies the module at src to dst, as a fresh clone would have
// it (no build output, no VCS data, no benchmark module).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			switch rel {
			case ".git", "bin", "tmp", "bench", filepath.Join("docs", "img"):
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	require.NoError(t, err)
}

// repoRoot is the repository's root directory, two above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return root
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// TestREADME runs the commands of the README's sh blocks, in order, in a
// copy of the module in a fresh temporary directory, against a private
// Redis, and compares what they print with the output the README shows
// after them. A command ending in & runs in the background until the end;
// a command must exit 0 unless its comment says "exit status N". Two
// addresses are the test's own: the README's Redis (127.0.0.1:6379, given
// through SLUICE_REDIS_URL) and the worker's admin endpoint
// (127.0.0.1:9464, through SLUICE_WORKER_ADMIN).
func TestREADME(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	blocks := readBlocks(t, filepath.Join(root, "README.md"))

	var cmds []command
	for _, b := range blocks {
		switch b.info {
		case "sh":
			cmds = append(cmds, commands(b)...)
		case "yaml":
			_, err := throttle.ParsePolicyFile([]byte(strings.Join(b.text, "\n")))
			require.NoError(t, err, "README line %d: the YAML example is not a valid policy file", b.line)
		default:
			for i, l := range b.text {
				require.False(t, strings.HasPrefix(l, "$ "), "README line %d: a block with commands is tagged sh, so that this test runs them", b.line+1+i)
			}
		}
	}
	require.GreaterOrEqual(t, len(cmds), 10, "the README's commands")

	srv := redistest.NewServer(t, nil)
	port, err := redistest.FreePort()
	require.NoError(t, err)
	admin := "127.0.0.1:" + strconv.Itoa(port)
	subst := strings.NewReplacer("127.0.0.1:6379", srv.Addr(), "127.0.0.1:9464", admin)

	dir := t.TempDir()
	copyTree(t, root, dir)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TMPDIR=" + os.TempDir(),
		"SLUICE_REDIS_URL=" + srv.URL(), "SLUICE_WORKER_ADMIN=" + admin,
		"GOCACHE=" + goEnv(t, "GOCACHE"), "GOMODCACHE=" + goEnv(t, "GOMODCACHE"), "GOPATH=" + goEnv(t, "GOPATH"),
		// offline, with the module cache and build cache of this test
		"GOFLAGS=-mod=readonly", "GOPROXY=off", "GOTOOLCHAIN=local",
	}

	type background struct {
		c    command
		cmd  *exec.Cmd
		out  *clitest.SyncBuffer
		done chan error
	}
	var bgs []*background
	defer func() {
		for _, b := range bgs {
			select {
			case <-b.done:
			default:
				_ = b.cmd.Process.Kill()
				<-b.done
			}
			if t.Failed() {
				t.Logf("output of %q (README line %d):\n%s", b.c.text, b.c.line, b.out)
			}
		}
	}()

	for _, c := range cmds {
		if why, skip := notRun[c.text]; skip {
			t.Logf("README line %d: not run: %s: %s", c.line, c.text, why)
			continue
		}
		if c.text == "curl" || strings.HasPrefix(c.text, "curl ") {
			if _, err := exec.LookPath("curl"); err != nil {
				t.Logf("README line %d: not run: curl is not installed", c.line)
				continue
			}
		}
		text := subst.Replace(c.text)
		expect := make([]string, len(c.expect))
		for i, e := range c.expect {
			expect[i] = subst.Replace(e)
		}
		vol := volatile(c.text)
		if c.bg {
			b := &background{c: c, out: &clitest.SyncBuffer{}, done: make(chan error, 1)}
			b.cmd = exec.Command("sh", "-c", "exec "+text)
			b.cmd.Dir, b.cmd.Env, b.cmd.Stdout, b.cmd.Stderr = dir, env, b.out, b.out
			b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			require.NoError(t, b.cmd.Start(), "README line %d: %s", c.line, c.text)
			go func() { b.done <- b.cmd.Wait() }()
			bgs = append(bgs, b)
			waitUntil(t, 30*time.Second, func() string {
				select {
				case err := <-b.done:
					b.done <- err
					return fmt.Sprintf("it exited: %v", err)
				default:
				}
				return mismatch(expect, b.out.String(), vol)
			}, "README line %d: %s", c.line, c.text)
			continue
		}
		run := func() string {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "sh", "-c", text)
			cmd.Dir, cmd.Env = dir, env
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				return err.Error()
			}
			if !contains(c.codes, code) {
				return fmt.Sprintf("exit status %d, want %v; output:\n%s", code, c.codes, out)
			}
			if m := mismatch(expect, string(out), vol); m != "" {
				return m + "; output:\n" + string(out)
			}
			return ""
		}
		if vol {
			waitUntil(t, 30*time.Second, run, "README line %d: %s", c.line, c.text)
		} else if m := run(); m != "" {
			t.Fatalf("README line %d: %s: %s", c.line, c.text, m)
		}
	}

	// SIGTERM drains a worker, which exits 0.
	for _, b := range bgs {
		require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-b.done:
			b.done <- err
			require.NoError(t, err, "README line %d: %s after SIGTERM", b.c.line, b.c.text)
		case <-time.After(30 * time.Second):
			t.Fatalf("README line %d: %s did not exit within 30s of SIGTERM", b.c.line, b.c.text)
		}
	}
}

func contains(codes []int, code int) bool {
	for _, c := range codes {
		if c == code {
			return true
		}
	}
	return false
}

// waitUntil calls check until it returns "" or the time is up, then fails
// with its last answer.
func waitUntil(t *testing.T, timeout time.Duration, check func() string, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := check()
		if m == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", fmt.Sprintf(format, args...), m)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
