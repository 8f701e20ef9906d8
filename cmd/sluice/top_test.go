package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/clitest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

func TestTopRows(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	t1 := t0.Add(2 * time.Second)
	rate := func(text string) throttle.RateStats {
		r, err := throttle.ParseRate(text)
		require.NoError(t, err)
		return throttle.RateStats{Rate: r}
	}
	prev := topSample{
		"busy":  {Tenant: "busy", Now: t0, Started: 100},
		"reset": {Tenant: "reset", Now: t0, Started: 500},
		"idle":  {Tenant: "idle", Now: t0, Started: 7},
	}
	cur := topSample{
		"busy":  {Tenant: "busy", Policy: "busy", Now: t1, Started: 300, Rates: []throttle.RateStats{rate("5000/h"), rate("100/s burst 20")}},
		"reset": {Tenant: "reset", Policy: "*", Now: t1, Started: 10},
		"idle": {Tenant: "idle", Policy: "idle", Now: t1, Started: 7, Reservations: 4, Waiting: 9, CooldownUntil: t1.Add(1500 * time.Millisecond),
			Rules:       &throttle.Policy{Backlog: 100},
			Concurrency: &throttle.ConcurrencyStats{Concurrency: throttle.Concurrency{Limit: 5}, InFlight: 2},
			Refunded:    120, Extra: 30},
		"new": {Tenant: "new", Now: t1, Started: 4},
	}
	rows := topRows(prev, cur)
	require.Equal(t, []topRow{
		// 200 starts in 2s; the tightest rate is 5000/h (1.4/s), not 100/s.
		{tenant: "busy", perSec: 100, limit: "5000/h", cap: -1, waitingText: "0", policy: "busy"},
		// Started went back to 0 (the tenant was idle): count from 0.
		{tenant: "reset", perSec: 5, limit: "-", cap: -1, waitingText: "0", policy: "*"},
		// First seen in this sample: every start counted happened within the interval.
		{tenant: "new", perSec: 2, limit: "-", cap: -1, waitingText: "0", policy: "-"},
		{tenant: "idle", perSec: 0, limit: "-", inFlight: 2, cap: 5, reserved: 4, cooldown: 1500 * time.Millisecond, waiting: 9, waitingText: "9/100", policy: "idle",
			refunded: 120, extra: 30},
	}, rows)

	var b bytes.Buffer
	require.NoError(t, writeTop(&b, rows, 3, "\n"))
	require.Equal(t, `TENANT  STARTS/S  LIMIT   IN FLIGHT  RESERVED  COOLDOWN  WAITING  POLICY
busy    100.0     5000/h  -          0         -         0        busy
reset   5.0       -       -          0         -         0        *
new     2.0       -       -          0         -         0        -
... and 1 more tenant
`, b.String(), "no row shown has settled costs: no SETTLED column")

	// Settled costs: refunded/charged extra, blank for tenants without.
	rows[1].refunded = 7
	b.Reset()
	require.NoError(t, writeTop(&b, rows, 0, "\n"))
	require.Equal(t, `TENANT  STARTS/S  LIMIT   IN FLIGHT  RESERVED  COOLDOWN  WAITING  POLICY  SETTLED
busy    100.0     5000/h  -          0         -         0        busy
reset   5.0       -       -          0         -         0        *       -7/+0
new     2.0       -       -          0         -         0        -
idle    0.0       -       2/5        4         1.5s      9/100    idle    -120/+30
`, b.String())
	d := topDocOf(cur, rows, 2*time.Second, 0, nil)
	require.Equal(t, [2]int64{120, 30}, [2]int64{d.Tenants[3].Refunded, d.Tenants[3].Extra})
	line, err := json.Marshal(d.Tenants[3])
	require.NoError(t, err)
	require.Contains(t, string(line), `"settled_refunded":120,"settled_extra":30`)
	line, err = json.Marshal(d.Tenants[0])
	require.NoError(t, err)
	require.NotContains(t, string(line), "settled", "absent while 0")
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTopLoopQuitsOnKeys(t *testing.T) {
	t.Parallel()
	for _, key := range []byte{'q', 'Q', 3, 4} {
		a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: redistest.URL(t), prefix: redistest.Prefix(t)}
		cn, err := a.connect(nil)
		require.NoError(t, err)
		_, err = cn.limiter.Cooldown(context.Background(), "paused", time.Minute)
		require.NoError(t, err)

		out := &clitest.SyncBuffer{}
		keys := make(chan byte, 1)
		done := make(chan error, 1)
		go func() {
			done <- topLoop(context.Background(), cn, out, keys, 20*time.Millisecond, 0, func() (int, int) { return 200, 10 })
		}()
		waitFor(t, "a frame with the tenant", func() bool { return strings.Contains(out.String(), "\r\npaused ") })
		keys <- key
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("top did not quit on key %q", key)
		}
		frame := out.String()
		require.Contains(t, frame, "sluice top  "+redistest.URL(t)+"  prefix "+a.prefix+"  every 20ms  (q quits)\x1b[K\r\n")
		require.Contains(t, frame, "TENANT  STARTS/S  LIMIT  IN FLIGHT  RESERVED  COOLDOWN  WAITING  POLICY\x1b[K\r\n")
		cn.Close()
	}
}

func TestTopLoopEndsWithInputOrContext(t *testing.T) {
	t.Parallel()
	a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: redistest.URL(t), prefix: redistest.Prefix(t)}
	cn, err := a.connect(nil)
	require.NoError(t, err)
	defer cn.Close()

	keys := make(chan byte)
	close(keys) // standard input at its end
	require.NoError(t, topLoop(context.Background(), cn, &clitest.SyncBuffer{}, keys, time.Hour, 0, func() (int, int) { return 200, 10 }))

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Ctrl-C delivered as a signal
	require.NoError(t, topLoop(ctx, cn, &clitest.SyncBuffer{}, make(chan byte), time.Hour, 0, func() (int, int) { return 200, 10 }))
}

func TestRunInProcess(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	env := func(k string) string {
		if k == "SLUICE_REDIS_URL" {
			return redistest.URL(t)
		}
		return ""
	}
	prefix := redistest.Prefix(t)
	code := run(context.Background(), []string{"--prefix", prefix, "policy", "set", "acme", "rate=3/s"}, nil, &stdout, &stderr, env)
	require.Equal(t, 0, code, stderr.String())
	require.Equal(t, "set policy acme: rate=3/s\n", stdout.String())

	stdout.Reset()
	code = run(context.Background(), []string{"policy", "get", "acme", "--prefix", prefix}, nil, &stdout, &stderr, env)
	require.Equal(t, 0, code, stderr.String())
	require.Equal(t, "rate=3/s\n", stdout.String())

	// A cancelled context (Ctrl-C) while waiting: exit 1, one line.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stdout.Reset()
	stderr.Reset()
	code = run(ctx, []string{"--prefix", prefix, "top", "--once"}, nil, &stdout, &stderr, env)
	require.Equal(t, 1, code)
	require.Equal(t, "sluice: interrupted\n", stderr.String())
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args     []string
		wantPos  []string
		wantJSON bool
		wantErr  string
	}{
		{args: nil, wantPos: nil},
		{args: []string{"a", "--json", "b"}, wantPos: []string{"a", "b"}, wantJSON: true},
		{args: []string{"--json", "a"}, wantPos: []string{"a"}, wantJSON: true},
		{args: []string{"a", "--", "--json", "-x"}, wantPos: []string{"a", "--json", "-x"}},
		{args: []string{"a", "--nope"}, wantErr: "unknown flag --nope"},
		{args: []string{"a", "-nope"}, wantErr: "unknown flag --nope"},
	}
	for _, tt := range tests {
		fs := newFlagSet("t")
		var j bool
		fs.BoolVar(&j, "json", false, "")
		pos, err := parseArgs(fs, tt.args)
		if tt.wantErr != "" {
			require.Error(t, err)
			require.Equal(t, tt.wantErr, flagError(err))
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tt.wantPos, pos, "%v", tt.args)
		require.Equal(t, tt.wantJSON, j, "%v", tt.args)
	}
	fs := newFlagSet("t")
	var s string
	fs.StringVar(&s, "f", "", "")
	_, err := parseArgs(fs, []string{"-f"})
	require.Equal(t, "flag --f needs a value", flagError(err))
	require.ErrorIs(t, func() error { _, err := parseArgs(newFlagSet("t"), []string{"--help"}); return err }(), flag.ErrHelp)
}

// TestTopShowsStaleFigures: when Redis stops answering, the live view says
// so within two intervals, with how long it has had no answer, and keeps
// the last figures under the marker; when Redis answers again the marker
// goes. The durations it prints are the real ones.
func TestTopShowsStaleFigures(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t, nil)
	a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: srv.URL(), prefix: redistest.Prefix(t)}
	cn, err := a.connect(nil)
	require.NoError(t, err)
	defer cn.Close()
	_, err = cn.limiter.Cooldown(context.Background(), "paused", time.Hour)
	require.NoError(t, err)

	out := &clitest.SyncBuffer{}
	keys := make(chan byte)
	done := make(chan error, 1)
	go func() {
		done <- topLoop(context.Background(), cn, out, keys, 50*time.Millisecond, 0, func() (int, int) { return 200, 10 })
	}()
	frame := func() string { // the last frame drawn
		s := out.String()
		return s[strings.LastIndex(s, "\x1b[H")+1:]
	}
	waitFor(t, "a frame with the tenant", func() bool { return strings.Contains(frame(), "\r\npaused ") })
	require.NotContains(t, frame(), "STALE")

	require.NoError(t, srv.Freeze())
	frozen := time.Now()
	staleRE := regexp.MustCompile(`STALE: no answer from Redis for (\S+); the figures below are from \d\d:\d\d:\d\d`)
	waitFor(t, "the stale marker", func() bool { return staleRE.MatchString(frame()) })
	require.Contains(t, frame(), "\r\npaused ", "the last figures stay")
	waitFor(t, "two seconds of stalling", func() bool { return time.Since(frozen) > 2*time.Second && staleRE.MatchString(frame()) })
	f := frame()
	shown, err := time.ParseDuration(staleRE.FindStringSubmatch(f)[1])
	require.NoError(t, err, f)
	require.InDelta(t, time.Since(frozen).Seconds(), shown.Seconds(), 0.7, "the time shown is the time elapsed: %s", f)

	require.NoError(t, srv.Thaw())
	waitFor(t, "fresh figures", func() bool { f := frame(); return !strings.Contains(f, "STALE") && strings.Contains(f, "\r\npaused ") })
	close(keys)
	require.NoError(t, <-done)
}

// TestUnreachableSaysHowLong: a Redis that accepts connections but does
// not answer is reported after the time the message states.
func TestUnreachableSaysHowLong(t *testing.T) {
	t.Parallel()
	srv := redistest.NewServer(t, nil)
	require.NoError(t, srv.Freeze())
	defer func() { require.NoError(t, srv.Thaw()) }()
	var stdout, stderr bytes.Buffer
	env := func(k string) string {
		if k == "SLUICE_REDIS_URL" {
			return srv.URL()
		}
		return ""
	}
	start := time.Now()
	code := run(context.Background(), []string{"policy", "list"}, nil, &stdout, &stderr, env)
	took := time.Since(start)
	require.Equal(t, 1, code)
	m := regexp.MustCompile(`no answer within (\S+);`).FindStringSubmatch(stderr.String())
	require.NotNil(t, m, stderr.String())
	said, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	require.InDelta(t, took.Seconds(), said.Seconds(), 0.5, "took %s, said %s", took, said)
	require.Less(t, took, 3*time.Second, "it gives up after about 2s")
}

// TestTopJSONStreams: top --json prints a JSON line each interval until
// interrupted.
func TestTopJSONStreams(t *testing.T) {
	t.Parallel()
	a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: redistest.URL(t), prefix: redistest.Prefix(t)}
	cn, err := a.connect(nil)
	require.NoError(t, err)
	defer cn.Close()
	_, err = cn.limiter.Cooldown(context.Background(), "paused", time.Hour)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	out := &clitest.SyncBuffer{}
	done := make(chan error, 1)
	go func() { done <- topJSON(ctx, cn, out, 20*time.Millisecond, 0) }()
	waitFor(t, "three lines", func() bool { return strings.Count(out.String(), "\n") >= 3 })
	cancel()
	require.NoError(t, <-done)
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var d topDoc
		require.NoError(t, json.Unmarshal([]byte(line), &d), line)
		require.False(t, d.Stale)
		require.Equal(t, 20.0, d.IntervalMS)
		require.Len(t, d.Tenants, 1)
		require.Equal(t, "paused", d.Tenants[0].Tenant)
		require.Greater(t, d.Tenants[0].CooldownMS, 0.0)
	}
}

// TestTopFitsTheTerminal: the live view cuts every line to the terminal's
// width (a cut line ends in …) and shows as many tenants as its height
// leaves room for.
func TestTopFitsTheTerminal(t *testing.T) {
	t.Parallel()
	a := &app{ctx: context.Background(), env: func(string) string { return "" }, redisFlag: redistest.URL(t), prefix: redistest.Prefix(t)}
	cn, err := a.connect(nil)
	require.NoError(t, err)
	defer cn.Close()
	for _, name := range []string{"a-tenant-with-a-rather-long-name", "b", "c", "d", "e", "f", "g"} {
		setPolicy(t, cn, name, "rate=100/s burst=20 window=600/min concurrency=5 weight=2")
	}
	const width, height = 40, 8
	out := &clitest.SyncBuffer{}
	keys := make(chan byte, 1)
	done := make(chan error, 1)
	go func() {
		done <- topLoop(context.Background(), cn, out, keys, 20*time.Millisecond, 0, func() (int, int) { return width, height })
	}()
	var frame string
	waitFor(t, "a frame with the tenants", func() bool {
		frames := strings.Split(out.String(), "\x1b[H")
		for _, f := range frames {
			if strings.Contains(f, "\r\nTENANT ") && strings.HasSuffix(f, "\x1b[J") {
				frame = f
			}
		}
		return frame != ""
	})
	keys <- 'q'
	require.NoError(t, <-done)

	lines := strings.Split(strings.TrimSuffix(frame, "\x1b[K\r\n\x1b[J"), "\x1b[K\r\n")
	require.Len(t, lines, height, "the header, the time, the column names and as many tenants as fit:\n%s", strings.Join(lines, "\n"))
	for _, l := range lines {
		require.LessOrEqual(t, utf8.RuneCountInString(l), width, "%q", l)
	}
	require.True(t, strings.HasPrefix(lines[0], "sluice top  "))
	require.True(t, strings.HasSuffix(lines[0], "…"), "the header is cut: %q", lines[0])
	require.Equal(t, "... and 3 more tenants", lines[height-1])
	for _, l := range lines[3 : height-1] {
		require.True(t, strings.HasSuffix(l, "…"), "the long name widens the first column, so every row is cut: %q", l)
	}
}
