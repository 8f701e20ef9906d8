package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/sluicehq/sluice/internal/human"
)

// progress shows how far a long enqueue has come, on stderr.
type progress interface {
	// add reports the totals so far.
	add(done, failed int)
	// note prints a line (an item's error) without garbling the display.
	note(msg string)
	// finish removes or ends the display.
	finish()
}

// plainInterval is how often plain progress lines are printed when stderr
// is not a terminal.
var plainInterval = 2 * time.Second

// isTerminal reports whether w is a terminal.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress picks the display: a bar on a terminal, plain lines every
// plainInterval otherwise, nothing but the notes with --quiet. total is -1
// when unknown.
func (e *enqueuer) progress(total int64) progress {
	switch {
	case e.o.quiet:
		return &plain{w: e.stderr, quiet: true}
	case isTerminal(e.stderr):
		return newBar(e.stderr, total)
	}
	return &plain{w: e.stderr, total: total, start: time.Now(), last: time.Now()}
}

// plain prints a line every plainInterval.
type plain struct {
	w           io.Writer
	quiet       bool
	total       int64
	start, last time.Time
}

func (p *plain) add(done, failed int) {
	if p.quiet || time.Since(p.last) < plainInterval {
		return
	}
	p.last = time.Now()
	rate := float64(done) / time.Since(p.start).Seconds()
	if p.total < 0 {
		fmt.Fprintf(p.w, "enqueue: %s enqueued, %d failed (%.0f/s)\n", human.Count(done, "job", "jobs"), failed, rate)
		return
	}
	left := ""
	if rest := p.total - int64(done+failed); rest > 0 && rate > 0 {
		left = fmt.Sprintf(", about %s left", (time.Duration(float64(rest)/rate) * time.Second).Round(time.Second))
	}
	fmt.Fprintf(p.w, "enqueue: %d of %s enqueued, %d failed (%.0f/s%s)\n", done, human.Count(p.total, "job", "jobs"), failed, rate, left)
}

func (p *plain) note(msg string) { fmt.Fprintln(p.w, msg) }
func (p *plain) finish()         {}

// bar is a progress bar with the count, the rate and the time left.
type bar struct {
	mu   sync.Mutex
	w    io.Writer
	b    *progressbar.ProgressBar
	seen int
}

func newBar(w io.Writer, total int64) *bar {
	return &bar{w: w, b: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("enqueue"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("jobs"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		// No spinner goroutine for unknown totals: the bar moves with add.
		progressbar.OptionSetSpinnerChangeInterval(0),
	)}
}

func (b *bar) add(done, failed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := done + failed; n > b.seen {
		_ = b.b.Add(n - b.seen)
		b.seen = n
	}
}

func (b *bar) note(msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.b.Clear()
	fmt.Fprintln(b.w, msg)
}

func (b *bar) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.b.Exit()
	_ = b.b.Clear()
}
