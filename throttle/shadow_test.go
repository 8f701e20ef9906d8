package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// flushShadows sends the limiter's shadow decisions now and writes their
// counts (the counts of a flush's verdicts go with the next one).
func flushShadows(t *testing.T, lim *Limiter) {
	t.Helper()
	ctx := context.Background()
	lim.shadows.flush(ctx, lim, false)
	lim.shadows.flush(ctx, lim, false)
	lim.shadows.mu.Lock()
	defer lim.shadows.mu.Unlock()
	require.Empty(t, lim.shadows.pending, "shadow decisions left unsent")
	require.Empty(t, lim.shadows.counts, "shadow counts left unwritten")
}

// attempt is a job's start attempt at a time, running for dur when it
// starts.
type attempt struct {
	at   time.Duration // from the sequence's start
	id   string
	cost int64
	dur  time.Duration
}

// attempts is a random sequence of n start attempts, 0–2·gap apart.
func attempts(seed uint64, n int, gap, maxDur time.Duration, costs int64) []attempt {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]attempt, n)
	at := time.Duration(0)
	for i := range out {
		at += time.Duration(rng.Int64N(int64(2*gap))) + time.Microsecond
		out[i] = attempt{at: at, id: fmt.Sprintf("job-%d", i), cost: 1 + rng.Int64N(costs), dur: time.Microsecond + time.Duration(rng.Int64N(int64(maxDur)))}
	}
	return out
}

// event is a start or an end, in time order.
type event struct {
	at    time.Duration
	start bool
	a     *attempt
}

func timeline(seq []attempt) []event {
	var ev []event
	for i := range seq {
		a := &seq[i]
		ev = append(ev, event{at: a.at, start: true, a: a}, event{at: a.at + a.dur, a: a})
	}
	// ends before starts at the same time, as a slot given back frees it
	sort.SliceStable(ev, func(i, j int) bool {
		if ev[i].at != ev[j].at {
			return ev[i].at < ev[j].at
		}
		return !ev[i].start && ev[j].start
	})
	return ev
}

// shadowTally is the verdicts of a run: decisions, denials by rule and the
// waits the denials imposed.
type shadowTally struct {
	decisions int64
	denied    map[string]int64
	retry     time.Duration
}

func (s *shadowTally) add(d Decision) {
	s.decisions++
	if !d.Allowed {
		s.denied[d.Rule]++
		s.retry += d.RetryAfter
	}
}

// The same start attempts at the same times, once with the policy enforced
// (Admit without reservations: a denied job does not start, and holds
// nothing) and once with it in shadow (every job starts; the shadow decides
// and counts): the shadow denies exactly the starts enforcement denied,
// rule by rule, with the same waits, and Stats shows the same counts. The
// shadow's enforced policy (rate=1000/s burst=1000) never binds, and its own state is
// untouched by the shadow.
func TestShadowCountsEqualEnforcement(t *testing.T) {
	t.Parallel()
	start := fakeEpoch.Add(59*time.Minute + 50*time.Second) // the quota's hour ends 10 s in
	for _, tc := range []struct {
		name, policy string
		gap, dur     time.Duration
		costs        int64
	}{
		{"rate", "rate=20/s burst=3", 40 * time.Millisecond, 0, 2},
		{"rates", "rate=10/s burst=2 rate=400/min burst=30", 40 * time.Millisecond, 0, 1},
		{"window", "window=10/s", 60 * time.Millisecond, 0, 2},
		{"quota", "quota=100/hour", 80 * time.Millisecond, 0, 2},
		{"concurrency", "concurrency=3 lease=10s", 50 * time.Millisecond, 400 * time.Millisecond, 1},
		{"mix", "rate=25/s burst=4 window=15/s quota=200/hour concurrency=4 lease=10s", 30 * time.Millisecond, 300 * time.Millisecond, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			seq := attempts(uint64(len(tc.name)), 400, tc.gap, max(tc.dur, time.Microsecond), tc.costs)

			enforced := setup(t, false, nil)
			enforced.policy(t, "acme", tc.policy)
			want := shadowTally{denied: map[string]int64{}}
			claims := map[string]uint64{}
			for _, ev := range timeline(seq) {
				enforced.clock.Set(start.Add(ev.at))
				if !ev.start {
					if c, ok := claims[ev.a.id]; ok {
						require.NoError(t, enforced.lim.Release(ctx, "acme", ev.a.id, c))
					}
					continue
				}
				d, err := enforced.lim.Do(ctx, Request{Tenant: "acme", ID: ev.a.id, Cost: ev.a.cost})
				require.NoError(t, err)
				want.add(d)
				if d.Allowed && d.Claim != 0 {
					claims[ev.a.id] = d.Claim
				}
			}

			shadow := setup(t, false, nil)
			shadow.policy(t, "acme", "rate=1000/s burst=1000")
			shadow.policy(t, ShadowPrefix+"acme", tc.policy)
			var mu sync.Mutex
			got := shadowTally{denied: map[string]int64{}}
			var errs []error
			counted := func(d Decision, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err == nil && !d.Allowed && d.Policy != ShadowPrefix+"acme" {
					err = fmt.Errorf("denial by %q, not the shadow", d.Policy)
				}
				if err != nil {
					errs = append(errs, err)
					return
				}
				got.add(d)
			}
			ends := map[string]func(){}
			for _, ev := range timeline(seq) {
				shadow.clock.Set(start.Add(ev.at))
				if !ev.start {
					ends[ev.a.id]()
					continue
				}
				// the job starts (its enforced policy allows it), and its
				// start is recorded for the shadow
				d, err := shadow.lim.Do(ctx, Request{Tenant: "acme", ID: ev.a.id, Cost: ev.a.cost})
				require.NoError(t, err)
				require.True(t, d.Allowed, "the enforced policy never binds")
				r, err := shadow.lim.Policies().policiesFor(ctx, "acme")
				require.NoError(t, err)
				require.NotNil(t, r.Shadow)
				ends[ev.a.id] = shadow.lim.shadow(Request{Tenant: "acme", ID: ev.a.id, Cost: ev.a.cost, policies: &r}, d.Now, counted)
			}
			flushShadows(t, shadow.lim)

			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, errs)
			require.Equal(t, want.decisions, got.decisions)
			require.Equal(t, want.denied, got.denied, "denials by rule")
			require.Equal(t, want.retry, got.retry, "waits imposed")
			var total int64
			for _, n := range want.denied {
				total += n
			}
			require.Positive(t, total, "the sequence must meet the limit")
			require.Less(t, total, want.decisions, "the sequence must not only be denied")
			t.Logf("%s: enforced denied %d of %d %v; shadow denied %v", tc.policy, total, want.decisions, want.denied, got.denied)

			st, err := shadow.lim.Stats(ctx, "acme")
			require.NoError(t, err)
			require.NotNil(t, st.Shadow)
			require.Equal(t, ShadowPrefix+"acme", st.Shadow.Name)
			require.Equal(t, tc.policy, st.Shadow.Policy.String())
			require.Equal(t, want.decisions, st.Shadow.Decisions)
			require.Equal(t, total, st.Shadow.Denied)
			require.Equal(t, want.denied, st.Shadow.DeniedBy)
			require.Equal(t, want.retry, st.Shadow.RetryAfter)
			require.Equal(t, start.Add(seq[0].at).UnixMicro(), st.Shadow.Since.UnixMicro())
			// the enforced state saw every job; the shadow holds no slot
			require.Equal(t, int64(len(seq)), st.Started)
			shadow.lim.shadows.mu.Lock()
			require.Empty(t, shadow.lim.shadows.held, "every shadow slot given back")
			shadow.lim.shadows.mu.Unlock()
		})
	}
}

// A tenant without a shadow costs nothing: Shadow returns at once and
// nothing is queued. Bad input is refused and counted as an error.
func TestShadowNothingToDoAndBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	e.policy(t, "acme", "rate=10/s")
	e.policy(t, ShadowPrefix+"globex", "concurrency=1")
	e.policy(t, ShadowPrefix+"*", "rate=1/s") // tried on a tenant that follows the default
	var errs []error
	counted := func(_ Decision, err error) { errs = append(errs, err) }
	e.lim.shadow(Request{Tenant: "acme", ID: "job-1"}, time.Time{}, counted)()
	e.lim.shadows.mu.Lock()
	require.Empty(t, e.lim.shadows.pending, "no shadow, nothing queued")
	require.False(t, e.lim.shadows.running, "no loop started")
	e.lim.shadows.mu.Unlock()
	require.Empty(t, errs)

	e.lim.shadow(Request{Tenant: "globex"}, time.Time{}, counted)()
	e.lim.shadow(Request{Tenant: "@bad", ID: "job-1"}, time.Time{}, counted)()
	require.Len(t, errs, 2)
	require.ErrorContains(t, errs[0], `shadow of tenant "globex": the shadow "@shadow:globex" has a concurrency rule, which needs the job's id`)
	require.ErrorIs(t, errs[1], ErrInvalidTenant)
	e.lim.shadows.mu.Lock()
	require.Empty(t, e.lim.shadows.pending)
	e.lim.shadows.mu.Unlock()
}

// A process that dies while its job runs leaves the job's shadow slot to
// its lease: the slot frees itself, as an enforced one does.
func TestShadowSlotOfADeadProcessFreesAtItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	e.policy(t, ShadowPrefix+"acme", "concurrency=1 lease=2s")
	var mu sync.Mutex
	var got []Decision
	counted := func(d Decision, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			got = append(got, d)
		}
	}
	e.lim.shadow(Request{Tenant: "acme", ID: "job-1"}, time.Time{}, counted) // never ends
	flushShadows(t, e.lim)
	require.NoError(t, e.lim.Close()) // the process is gone: no renewal, no end

	// another process of the fleet
	lim, err := NewLimiter(e.client, &Config{Prefix: e.prefix, Policies: e.store})
	require.NoError(t, err)
	lim.clock = e.clock.Now
	defer lim.Close()
	e.clock.Advance(1900 * time.Millisecond)
	lim.shadow(Request{Tenant: "acme", ID: "job-2"}, time.Time{}, counted)()
	flushShadows(t, lim)
	e.clock.Advance(200 * time.Millisecond)
	lim.shadow(Request{Tenant: "acme", ID: "job-3"}, time.Time{}, counted)()
	flushShadows(t, lim)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 3)
	require.True(t, got[0].Allowed)
	require.Equal(t, "concurrency", got[1].Rule, "job-1's slot is held within its lease")
	require.True(t, got[2].Allowed, "and free past it")
}
