package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"

	"github.com/stretchr/testify/require"
)

func mustPolicy(t *testing.T, text string) *Policy {
	t.Helper()
	p, err := ParsePolicy(text)
	require.NoError(t, err)
	return p
}

func listed(t *testing.T, s *PolicyStore) map[string]string {
	t.Helper()
	all, err := s.List(context.Background())
	require.NoError(t, err)
	out := map[string]string{}
	for i, np := range all {
		if i > 0 {
			require.Less(t, all[i-1].Name, np.Name, "List is sorted by name")
		}
		require.NoError(t, np.Err, np.Name)
		out[np.Name] = np.Policy.String()
	}
	return out
}

func TestPolicyStore(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	s := e.store

	_, err := s.Get(ctx, "acme")
	require.ErrorIs(t, err, ErrNoPolicy)
	require.ErrorContains(t, err, `"acme"`)
	require.Empty(t, listed(t, s))
	v0, err := s.readVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), v0)

	require.NoError(t, s.Set(ctx, "acme", mustPolicy(t, "rate=100/s burst=20 concurrency=5")))
	require.NoError(t, s.Set(ctx, DefaultPolicy, mustPolicy(t, "rate=10/s")))
	require.NoError(t, s.Set(ctx, GlobalPolicy, mustPolicy(t, "rate=1000/s")))
	got, err := s.Get(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, mustPolicy(t, "rate=100/s burst=20 concurrency=5"), got)
	require.Equal(t, map[string]string{
		"*": "rate=10/s", "@global": "rate=1000/s", "acme": "rate=100/s burst=20 concurrency=5",
	}, listed(t, s))
	v1, err := s.readVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), v1)

	// Set replaces
	require.NoError(t, s.Set(ctx, "acme", mustPolicy(t, "window=5/s")))
	got, err = s.Get(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, "window=5/s", got.String())

	// bad names and policies are refused and change nothing
	before := listed(t, s)
	require.ErrorIs(t, s.Set(ctx, "@Other", &Policy{}), ErrInvalidTenant)
	require.ErrorContains(t, s.Set(ctx, "acme", nil), "Delete")
	require.ErrorContains(t, s.Set(ctx, "acme", &Policy{Rates: []Rate{{Limit: 0, Period: time.Second}}}), `policy "acme"`)
	require.Equal(t, before, listed(t, s))

	// Apply is all or nothing
	err = s.Apply(ctx, map[string]*Policy{
		"globex":  mustPolicy(t, "rate=5/s"),
		"initech": {Concurrency: &Concurrency{Limit: 1, Lease: time.Millisecond}},
	}, false)
	require.ErrorContains(t, err, `policy "initech"`)
	require.ErrorContains(t, err, "lease 1ms")
	require.Equal(t, before, listed(t, s))
	err = s.Apply(ctx, map[string]*Policy{"globex": mustPolicy(t, "rate=5/s"), "": {}}, true)
	require.ErrorIs(t, err, ErrInvalidTenant)
	require.Equal(t, before, listed(t, s))

	require.NoError(t, s.Apply(ctx, map[string]*Policy{
		"globex":  mustPolicy(t, "rate=5/s"),
		"initech": mustPolicy(t, "concurrency=1"),
	}, false))
	require.Equal(t, map[string]string{
		"*": "rate=10/s", "@global": "rate=1000/s", "acme": "window=5/s", "globex": "rate=5/s", "initech": "concurrency=1",
	}, listed(t, s))

	// with prune, what the map does not name is deleted
	require.NoError(t, s.Apply(ctx, map[string]*Policy{
		"*":      mustPolicy(t, "rate=20/s"),
		"globex": mustPolicy(t, "rate=5/s"),
	}, true))
	require.Equal(t, map[string]string{"*": "rate=20/s", "globex": "rate=5/s"}, listed(t, s))

	deleted, err := s.Delete(ctx, "globex")
	require.NoError(t, err)
	require.True(t, deleted)
	deleted, err = s.Delete(ctx, "globex")
	require.NoError(t, err)
	require.False(t, deleted)
	require.Equal(t, map[string]string{"*": "rate=20/s"}, listed(t, s))
	_, err = s.Get(ctx, "globex")
	require.ErrorIs(t, err, ErrNoPolicy)

	// an empty prune removes everything
	require.NoError(t, s.Apply(ctx, nil, true))
	require.Empty(t, listed(t, s))

	// Resolve: the tenant's own policy, else *, and @global
	require.NoError(t, s.Apply(ctx, map[string]*Policy{
		"*": mustPolicy(t, "rate=1/s"), "acme": mustPolicy(t, "rate=2/s"), GlobalPolicy: mustPolicy(t, "rate=3/s"),
	}, false))
	r, err := s.policiesFor(ctx, "acme")
	p, name, g := r.Policy, r.Name, r.Global
	require.NoError(t, err)
	require.Equal(t, "acme", name)
	require.Equal(t, "rate=2/s", p.String())
	require.Equal(t, "rate=3/s", g.String())
	r, err = s.policiesFor(ctx, "other")
	p, name = r.Policy, r.Name
	require.NoError(t, err)
	require.Equal(t, DefaultPolicy, name)
	require.Equal(t, "rate=1/s", p.String())
}

func TestPolicyStoreGarbage(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "good", "rate=1/s")
	require.NoError(t, e.client.HSet(ctx, policiesKey(e.prefix), "acme", "{not json", "bad", `{"policy":"rate=0/s"}`).Err())

	_, err := e.store.Get(ctx, "acme")
	require.ErrorContains(t, err, `policy "acme" in Redis is not valid JSON`)
	require.ErrorContains(t, err, `sluice policy set "acme"`)
	_, err = e.store.Get(ctx, "bad")
	require.ErrorContains(t, err, `policy "bad" in Redis is not valid`)
	require.ErrorContains(t, err, "rate=0/s")

	_, err = e.lim.Admit(ctx, "acme", "j")
	require.ErrorContains(t, err, `admit tenant "acme"`)
	require.ErrorContains(t, err, `policy "acme" in Redis is not valid JSON`)
	// other tenants are unaffected
	d, err := e.lim.Admit(ctx, "good", "j")
	require.NoError(t, err)
	require.True(t, d.Allowed)

	all, err := e.store.List(ctx)
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, "acme", all[0].Name)
	require.Nil(t, all[0].Policy)
	require.ErrorContains(t, all[0].Err, "not valid JSON")
	require.Equal(t, "bad", all[1].Name)
	require.ErrorContains(t, all[1].Err, "rate=0/s")
	require.Equal(t, "good", all[2].Name)
	require.NoError(t, all[2].Err)

	// a broken default or @global stops every tenant that would use it
	// (written as a change is, version and announcement, but not by Set)
	require.NoError(t, e.client.HSet(ctx, policiesKey(e.prefix), GlobalPolicy, "garbage").Err())
	require.NoError(t, e.client.Incr(ctx, policiesVersionKey(e.prefix)).Err())
	require.NoError(t, e.client.Publish(ctx, policiesChannel(e.prefix), "changed").Err())
	require.Eventually(t, func() bool {
		_, err := e.lim.Admit(ctx, "good", "j")
		return err != nil
	}, 2*time.Second, 20*time.Millisecond)
	_, err = e.lim.Admit(ctx, "good", "j")
	require.ErrorContains(t, err, `policy "@global" in Redis is not valid JSON`)

	// fixing it with Set clears the error
	e.policy(t, "acme", "rate=1/s")
	e.policy(t, GlobalPolicy, "rate=100/s")
	d, err = e.lim.Admit(ctx, "acme", "j")
	require.NoError(t, err)
	require.True(t, d.Allowed)
}

// otherWorker is a limiter with a store of its own over the same Redis, as
// another worker process has, checking the version every poll (0: the
// default).
func otherWorker(t *testing.T, e *env, poll time.Duration) *Limiter {
	t.Helper()
	store, err := newPolicyStore(e.client, &storeConfig{Prefix: e.prefix, PollInterval: poll})
	require.NoError(t, err)
	lim, err := NewLimiter(e.client, &Config{Prefix: e.prefix, Policies: store})
	require.NoError(t, err)
	lim.clock = e.clock.Now
	t.Cleanup(func() {
		require.NoError(t, lim.Close())
		require.NoError(t, store.close())
	})
	return lim
}

// waitForRule asks lim (without changing anything) whether a job of acme
// may start until the answer is a denial by rule, and fails when that
// takes more than within.
func waitForRule(t *testing.T, lim *Limiter, rule string, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	for {
		d, err := lim.Do(ctx, Request{Tenant: "acme", ID: "probe", DryRun: true})
		require.NoError(t, err)
		if !d.Allowed && d.Rule == rule {
			t.Logf("seen after %s", time.Since(start).Round(time.Millisecond))
			return
		}
		require.Less(t, time.Since(start), within, "policy change not seen; last decision %s", d)
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPolicyChangeSeenByOtherWorkers(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	// this one hardly ever polls: it learns of changes from pub/sub
	other := otherWorker(t, e, time.Hour)
	// this one learns from its version poll (every 250 ms: the default
	// poll, a last resort, is 5 s)
	polling := otherWorker(t, e, 250*time.Millisecond)
	// other subscribes before anything is announced, so it hears every
	// announcement; its watcher drops the cache once the subscription is live
	_, err := other.policies.policiesFor(ctx, "acme")
	require.NoError(t, err)
	heard := func(n uint64) func() bool { return func() bool { return other.policies.gen.Load() >= 1+n } }
	require.Eventually(t, heard(0), 5*time.Second, time.Millisecond, "other's subscription never went live")
	e.policy(t, "acme", "rate=1/s")
	// both read and cache acme's policy
	for _, lim := range []*Limiter{other, polling} {
		d, err := lim.Do(ctx, Request{Tenant: "acme", ID: "probe", DryRun: true})
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}

	// through the first store: announced on pub/sub
	e.policy(t, "acme", "concurrency=1 lease=1h")
	_, err = e.lim.Admit(ctx, "acme", "holder")
	require.NoError(t, err)
	waitForRule(t, other, "concurrency", time.Second)
	// both announcements have reached other, which may take a while on a
	// Cluster (relayed between nodes): none is left to arrive later, and
	// other caches acme's policy again
	require.Eventually(t, heard(2), 5*time.Second, time.Millisecond, "other missed an announcement")
	waitForRule(t, other, "concurrency", time.Second)
	waitForRule(t, polling, "concurrency", time.Second)

	// pub/sub is not used: the hash is changed directly and the version
	// bumped, as a lost message would leave it; the version poll finds it
	raw, err := encodePolicy(mustPolicy(t, "quota=1/day"))
	require.NoError(t, err)
	require.NoError(t, e.client.HSet(ctx, policiesKey(e.prefix), "acme", raw).Err())
	require.NoError(t, e.client.Incr(ctx, policiesVersionKey(e.prefix)).Err())
	// a worker started now reads the new policy and uses up the quota
	d, err := otherWorker(t, e, 0).Admit(ctx, "acme", "q")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	waitForRule(t, polling, "quota", time.Second)
	d, err = other.Do(ctx, Request{Tenant: "acme", ID: "probe", DryRun: true})
	require.NoError(t, err)
	// unless its subscription was made again meanwhile (a health check that
	// timed out on a loaded machine), when it reads the version, as a reader
	// that may have lost messages does
	switch {
	case other.policies.resubscribed.Load() != 0:
	case e.lim.cluster && d.Rule != "concurrency":
		// Known issue (docs/operations.md): on the Cluster pass a worker
		// that neither polled nor resubscribed has been seen with the new
		// policy already (1 run in 4); it is stale no longer than before,
		// never staler, so nothing is throttled wrongly. Not explained yet.
		t.Logf("known issue: a worker that does not poll read the changed policy without a message (rule %q)", d.Rule)
	default:
		require.Equal(t, "concurrency", d.Rule, "without a message, a worker that does not poll still has the old policy")
	}

	// a deletion is seen as well: acme falls back to the default policy
	e.policy(t, DefaultPolicy, "window=1/day")
	_, err = e.store.Delete(ctx, "acme")
	require.NoError(t, err)
	_, err = e.lim.Admit(ctx, "acme", "w")
	require.NoError(t, err)
	waitForRule(t, other, "window", time.Second)
}

func TestPolicyChangeKeepsState(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=1/min window=10/h quota=5/day concurrency=2")
	e.clock.Set(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC))
	d, err := e.lim.Admit(ctx, "acme", "a")
	require.NoError(t, err)
	require.True(t, d.Allowed)

	// a new policy with the same rules and more: nothing starts afresh
	e.policy(t, "acme", "rate=1/min window=10/h quota=5/day concurrency=2 backlog=10")
	d, err = e.lim.Admit(ctx, "acme", "b")
	require.NoError(t, err)
	require.Equal(t, "rate[0]", d.Rule)
	require.Equal(t, time.Minute, d.RetryAfter)
	st, err := e.lim.Stats(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Quota.Used)
	require.Equal(t, int64(1), st.Window.Started)
	require.Equal(t, int64(1), st.Concurrency.InFlight)

	// deleting the policy and setting it again keeps the state too
	_, err = e.store.Delete(ctx, "acme")
	require.NoError(t, err)
	e.policy(t, "acme", "rate=1/min window=10/h quota=5/day concurrency=2")
	d, err = e.lim.Admit(ctx, "acme", "b")
	require.NoError(t, err)
	require.Equal(t, "rate[0]", d.Rule)

	// a tighter rule applies to the state as it is
	e.policy(t, "acme", "rate=1/min window=1/h")
	e.clock.Advance(time.Minute)
	d, err = e.lim.Admit(ctx, "acme", "b")
	require.NoError(t, err)
	require.Equal(t, "window", d.Rule)
	require.Equal(t, 59*time.Minute, d.RetryAfter)
}

func TestPolicyStoreClose(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	s, err := newPolicyStore(e.client, &storeConfig{Prefix: e.prefix, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, s.Set(ctx, "acme", mustPolicy(t, "rate=1/s")))
	r, err := s.policiesFor(ctx, "acme")
	p := r.Policy
	require.NoError(t, err)
	require.Equal(t, "rate=1/s", p.String())
	require.NoError(t, s.close())
	require.NoError(t, s.close())
	// a closed store still reads and writes, without a cache
	require.NoError(t, e.client.HSet(ctx, policiesKey(e.prefix), "acme", mustEncode(t, "rate=2/s")).Err())
	r, err = s.policiesFor(ctx, "acme")
	p = r.Policy
	require.NoError(t, err)
	require.Equal(t, "rate=2/s", p.String())
	// a store never used closes without having started anything
	unused, err := newPolicyStore(e.client, &storeConfig{Prefix: e.prefix})
	require.NoError(t, err)
	require.NoError(t, unused.close())
	_, err = newPolicyStore(e.client, &storeConfig{PollInterval: -time.Second})
	require.ErrorContains(t, err, "-1s")
	_, err = newPolicyStore(nil, nil)
	require.Error(t, err)
}

func mustEncode(t *testing.T, text string) string {
	t.Helper()
	raw, err := encodePolicy(mustPolicy(t, text))
	require.NoError(t, err)
	return raw
}

// TestPolicyStoreChangesOnlyWhatChanges: deleting a policy that is not
// there, or storing one exactly as it is, changes nothing: no version bump
// (every reader would drop its cache) and no new "updated" time.
func TestPolicyStoreChangesOnlyWhatChanges(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	s := e.store
	version := func() int64 {
		v, err := s.readVersion(ctx)
		require.NoError(t, err)
		return v
	}
	raw := func() map[string]string {
		h, err := e.client.HGetAll(ctx, policiesKey(e.prefix)).Result()
		require.NoError(t, err)
		return h
	}
	require.NoError(t, s.Apply(ctx, map[string]*Policy{"acme": mustPolicy(t, "rate=5/s"), "old": mustPolicy(t, "concurrency=2")}, false))
	v, before := version(), raw()

	deleted, err := s.Delete(ctx, "missing")
	require.NoError(t, err)
	require.False(t, deleted)
	require.Equal(t, v, version(), "deleting a missing policy changes no version")

	time.Sleep(2 * time.Millisecond) // so that a rewrite would show a new "updated"
	require.NoError(t, s.Apply(ctx, map[string]*Policy{"acme": mustPolicy(t, "rate=5/s")}, false))
	require.NoError(t, s.Set(ctx, "old", mustPolicy(t, "concurrency=2")))
	require.Equal(t, v, version())
	require.Equal(t, before, raw(), "unchanged policies keep their updated time")

	// a change among unchanged ones writes only the change
	require.NoError(t, s.Apply(ctx, map[string]*Policy{"acme": mustPolicy(t, "rate=5/s"), "old": mustPolicy(t, "concurrency=3")}, false))
	require.Equal(t, v+1, version())
	after := raw()
	require.Equal(t, before["acme"], after["acme"])
	require.NotEqual(t, before["old"], after["old"])

	// prune with nothing to prune and nothing changed: nothing happens
	require.NoError(t, s.Apply(ctx, map[string]*Policy{"acme": mustPolicy(t, "rate=5/s"), "old": mustPolicy(t, "concurrency=3")}, true))
	require.Equal(t, v+1, version())
	deleted, err = s.Delete(ctx, "old")
	require.NoError(t, err)
	require.True(t, deleted)
	require.Equal(t, v+2, version())
}

// TestPolicyStoreMakesUpForLostMessages: a change announced while a
// reader's subscription is down (its connection killed) is lost on the
// channel; the reader reads the version as soon as it has subscribed
// again, and follows the change long before its version poll would.
func TestPolicyStoreMakesUpForLostMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := redistest.NewServer(t, nil)
	client := server.Client(t)
	prefix := redistest.Prefix(t)
	writer, err := newPolicyStore(client, &storeConfig{Prefix: prefix})
	require.NoError(t, err)
	defer writer.close()
	reader, err := newPolicyStore(client, &storeConfig{Prefix: prefix, PollInterval: time.Hour})
	require.NoError(t, err)
	defer reader.close()
	require.NoError(t, writer.Set(ctx, "acme", mustPolicy(t, "rate=1/s")))
	resolved := func() string {
		t.Helper()
		r, err := reader.policiesFor(ctx, "acme")
		require.NoError(t, err)
		return r.Policy.String()
	}
	// the reader's watcher is up and has the policy cached
	deadline := time.Now().Add(5 * time.Second)
	for resolved() != "rate=1/s" {
		require.True(t, time.Now().Before(deadline))
		time.Sleep(5 * time.Millisecond)
	}
	waitSubscribed := func() {
		t.Helper()
		for {
			n, err := client.PubSubNumSub(ctx, policiesChannel(prefix)).Result()
			require.NoError(t, err)
			if n[policiesChannel(prefix)] > 0 {
				return
			}
			require.True(t, time.Now().Before(deadline), "the reader never subscribed")
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitSubscribed()
	// an announced change reaches it: its watcher is past its start
	before := reader.changes.Load()
	require.NoError(t, writer.Set(ctx, "acme", mustPolicy(t, "rate=3/s")))
	for reader.changes.Load() == before || resolved() != "rate=3/s" {
		require.True(t, time.Now().Before(deadline), "the announced change never reached the reader")
		time.Sleep(5 * time.Millisecond)
	}
	changes := reader.changes.Load()
	// the subscription's connection dies, and the change is written and
	// announced (as Set does) in the same batch, before the reader can
	// subscribe again: its message reaches no one
	var published *redis.IntCmd
	_, err = client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ClientKillByFilter(ctx, "TYPE", "pubsub")
		p.HSet(ctx, policiesKey(prefix), "acme", mustEncode(t, "rate=2/s"))
		p.Incr(ctx, policiesVersionKey(prefix))
		published = p.Publish(ctx, policiesChannel(prefix), "changed")
		return nil
	})
	require.NoError(t, err)
	require.Zero(t, published.Val(), "the message was lost")

	deadline = time.Now().Add(10 * time.Second)
	for resolved() != "rate=2/s" || reader.changes.Load() == changes {
		require.True(t, time.Now().Before(deadline), "the change never reached the reader (its poll is an hour)")
		time.Sleep(5 * time.Millisecond)
	}
	require.Positive(t, reader.resubscribed.Load(), "followed on subscribing again")
}
