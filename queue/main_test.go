package queue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/asynqtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
)

func TestMain(m *testing.M) {
	redistest.Main(m, goleak.IgnoreCurrent())
}

type env struct {
	client    redis.UniversalClient // sluice's keys: a Cluster client in the Cluster pass
	asynq     redis.UniversalClient // asynq's queues: the same Redis, see asynqtest.Client
	prefix    string
	queue     string // a queue no other test uses (asynq's keys have no prefix)
	store     *throttle.PolicyStore
	lim       *throttle.Limiter
	q         *queue.Client
	inspector *asynq.Inspector
}

// setup builds a queue client over the shared test server (the shared
// Cluster when SLUICE_TEST_CLUSTER=1) with a private key prefix and queue
// name.
func setup(tb testing.TB, lcfg *throttle.Config) *env {
	tb.Helper()
	client, asynqRedis, prefix := redistest.UniversalClient(tb), asynqtest.Client(tb), redistest.Prefix(tb)
	var c throttle.Config
	if lcfg != nil {
		c = *lcfg
	}
	c.Prefix = prefix
	lim, err := throttle.NewLimiter(client, &c)
	require.NoError(tb, err)
	store := lim.Policies()
	q, err := queue.New(client, &queue.Config{Limiter: lim, AsynqRedis: asynqRedis})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		require.NoError(tb, q.Close())
		require.NoError(tb, lim.Close())
	})
	return &env{client: client, asynq: asynqRedis, prefix: prefix, queue: "q-" + prefix, store: store, lim: lim, q: q,
		inspector: asynq.NewInspectorFromRedisClient(asynqRedis)}
}

func (e *env) policy(tb testing.TB, name, text string) {
	tb.Helper()
	p, err := throttle.ParsePolicy(text)
	require.NoError(tb, err)
	require.NoError(tb, e.store.Set(context.Background(), name, p))
}

// asynqKeys lists asynq's keys of the env's queue: none means nothing was
// written for it.
func (e *env) asynqKeys(tb testing.TB) []string {
	tb.Helper()
	var mu sync.Mutex
	var keys []string
	require.NoError(tb, redistest.ForEachMaster(context.Background(), e.asynq, func(ctx context.Context, node redis.Cmdable) error {
		k, err := node.Keys(ctx, "asynq:{"+e.queue+"}:*").Result()
		mu.Lock()
		keys = append(keys, k...)
		mu.Unlock()
		return err
	}))
	return keys
}

func (e *env) waiting(tb testing.TB, tenant string) int64 {
	tb.Helper()
	st, err := e.lim.Stats(context.Background(), tenant)
	require.NoError(tb, err)
	return st.Waiting
}

// lineKey is tenant's line of the env's queue in the waiting room
// (throttle's key layout).
func (e *env) lineKey(tenant string) string { return e.prefix + ":{t:" + tenant + "}:l:" + e.queue }

// fleet starts an asynq server serving the env's queue with the given
// concurrency, whose jobs block until the test ends: the waiting room
// sees a fleet with room for that many jobs beyond its pending list.
func (e *env) fleet(tb testing.TB, concurrency int) {
	tb.Helper()
	srv := asynq.NewServerFromRedisClient(e.asynq, asynq.Config{
		Concurrency: concurrency, Queues: map[string]int{e.queue: 1}, LogLevel: asynq.FatalLevel,
		ShutdownTimeout: time.Second,
	})
	stop := make(chan struct{})
	require.NoError(tb, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		return nil
	})))
	tb.Cleanup(func() {
		close(stop)
		srv.Shutdown()
	})
	// wait until the server is registered
	insp := asynq.NewInspectorFromRedisClient(e.asynq)
	deadline := time.Now().Add(10 * time.Second)
	for {
		servers, err := insp.Servers()
		require.NoError(tb, err)
		for _, s := range servers {
			if _, ok := s.Queues[e.queue]; ok && s.Status == "active" {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("the asynq server did not register")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exampleTB lets Example functions, which get no *testing.T, use redistest:
// it implements the few testing.TB methods redistest calls and panics on a
// failure. The embedded nil TB is never called.
type exampleTB struct {
	testing.TB
	name     string
	cleanups []func()
}

func (e *exampleTB) Helper()                         {}
func (e *exampleTB) Name() string                    { return e.name }
func (e *exampleTB) Cleanup(f func())                { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatalf(format string, a ...any)  { panic(fmt.Sprintf(format, a...)) }
func (e *exampleTB) Fatal(a ...any)                  { panic(fmt.Sprint(a...)) }
func (e *exampleTB) Errorf(format string, a ...any)  { panic(fmt.Sprintf(format, a...)) }
func (e *exampleTB) FailNow()                        { panic("example failed") }
func (e *exampleTB) Logf(format string, args ...any) {}

func (e *exampleTB) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// exampleEnv gives an Example a Redis client (of the shared Cluster in the
// Cluster pass), a key prefix and a queue name of its own; call the
// returned function when done.
func exampleEnv(name string) (client redis.UniversalClient, prefix, queueName string, done func()) {
	tb := &exampleTB{name: name}
	client, prefix = redistest.UniversalClient(tb), redistest.Prefix(tb)
	return client, prefix, "q-" + strings.ReplaceAll(prefix, ".", "-"), tb.close
}
