package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProcAndMachineCPU(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc here")
	}
	c, err := procCPU(os.Getpid())
	require.NoError(t, err)
	require.GreaterOrEqual(t, c, 0.0)
	_, err = procCPU(-1)
	require.Error(t, err)
	busy, total, err := machineCPU()
	require.NoError(t, err)
	require.Positive(t, total)
	require.LessOrEqual(t, busy, total)
}

func TestUseBetween(t *testing.T) {
	t.Parallel()
	// 2 cores; over 10 s the machine is busy 18 of 20 core-seconds, the
	// workers 10, Redis 5 and this program 2.
	var ss []sample
	for i := 0; i <= 10; i++ {
		f := float64(i)
		ss = append(ss, sample{At: time.Duration(i) * time.Second, WorkersCPU: f, RedisCPU: 0.5 * f, BenchCPU: 0.2 * f,
			MachineBusy: 1.8 * f, MachineTotal: 2 * f})
	}
	u := useBetween(ss, 0, 10*time.Second, 2)
	require.InDelta(t, 1.8, u.machine, 1e-9)
	require.InDelta(t, 1.0, u.workers, 1e-9)
	require.InDelta(t, 0.5, u.redis, 1e-9)
	require.InDelta(t, 0.2, u.bench, 1e-9)
	require.True(t, u.saturated())
	require.Contains(t, u.String(), "machine 1.80 of 2 cores busy")
	u = useBetween(ss, 2500*time.Millisecond, 4*time.Second, 2)
	require.Equal(t, 3*time.Second, u.from)
	require.InDelta(t, 1.0, u.workers, 1e-9)
	require.Equal(t, "not sampled", useBetween(ss, 20*time.Second, 30*time.Second, 2).String())
	require.False(t, useBetween(nil, 0, time.Second, 2).saturated())
}
