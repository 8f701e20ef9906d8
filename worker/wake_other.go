//go:build !linux

package worker

import (
	"runtime"
	"time"
)

// wakeAt waits until d has passed, yielding its processor meanwhile: the
// last moments of a wait, which the runtime's timers may overrun.
func wakeAt(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}
