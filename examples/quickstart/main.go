// Command quickstart shows sluice end to end on one machine, with nothing
// to install but Go: an embedded Redis, three workers sharing the limits of
// three tenants, a fake downstream API that enforces the same limits itself
// and answers 429 to any request over them, and a bursty producer. It shows
// a live per-tenant view, then a report, and exits 1 if any expectation
// failed (a 429, a lost job, a limit exceeded or badly under-used).
//
//	go run ./examples/quickstart           # about 30 s
//	go run ./examples/quickstart --short   # about 10 s
//	go run ./examples/quickstart --redis redis://127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/sluicehq/sluice/examples/internal/demo"
)

func main() {
	demo.Quiet()
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	short := fs.Bool("short", false, "a smaller workload (about 10 s instead of 30 s)")
	redisURL := fs.String("redis", "", "use this Redis instead of an embedded one (e.g. redis://127.0.0.1:6379)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "quickstart: unexpected argument %q\nusage: quickstart [--short] [--redis URL]\n", fs.Arg(0))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, options{
		redisURL:   *redisURL,
		short:      *short,
		out:        os.Stdout,
		live:       term.IsTerminal(int(os.Stdout.Fd())),
		plainEvery: 2 * time.Second,
		deadline:   55 * time.Second,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "quickstart: %v\n", err)
		os.Exit(1)
	}
	rep.print(os.Stdout)
	if !rep.ok() {
		os.Exit(1)
	}
}
