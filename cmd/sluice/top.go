package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/throttle"
)

func top(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 0, ""); err != nil {
		return err
	}
	if o.limit < 0 {
		return usagef(c, "--limit %d: must be 0 (as many as fit) or more", o.limit)
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()
	interval := time.Duration(o.interval)
	outFd, outTTY := terminal(a.stdout)
	if o.once || !outTTY {
		return topOnce(a.ctx, cn, a.stdout, interval, o.limit)
	}

	keys := make(chan byte, 8)
	if inFd, inTTY := terminal(a.stdin); inTTY {
		old, err := term.MakeRaw(inFd)
		if err != nil {
			return fmt.Errorf("top: cannot read keys from the terminal: %w", err)
		}
		defer func() { _ = term.Restore(inFd, old) }()
	}
	// The reader ends with the process: a read from a terminal cannot be
	// interrupted portably.
	go readKeys(a.stdin, keys)
	height := func() int {
		_, h, err := term.GetSize(outFd)
		if err != nil {
			return 24
		}
		return h
	}
	fmt.Fprint(a.stdout, "\x1b[?1049h\x1b[?25l") // alternate screen, hide cursor
	defer fmt.Fprint(a.stdout, "\x1b[?25h\x1b[?1049l")
	return topLoop(a.ctx, cn, a.stdout, keys, interval, o.limit, height)
}

// terminal reports whether f is a terminal, and its descriptor.
func terminal(f any) (int, bool) {
	file, ok := f.(*os.File)
	if !ok {
		return 0, false
	}
	fd := int(file.Fd())
	return fd, term.IsTerminal(fd)
}

func readKeys(r io.Reader, keys chan<- byte) {
	buf := make([]byte, 16)
	for {
		n, err := r.Read(buf)
		for _, b := range buf[:n] {
			keys <- b
		}
		if err != nil {
			close(keys)
			return
		}
	}
}

// topSample is one reading of every tenant.
type topSample map[string]*throttle.Stats

func (cn *conn) sample(ctx context.Context) (topSample, error) {
	names, err := cn.tenantNames(ctx)
	if err != nil {
		return nil, err
	}
	all, err := cn.collect(ctx, names)
	if err != nil {
		return nil, err
	}
	s := topSample{}
	for _, st := range all {
		s[st.Tenant] = st
	}
	return s, nil
}

// topRow is one tenant in the view.
type topRow struct {
	tenant    string
	perSec    float64
	limit     string // tightest rate, "-" without one
	inFlight  int64
	cap       int64 // -1 without a concurrency rule
	reserved  int64
	cooldown  time.Duration
	backlog   int64
	policy    string
	hasPolicy bool
}

// topRows compares two samples: starts per second come from the growth of
// Stats.Started over the Redis time between them.
func topRows(prev, cur topSample) []topRow {
	rows := make([]topRow, 0, len(cur))
	for name, s := range cur {
		r := topRow{tenant: name, limit: "-", cap: -1, reserved: s.Reservations, backlog: s.Backlog, policy: policyName(s)}
		started := s.Started
		elapsed := time.Duration(0)
		if p, ok := prev[name]; ok {
			elapsed = s.Now.Sub(p.Now)
			if s.Started >= p.Started {
				started = s.Started - p.Started
			}
		} else {
			for _, p := range prev {
				elapsed = s.Now.Sub(p.Now)
				break
			}
		}
		if elapsed > 0 {
			r.perSec = float64(started) / elapsed.Seconds()
		}
		best := -1.0
		for _, rt := range s.Rates {
			if v := float64(rt.Rate.Limit) / rt.Rate.Period.Seconds(); best < 0 || v < best {
				best, r.limit = v, limitText(rt.Rate)
			}
		}
		if cs := s.Concurrency; cs != nil {
			r.inFlight, r.cap = cs.InFlight, cs.Concurrency.Limit
		}
		if !s.CooldownUntil.IsZero() {
			r.cooldown = s.CooldownUntil.Sub(s.Now)
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		switch {
		case a.perSec != b.perSec:
			return a.perSec > b.perSec
		case a.inFlight != b.inFlight:
			return a.inFlight > b.inFlight
		case a.reserved != b.reserved:
			return a.reserved > b.reserved
		case a.backlog != b.backlog:
			return a.backlog > b.backlog
		case (a.cooldown > 0) != (b.cooldown > 0):
			return a.cooldown > 0
		}
		return a.tenant < b.tenant
	})
	return rows
}

// writeTop prints the table of rows, at most limit of them (0: all), with
// eol ending each line ("\r\n" on a raw terminal).
func writeTop(w io.Writer, rows []topRow, limit int, eol string) error {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tSTARTS/S\tLIMIT\tIN FLIGHT\tRESERVED\tCOOLDOWN\tBACKLOG\tPOLICY")
	for i, r := range rows {
		if limit > 0 && i >= limit {
			break
		}
		inFlight := "-"
		if r.cap >= 0 {
			inFlight = fmt.Sprintf("%d/%d", r.inFlight, r.cap)
		}
		cool := "-"
		if r.cooldown > 0 {
			cool = short(r.cooldown)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t%d\t%s\t%d\t%s\n", human.Text(r.tenant), r.perSec, r.limit, inFlight, r.reserved, cool, r.backlog, r.policy)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		fmt.Fprintf(w, "%s%s", strings.TrimRight(l, " "), eol)
	}
	if limit > 0 && len(rows) > limit {
		fmt.Fprintf(w, "... and %d more tenants%s", len(rows)-limit, eol)
	}
	return nil
}

// topOnce measures over one interval and prints one table.
func topOnce(ctx context.Context, cn *conn, w io.Writer, interval time.Duration, limit int) error {
	prev, err := cn.sample(ctx)
	if err != nil {
		return err
	}
	timer := time.NewTimer(interval) // the measuring period, not a wait for a condition
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
	}
	cur, err := cn.sample(ctx)
	if err != nil {
		return err
	}
	rows := topRows(prev, cur)
	if len(rows) == 0 {
		fmt.Fprintln(w, "no tenant has a policy or throttle state yet")
		return nil
	}
	return writeTop(w, rows, limit, "\n")
}

// topLoop redraws the view every interval until q, Ctrl-C or Ctrl-D is
// typed, keys closes, or ctx ends.
func topLoop(ctx context.Context, cn *conn, w io.Writer, keys <-chan byte, interval time.Duration, limit int, height func() int) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	prev, prevErr := cn.sample(ctx)
	draw := func(cur topSample, err error) {
		var b strings.Builder
		b.WriteString("\x1b[H")
		header := fmt.Sprintf("sluice top  %s  prefix %s  every %s  (q quits)", cn.url.String(), cn.prefix, interval)
		b.WriteString(header + "\x1b[K\r\n")
		switch {
		case err != nil:
			b.WriteString("error: " + err.Error() + "\x1b[K\r\n")
		case cur == nil:
			b.WriteString("measuring...\x1b[K\r\n")
		default:
			rows := topRows(prev, cur)
			n := limit
			if n == 0 {
				n = max(height()-4, 1)
			}
			var t strings.Builder
			_ = writeTop(&t, rows, n, "\x1b[K\r\n")
			b.WriteString(time.Now().Format("15:04:05") + fmt.Sprintf("  %d tenants", len(rows)) + "\x1b[K\r\n")
			b.WriteString(t.String())
		}
		b.WriteString("\x1b[J")
		_, _ = io.WriteString(w, b.String())
	}
	draw(nil, prevErr)
	for {
		select {
		case <-ctx.Done():
			return nil
		case k, ok := <-keys:
			if !ok || k == 'q' || k == 'Q' || k == 3 || k == 4 {
				return nil
			}
		case <-tick.C:
			cur, err := cn.sample(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if prev == nil || err != nil {
				draw(nil, err)
			} else {
				draw(cur, nil)
			}
			if err == nil {
				prev = cur
			}
		}
	}
}
