// Package cmdline holds what the worker and enqueue binaries share about
// their command lines: exit codes, usage errors, --help and --version.
package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"runtime"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// Exit codes: the contract scripts rely on.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// UsageError is a malformed command line: exit code 2 and the usage line.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// ErrVersion is what a flag parser returns for --version.
var ErrVersion = errors.New("version requested")

// Version is v when set at build time (-ldflags "-X main.version=v1.2.3"),
// else sluice's module version from the build info (buildinfo.Sluice).
func Version(v string) string {
	if v != "" {
		return v
	}
	return buildinfo.Sluice()
}

// Parsed answers a flag parser's error for the binary name: the help text,
// the version line, a usage error with the usage line, or any other error,
// and returns the exit code with done set. done is false when err is nil:
// the program goes on.
func Parsed(err error, name, version, usageLine string, help func() string, stdout, stderr io.Writer) (code int, done bool) {
	var ue *UsageError
	switch {
	case err == nil:
		return ExitOK, false
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, help())
		return ExitOK, true
	case errors.Is(err, ErrVersion):
		fmt.Fprintf(stdout, "%s %s %s %s/%s\n", name, Version(version), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return ExitOK, true
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %s\nusage: %s\nrun '%s --help' for the flags\n", name, ue.Msg, usageLine, name)
		return ExitUsage, true
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, err)
	return ExitFailure, true
}

// ListenCause is the cause of a failed net.Listen without the "listen tcp
// ADDR:" part of its net.OpError, which a message naming the flag already
// says: "address already in use".
func ListenCause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		var se interface{ Unwrap() error }
		if errors.As(op.Err, &se) && se.Unwrap() != nil {
			return se.Unwrap()
		}
		return op.Err
	}
	return err
}
