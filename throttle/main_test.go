package throttle

import (
	"context"
	"github.com/sluicehq/sluice/internal/waitroom"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	redistest.Main(m, goleak.IgnoreCurrent())
}

// fakeClock drives the scripts' time in tests, so step tables need no sleeps.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// fakeEpoch is where every fake clock starts, so that runs are repeatable
// (quota windows fall at the same steps every time). The scripts give keys
// TTLs relative to the clock they are handed, so any start works.
var fakeEpoch = time.Date(2026, time.March, 3, 9, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock {
	return &fakeClock{t: fakeEpoch}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

type env struct {
	client redis.UniversalClient // a Cluster client in the Cluster pass
	prefix string
	lim    *Limiter
	store  *PolicyStore
	clock  *fakeClock
	// tickets are the decisions the room made for jobs (by id), as the
	// room's test helpers saw them
	tickets sync.Map
}

// redeem starts job id of tenant on the ticket the room gave it, as the
// worker's gate does; it requires the ticket to hold.
func (e *env) redeem(t *testing.T, tenant, id string) Decision {
	t.Helper()
	ticket, ok := e.tickets.Load(id)
	require.True(t, ok, "no ticket for %s", id)
	d, ok, err := e.lim.redeem(context.Background(), Request{Tenant: tenant, ID: id}, ticket.(string))
	require.NoError(t, err)
	require.True(t, ok, "%s's ticket %s does not hold", id, ticket)
	return d
}

// gate starts job id of tenant as the worker's gate does: on the ticket
// the room gave it when it carries a decision (which must hold), else
// deciding on its reservation.
func (e *env) gate(t *testing.T, tenant, id string) Decision {
	t.Helper()
	if ticket, ok := e.tickets.Load(id); ok {
		if tk, _ := parseTicket(ticket.(string)); tk.late != lateReserved {
			return e.redeem(t, tenant, id)
		}
	}
	d, err := e.lim.Do(context.Background(), Request{Tenant: tenant, ID: id, Reserve: true})
	require.NoError(t, err)
	return d
}

// keep records the tickets of promoted jobs.
func (e *env) keep(jobs []waitroom.Promoted) {
	for _, p := range jobs {
		if p.Ticket != "" {
			e.tickets.Store(p.ID, p.Ticket)
		}
	}
}

// setup builds a limiter over the shared test server (the shared Cluster
// when SLUICE_TEST_CLUSTER=1) with a private prefix and, unless real is set,
// a fake clock.
func setup(t *testing.T, real bool, cfg *Config) *env {
	t.Helper()
	return setupOn(t, redistest.UniversalClient(t), real, cfg)
}

// setupOn is setup over the given client: cluster_test.go runs the same
// sequence on a single server and on a Cluster side by side.
func setupOn(t *testing.T, client redis.UniversalClient, real bool, cfg *Config) *env {
	t.Helper()
	prefix := redistest.Prefix(t)
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.Prefix = prefix
	store, err := newPolicyStore(client, &storeConfig{Prefix: prefix})
	require.NoError(t, err)
	c.Policies = store
	lim, err := NewLimiter(client, &c)
	require.NoError(t, err)
	e := &env{client: client, prefix: prefix, lim: lim, store: store}
	if !real {
		e.clock = newFakeClock()
		lim.clock = e.clock.Now
	}
	t.Cleanup(func() {
		require.NoError(t, lim.Close())
		require.NoError(t, store.close())
	})
	return e
}

func (e *env) policy(t *testing.T, name, text string) {
	t.Helper()
	p, err := ParsePolicy(text)
	require.NoError(t, err)
	require.NoError(t, e.store.Set(context.Background(), name, p))
}
