package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The CPU the run's processes and the machine used, read from Linux's
// /proc (zero elsewhere): cumulative seconds, sampled with the queue.

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times (100 on
// every architecture Go supports).
const clockTicks = 100

// procCPU is the user+system CPU seconds process pid has used.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields that follow it are counted from its closing one.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime %q %q", pid, f[11], f[12])
	}
	return (utime + stime) / clockTicks, nil
}

// machineCPU is the CPU seconds all cores have spent busy (anything but
// idle and iowait) and in all, since boot.
func machineCPU() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q: %w", v, err)
		}
		total += n
		// idle and iowait are the fourth and fifth numbers
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy / clockTicks, total / clockTicks, nil
}

// cpuUse is how many cores each part used on average over an interval.
type cpuUse struct {
	from, to time.Duration
	machine  float64 // every process of the machine
	workers  float64 // the set-up's worker processes
	redis    float64 // its redis-server
	bench    float64 // this program: producer, downstream, sampler
	cores    int
}

// useBetween is the CPU used between the samples nearest to from and to;
// zero when fewer than two samples fall in between.
func useBetween(samples []sample, from, to time.Duration, cores int) cpuUse {
	var a, b *sample
	for i := range samples {
		s := &samples[i]
		if s.At >= from && a == nil {
			a = s
		}
		if s.At <= to {
			b = s
		}
	}
	if a == nil || b == nil || b.At <= a.At {
		return cpuUse{cores: cores}
	}
	d := (b.At - a.At).Seconds()
	u := cpuUse{from: a.At, to: b.At, cores: cores,
		workers: (b.WorkersCPU - a.WorkersCPU) / d, redis: (b.RedisCPU - a.RedisCPU) / d, bench: (b.BenchCPU - a.BenchCPU) / d}
	if t := b.MachineTotal - a.MachineTotal; t > 0 {
		u.machine = (b.MachineBusy - a.MachineBusy) / t * float64(cores)
	}
	return u
}

// saturated reports whether the machine's cores were nearly all busy.
func (u cpuUse) saturated() bool { return u.cores > 0 && u.machine >= 0.9*float64(u.cores) }

func (u cpuUse) String() string {
	if u.to <= u.from {
		return "not sampled"
	}
	return fmt.Sprintf("machine %.2f of %d cores busy (workers %.2f, Redis %.2f, benchmark process %.2f)",
		u.machine, u.cores, u.workers, u.redis, u.bench)
}
