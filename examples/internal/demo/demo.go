// Package demo gives sluice's examples their Redis: an embedded one
// (miniredis), so that `go run ./examples/...` needs nothing installed, or
// the one of --redis URL, with a queue and key prefix of the run's own.
package demo

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisurl"
)

// Env is the Redis of one run of an example.
type Env struct {
	// Where names the Redis for the example's output.
	Where string
	// Queue and Prefix are the asynq queue and sluice key prefix of the
	// run: fixed on the embedded Redis, unique on a real one so that runs
	// never mix.
	Queue, Prefix string

	url  *redisurl.URL
	mini *miniredis.Miniredis

	mu      sync.Mutex
	clients []redis.UniversalClient
}

// Start opens the Redis of a run: the one at redisURL, or an embedded one
// when it is empty. name names the example, in the queue name.
func Start(ctx context.Context, redisURL, name string) (*Env, error) {
	e := &Env{Queue: name, Prefix: "sluice"}
	if redisURL == "" {
		e.mini = miniredis.NewMiniRedis()
		if err := e.mini.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("embedded Redis: %w", err)
		}
		e.Where = "an embedded Redis (miniredis)"
		return e, nil
	}
	u, err := redisurl.Parse(redisURL)
	if err != nil {
		return nil, err
	}
	e.url = u
	probe := u.NewClient()
	err = u.Ping(ctx, probe, 0)
	_ = probe.Close()
	if err != nil {
		return nil, err
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	e.Queue, e.Prefix = name+"-"+run, "sluice-"+name+"-"+run
	e.Where = "Redis at " + u.Where()
	return e, nil
}

// Client returns a new client of the run's Redis; Close closes it.
func (e *Env) Client() redis.UniversalClient {
	var c redis.UniversalClient
	if e.mini != nil {
		c = redis.NewClient(&redis.Options{Addr: e.mini.Addr(), PoolSize: 64})
	} else {
		o := e.url.UniversalOptions()
		o.PoolSize = 64
		c = redis.NewUniversalClient(o)
	}
	e.mu.Lock()
	e.clients = append(e.clients, c)
	e.mu.Unlock()
	return c
}

// Close removes the run's queue from a real Redis (sluice's keys expire by
// themselves), closes the clients and stops the embedded Redis. Stop the
// workers first.
func (e *Env) Close() {
	if e.mini == nil {
		c := e.Client()
		_ = asynq.NewInspectorFromRedisClient(c).DeleteQueue(e.Queue, true)
	}
	e.mu.Lock()
	for _, c := range e.clients {
		_ = c.Close()
	}
	e.clients = nil
	e.mu.Unlock()
	if e.mini != nil {
		e.mini.Close()
	}
}

// Quiet silences go-redis's own log of failed dials.
func Quiet() { redis.SetLogger(quiet{}) }

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// SyncWriter makes w safe for the concurrent writes of job handlers.
func SyncWriter(w io.Writer) io.Writer { return &syncWriter{w: w} }

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
