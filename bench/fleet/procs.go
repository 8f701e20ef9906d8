package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// redisServer is the run's private redis-server: its own port, no
// persistence, stopped by its pid.
type redisServer struct {
	cmd    *exec.Cmd
	dir    string
	addr   string
	exited chan struct{}
}

// startRedis starts redis-server (REDIS_SERVER names another binary) on a
// free loopback port and waits until it answers.
func startRedis(ctx context.Context) (*redisServer, error) {
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("%s not found: install Redis 7 or newer (apt-get install redis-server) or set REDIS_SERVER", bin)
	}
	dir, err := os.MkdirTemp("", "fleetbench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s := &redisServer{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan struct{})}
		s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
			"--loglevel", "warning", "--logfile", "")
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		go func() { _ = s.cmd.Wait(); close(s.exited) }()
		if lastErr = s.waitReady(ctx); lastErr == nil {
			return s, nil
		}
		s.kill()
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (s *redisServer) waitReady(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("redis-server on %s exited at start", s.addr)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer PING within 10s: %w", s.addr, err)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// stop ends the server (SIGTERM, then SIGKILL after 5 s) and removes its
// directory.
func (s *redisServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		s.kill()
	}
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port != 6379 {
			return port, nil
		}
	}
}

// redisInfo reads one numeric field of INFO section.
func redisInfo(ctx context.Context, c *redis.Client, section, field string) (float64, error) {
	text, err := c.Info(ctx, section).Result()
	if err != nil {
		return 0, err
	}
	return infoField(text, field)
}

// infoField finds "field:value" in INFO's text.
func infoField(text, field string) (float64, error) {
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == field {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("INFO has no field %q", field)
}

// workerProc is one worker process of a set-up.
type workerProc struct {
	cmd    *exec.Cmd
	out    *bufio.Reader
	stderr *limitedWriter
	exited chan struct{}
	stats  workerStats
	err    error
}

// startWorker starts this executable as a worker process and waits until
// it says it is ready.
func startWorker(ctx context.Context, args []string) (*workerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to start workers: %w", err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), roleEnv+"=worker")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w := &workerProc{cmd: cmd, out: bufio.NewReader(stdout), stderr: &limitedWriter{n: 64 << 10}, exited: make(chan struct{})}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := w.out.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("worker said %q instead of ready", strings.TrimSpace(line))
		}
		ready <- err
		if err != nil {
			return
		}
		// The stats line comes at exit.
		rest, _ := io.ReadAll(w.out)
		if err := json.Unmarshal(rest, &w.stats); err != nil {
			w.err = fmt.Errorf("worker's stats %q: %w", strings.TrimSpace(string(rest)), err)
		}
		_ = cmd.Wait()
		close(w.exited)
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("worker did not start: %v; stderr: %s", err, w.stderr.String())
		}
		return w, nil
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	return nil, fmt.Errorf("worker not ready within 30s; stderr: %s", w.stderr.String())
}

// startWorkers starts n worker processes with args. On an error it returns
// those it started, for the caller to stop with the rest.
func startWorkers(ctx context.Context, args []string, n int) ([]*workerProc, error) {
	var procs []*workerProc
	for i := 0; i < n; i++ {
		p, err := startWorker(ctx, args)
		if err != nil {
			return procs, err
		}
		procs = append(procs, p)
	}
	return procs, nil
}

// waitServers waits until n asynq servers are registered as active in
// rdb's server registry (an asynq server registers itself, with its
// concurrency, when it starts; sluice's producer reads it).
func waitServers(ctx context.Context, rdb redis.UniversalClient, n int) error {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	deadline := time.Now().Add(30 * time.Second)
	for {
		servers, err := insp.Servers()
		active := 0
		for _, s := range servers {
			if s.Status == "active" {
				active++
			}
		}
		if err == nil && active >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d asynq servers registered within 30s (last error: %v)", active, n, err)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stop sends SIGTERM and waits for the worker to exit (SIGKILL after
// grace); it returns the worker's stats.
func (w *workerProc) stop(grace time.Duration) (workerStats, error) {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(grace):
		_ = w.cmd.Process.Kill()
		<-w.exited
		return w.stats, fmt.Errorf("worker %d did not exit within %s of SIGTERM: killed", w.cmd.Process.Pid, grace)
	}
	if w.err != nil {
		return w.stats, fmt.Errorf("%w; stderr: %s", w.err, w.stderr.String())
	}
	return w.stats, nil
}

// cpu is the worker's user+system CPU time, once it has exited.
func (w *workerProc) cpu() time.Duration {
	if w.cmd.ProcessState == nil {
		return 0
	}
	return w.cmd.ProcessState.UserTime() + w.cmd.ProcessState.SystemTime()
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	mu sync.Mutex
	b  strings.Builder
	n  int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// profileCPU writes this process's CPU profile to name in dir (made when
// missing) until the returned function is called.
func profileCPU(dir, name string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
