package worker

import (
	"syscall"
	"time"
)

// wakeAt blocks its thread until d has passed, to within the kernel's own
// timer slack (tens of µs): nanosleep, where the runtime's timers wake up
// to a millisecond late in a process that has nothing else to do (the
// runtime waits for them in epoll_wait, whose timeout is in whole
// milliseconds). Only the last moments of a wait use it.
func wakeAt(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for ts.Sec > 0 || ts.Nsec > 0 {
		var left syscall.Timespec
		if err := syscall.Nanosleep(&ts, &left); err != syscall.EINTR {
			return
		}
		ts = left
	}
}
