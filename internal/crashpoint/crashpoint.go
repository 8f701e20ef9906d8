// Package crashpoint lets tests of crash recovery kill a sluice process at
// a chosen step, as a crash there would: when the environment variable
// SLUICE_CRASHPOINT names a point (NAME, or NAME@N for its Nth hit), the
// process sends itself SIGKILL on reaching it, with no clean-up. Without
// the variable, Hit costs a load and a compare.
package crashpoint

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Env is the environment variable that names the crash point.
const Env = "SLUICE_CRASHPOINT"

var (
	point string
	at    int64 = 1
	hits  atomic.Int64
)

func init() {
	v := os.Getenv(Env)
	if v == "" {
		return
	}
	name, n, ok := strings.Cut(v, "@")
	point = name
	if ok {
		if k, err := strconv.ParseInt(n, 10, 64); err == nil && k > 0 {
			at = k
		}
	}
}

// Hit kills the process when name is the crash point and this is its hit
// the variable asks for.
func Hit(name string) {
	if point == "" || name != point {
		return
	}
	if hits.Add(1) == at {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
