package worker

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"slices"
	"sync"
	"syscall"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// Server is an asynq server whose every job passes sluice's gate first.
// Register handlers with Handle or HandleFunc, then Run (or Start and
// Shutdown).
type Server struct {
	cfg        Config
	lim        *throttle.Limiter
	ownLimiter bool
	gate       *Gate
	mux        *asynq.ServeMux
	srv        *asynq.Server
	failures   *failures
	patterns   []string // the handlers' patterns, for messages

	mu      sync.Mutex
	started bool
	closed  bool
}

// New returns a server over the caller's Redis client, which holds sluice's
// keys and, unless Config.AsynqRedis says otherwise, asynq's queues. The
// clients are not closed by Shutdown.
func New(client redis.UniversalClient, cfg *Config) (*Server, error) {
	if client == nil {
		return nil, errors.New("worker: New needs a Redis client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: c, lim: c.Limiter, mux: asynq.NewServeMux()}
	if s.lim == nil {
		lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: c.Prefix})
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		s.lim, s.ownLimiter = lim, true
	}
	ar := c.AsynqRedis
	if ar == nil {
		ar = client
	}
	gate, err := NewGate(s.lim, ar, &c.Gate)
	if err != nil {
		s.closeLimiter()
		return nil, err
	}
	s.gate = gate
	reg := c.Gate.Registerer
	if reg == nil {
		reg, _ = gate.gatherer.(prometheus.Registerer)
	}
	if gate.rec, err = newRecoverer(gate, s.lim, ar, c.RecoverLease, c.Admin, reg); err != nil {
		s.closeLimiter()
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	s.failures = newFailures(s.mux, s.handled, c.RetryUnknownTypes, c.Gate.Logger, gate.m, gate.giveBack)
	gate.setHooks(&c.Asynq)
	s.srv = asynq.NewServerFromRedisClient(ar, c.Asynq)
	return s, nil
}

// Handle registers the handler for tasks whose type matches pattern (see
// asynq.ServeMux).
func (s *Server) Handle(pattern string, h asynq.Handler) {
	s.mux.Handle(pattern, h)
	s.mu.Lock()
	s.patterns = append(s.patterns, pattern)
	s.mu.Unlock()
}

// HandleFunc registers a handler function for pattern.
func (s *Server) HandleFunc(pattern string, fn func(context.Context, *asynq.Task) error) {
	s.Handle(pattern, asynq.HandlerFunc(fn))
}

// handled lists the patterns of the registered handlers.
func (s *Server) handled() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.patterns)
}

// Use adds middleware that runs after the gate, around the handlers.
func (s *Server) Use(mws ...asynq.MiddlewareFunc) { s.mux.Use(mws...) }

// Gate returns the server's gate (for its metrics, see Gate.Gatherer).
func (s *Server) Gate() *Gate { return s.gate }

// Limiter returns the limiter the server's gate uses.
func (s *Server) Limiter() *throttle.Limiter { return s.lim }

// Start starts processing jobs and returns.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return asynq.ErrServerClosed
	}
	s.gate.rec.start(queuesOf(s.cfg.Asynq))
	if err := s.srv.Start(s.failures.unknownTypes(s.gate.wrap(s.failures.handlerErrors(s.mux)))); err != nil {
		s.gate.rec.leave()
		return fmt.Errorf("worker: %w", err)
	}
	s.started = true
	s.gate.startPump(queuesOf(s.cfg.Asynq), s.cfg.Asynq.Concurrency)
	return nil
}

// Run processes jobs until ctx ends or the process receives SIGTERM or
// SIGINT, then shuts down gracefully (see Shutdown).
func (s *Server) Run(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	s.Shutdown()
	return nil
}

// Shutdown stops taking jobs, hands the jobs waiting in-process for their
// slots back to asynq at once (deferred to their slots, nothing lost or
// counted), lets running handlers finish for up to asynq's ShutdownTimeout
// (asynq then puts unfinished jobs back in the queue), waits up to
// ShutdownWait for the handlers to return and release their slots, and
// closes the limiter it made. A slot whose release was missed frees itself
// when its lease runs out.
func (s *Server) Shutdown() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	started := s.started
	s.mu.Unlock()
	s.gate.Stop()
	if started {
		s.srv.Shutdown()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownWait)
		if err := s.gate.Wait(ctx); err != nil {
			s.gate.log.Warn("handlers still running after shutdown", "waited", s.cfg.ShutdownWait)
		}
		cancel()
	}
	s.gate.rec.leave()
	s.closeLimiter()
}

func (s *Server) closeLimiter() {
	if s.ownLimiter {
		_ = s.lim.Close()
	}
}
