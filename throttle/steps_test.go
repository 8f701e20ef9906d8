package throttle

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// step is one row of a step table: move the fake clock, do one operation,
// check the outcome. Times are offsets from the table's start.
type step struct {
	advance time.Duration
	op      string // "admit" (Limiter.Do, the default), "reserve" (Limiter.Reserve), "release", "renew", "cooldown"
	tenant  string // "acme" when empty
	id      string
	cost    int64 // 1 when 0
	reserve bool  // Request.Reserve
	dry     bool  // Request.DryRun
	dur     time.Duration

	// what the decision must be; for renew, allowed is the result
	allowed  bool
	retry    time.Duration // RetryAfter of a denial (an allowed job must have -1)
	rule     string        // denying rule
	policy   string        // denying policy; not checked when empty
	reserved bool          // Decision.Reserved
	slot     time.Duration // Decision.Slot when reserved; cooldown's end
	check    func(t *testing.T, d Decision)
}

const stepTenant = "acme"

// runSteps plays a step table against the limiter of e, whose fake clock
// must stand at the table's start.
func runSteps(t *testing.T, e *env, steps []step) {
	t.Helper()
	ctx := context.Background()
	start := e.clock.Now()
	for i, s := range steps {
		e.clock.Advance(s.advance)
		now := e.clock.Now()
		tenant := s.tenant
		if tenant == "" {
			tenant = stepTenant
		}
		op := s.op
		if op == "" {
			op = "admit"
		}
		where := fmt.Sprintf("step %d at +%s: %s tenant %q id %q cost %d", i, now.Sub(start), op, tenant, s.id, s.cost)
		var d Decision
		var err error
		switch op {
		case "admit":
			d, err = e.lim.Do(ctx, Request{Tenant: tenant, ID: s.id, Cost: s.cost, Reserve: s.reserve, DryRun: s.dry})
		case "reserve":
			cost := s.cost
			if cost == 0 {
				cost = 1
			}
			d, err = e.lim.Reserve(ctx, Request{Tenant: tenant, ID: s.id, Cost: cost})
		case "release":
			require.NoError(t, e.lim.Release(ctx, tenant, s.id, 0), where)
			continue
		case "renew":
			err := e.lim.Renew(ctx, tenant, s.id, 0)
			if !errors.Is(err, ErrClaimLost) {
				require.NoError(t, err, where)
			}
			require.Equal(t, s.allowed, err == nil, where+": renew result")
			continue
		case "cooldown":
			until, err := e.lim.Cooldown(ctx, tenant, s.dur)
			require.NoError(t, err, where)
			want := now.Add(s.dur)
			if s.slot != 0 {
				want = start.Add(s.slot)
			}
			require.Equal(t, want.UnixMicro(), until.UnixMicro(), where+": cooldown end")
			continue
		default:
			t.Fatalf("%s: unknown op", where)
		}
		require.NoError(t, err, where)
		require.Equal(t, now.UnixMicro(), d.Now.UnixMicro(), where+": decision time")
		require.Equal(t, s.allowed, d.Allowed, "%s: allowed (decision %s)", where, d)
		if s.allowed {
			require.Equal(t, time.Duration(-1), d.RetryAfter, where+": retry-after of an allowed job")
			require.Empty(t, d.Rule, where)
		} else {
			require.Equal(t, s.retry, d.RetryAfter, "%s: retry-after (decision %s)", where, d)
			require.Equal(t, s.rule, d.Rule, where+": rule")
			if s.policy != "" {
				require.Equal(t, s.policy, d.Policy, where+": policy")
			}
		}
		require.Equal(t, s.reserved, d.Reserved, "%s: reserved (decision %s)", where, d)
		if s.reserved {
			require.Equal(t, s.slot, d.Slot.Sub(start), where+": slot")
		} else {
			require.True(t, d.Slot.IsZero(), where+": no slot")
		}
		if s.check != nil {
			s.check(t, d)
		}
	}
}

// stepTable sets the policies (name -> text) and plays the steps.
func stepTable(t *testing.T, cfg *Config, policies map[string]string, steps []step) *env {
	t.Helper()
	e := setup(t, false, cfg)
	for name, text := range policies {
		e.policy(t, name, text)
	}
	runSteps(t, e, steps)
	return e
}

func remaining(n int64) func(*testing.T, Decision) {
	return func(t *testing.T, d Decision) {
		t.Helper()
		require.Equal(t, n, d.Remaining, "remaining")
	}
}

func inFlight(n int64) func(*testing.T, Decision) {
	return func(t *testing.T, d Decision) {
		t.Helper()
		require.Equal(t, n, d.InFlight, "in flight")
	}
}

func counts(remaining int64, resetAfter time.Duration, inflight int64) func(*testing.T, Decision) {
	return func(t *testing.T, d Decision) {
		t.Helper()
		require.Equal(t, remaining, d.Remaining, "remaining")
		require.Equal(t, resetAfter, d.ResetAfter, "reset after")
		require.Equal(t, inflight, d.InFlight, "in flight")
	}
}

const ms = time.Millisecond

func TestStepsRateBurst1(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=10/s"}, []step{
		{id: "a", allowed: true},
		{id: "b", retry: 100 * ms, rule: "rate[0]", policy: stepTenant},
		{advance: 50 * ms, id: "b", retry: 50 * ms, rule: "rate[0]"},
		{advance: 49 * ms, id: "b", retry: ms, rule: "rate[0]"},
		{advance: ms, id: "b", allowed: true},
		{id: "c", retry: 100 * ms, rule: "rate[0]"},
		// an idle bucket fills to its burst (1) and no further
		{advance: 10 * time.Second, id: "d", allowed: true},
		{id: "e", retry: 100 * ms, rule: "rate[0]"},
	})
}

func TestStepsRateBurst(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=10/s burst=3"}, []step{
		{id: "a", allowed: true, check: counts(2, 100*ms, -1)},
		{id: "b", allowed: true, check: counts(1, 200*ms, -1)},
		{id: "c", allowed: true, check: counts(0, 300*ms, -1)},
		{id: "d", retry: 100 * ms, rule: "rate[0]", check: counts(0, 300*ms, -1)},
		{advance: 100 * ms, id: "d", allowed: true},
		{id: "e", retry: 100 * ms, rule: "rate[0]"},
		{advance: 250 * ms, id: "e", allowed: true, check: remaining(1)},
		// full again after 300ms of quiet: three back to back
		{advance: 400 * ms, id: "f", allowed: true},
		{id: "g", allowed: true},
		{id: "h", allowed: true},
		{id: "i", retry: 100 * ms, rule: "rate[0]"},
	})
}

func TestStepsRateSlow(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=2/min burst=2"}, []step{
		{id: "a", allowed: true},
		{id: "b", allowed: true},
		{id: "c", retry: 30 * time.Second, rule: "rate[0]"},
		{advance: 29*time.Second + 999999*time.Microsecond, id: "c", retry: time.Microsecond, rule: "rate[0]"},
		{advance: time.Microsecond, id: "c", allowed: true},
	})
}

func TestStepsSeveralRates(t *testing.T) {
	t.Parallel()
	// rate[0]: 2/s burst 2; rate[1]: 3/min burst 3 (one every 20s)
	stepTable(t, nil, map[string]string{stepTenant: "rate=2/s burst=2 rate=3/min burst=3"}, []step{
		{id: "a", allowed: true},
		{id: "b", allowed: true},
		{id: "c", retry: 500 * ms, rule: "rate[0]"},
		{advance: 500 * ms, id: "c", allowed: true},
		// rate[0] has room again, rate[1] is spent until 20s after the start
		{advance: 500 * ms, id: "d", retry: 19 * time.Second, rule: "rate[1]"},
		{advance: 19 * time.Second, id: "d", allowed: true},
		{id: "e", retry: 20 * time.Second, rule: "rate[1]"},
	})
}

func TestStepsRateCost(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=10/s burst=5"}, []step{
		{id: "a", cost: 3, allowed: true, check: counts(2, 300*ms, -1)},
		{id: "b", cost: 3, retry: 100 * ms, rule: "rate[0]"},
		{id: "c", cost: 2, allowed: true, check: remaining(0)},
		{id: "d", cost: 1, retry: 100 * ms, rule: "rate[0]"},
		{advance: 200 * ms, id: "b", cost: 3, retry: 100 * ms, rule: "rate[0]"},
		{advance: 100 * ms, id: "b", cost: 3, allowed: true},
		{advance: time.Second, id: "e", cost: 5, allowed: true, check: remaining(0)},
	})
}

func TestStepsWindow(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "window=3/s"}, []step{
		{id: "a", allowed: true, check: counts(2, time.Second, -1)},
		{advance: 100 * ms, id: "b", allowed: true, check: remaining(1)},
		{advance: 100 * ms, id: "c", allowed: true, check: counts(0, time.Second, -1)},
		// full until the oldest entry (at 0) leaves the window at 1s
		{advance: 100 * ms, id: "d", retry: 700 * ms, rule: "window"},
		{advance: 699 * ms, id: "d", retry: ms, rule: "window"},
		{advance: ms, id: "d", allowed: true},
		// next frees when b (at 100ms) leaves
		{id: "e", retry: 100 * ms, rule: "window"},
		{advance: 100 * ms, id: "e", allowed: true},
		{id: "f", retry: 100 * ms, rule: "window"},
		// a job of cost 2 waits until two entries (c at 200ms, d at 1s) left
		{advance: 100 * ms, id: "f", cost: 2, retry: 800 * ms, rule: "window"},
		{id: "f", cost: 1, allowed: true},
		{advance: 2 * time.Second, id: "g", cost: 3, allowed: true, check: remaining(0)},
	})
}

func TestStepsWindowReservationsFIFO(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "window=2/s"}, []step{
		{id: "a", allowed: true},
		{advance: 300 * ms, id: "b", allowed: true},
		// reserved slots come in order: when a (0) then b (300ms) leave,
		// then when those slots leave, and never before an earlier slot
		{id: "c", reserve: true, retry: 700 * ms, rule: "window", reserved: true, slot: time.Second},
		{id: "d", reserve: true, retry: time.Second, rule: "window", reserved: true, slot: 1300 * ms},
		{id: "e", reserve: true, retry: 1700 * ms, rule: "window", reserved: true, slot: 2 * time.Second},
		// a cost-2 job needs two entries to leave, the last one d's at 1.3s
		// a cost-2 job needs a whole window to itself: after e's entry at 2s
		{id: "f", cost: 2, reserve: true, retry: 2700 * ms, rule: "window", reserved: true, slot: 3 * time.Second},
		{id: "g", reserve: true, retry: 3700 * ms, rule: "window", reserved: true, slot: 4 * time.Second},
		{advance: 700 * ms, id: "c", allowed: true},
		{id: "h", retry: 3 * time.Second, rule: "window"},
	})
}

// TestStepsStartedMeters: reservations line jobs up, but what counts for
// the limit is when jobs actually start. Jobs that come back late for
// their slots (within the grace) push the next ones back, so that the
// starts themselves never break the rule.
func TestStepsStartedMeters(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "window=2/s"}, []step{
		{op: "reserve", id: "r1", allowed: true, reserved: true, slot: 0},
		{op: "reserve", id: "r2", allowed: true, reserved: true, slot: 0},
		{op: "reserve", id: "r3", retry: time.Second, rule: "window", reserved: true, slot: time.Second},
		// r1 and r2 start late, at 900ms
		{advance: 900 * ms, id: "r1", allowed: true},
		{id: "r2", allowed: true},
		// r3 is on time, but two jobs started less than a window ago
		{advance: 100 * ms, id: "r3", retry: 900 * ms, rule: "window"},
		{advance: 900*ms - time.Microsecond, id: "r3", retry: time.Microsecond, rule: "window"},
		{advance: time.Microsecond, id: "r3", allowed: true},
	})
	// the same for a rate, less the tolerance (2ms) a started meter allows
	stepTable(t, nil, map[string]string{stepTenant: "rate=1/s"}, []step{
		{op: "reserve", id: "r1", allowed: true, reserved: true, slot: 0},
		{op: "reserve", id: "r2", retry: time.Second, rule: "rate[0]", reserved: true, slot: time.Second},
		{advance: 900 * ms, id: "r1", allowed: true},
		{advance: 100 * ms, id: "r2", retry: 898 * ms, rule: "rate[0]"},
		{advance: 898 * ms, id: "r2", allowed: true},
	})
}

func TestStepsQuotaHour(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	e.policy(t, stepTenant, "quota=3/hour")
	e.clock.Set(time.Date(2026, 5, 1, 10, 59, 0, 0, time.UTC))
	runSteps(t, e, []step{
		{id: "a", allowed: true, check: counts(2, time.Minute, -1)},
		{advance: time.Second, id: "b", allowed: true},
		{advance: time.Second, id: "c", allowed: true, check: counts(0, 58*time.Second, -1)},
		{advance: 30 * time.Second, id: "d", retry: 28 * time.Second, rule: "quota"},
		{advance: 28*time.Second - time.Microsecond, id: "d", retry: time.Microsecond, rule: "quota"},
		{advance: time.Microsecond, id: "d", allowed: true, check: counts(2, time.Hour, -1)},
		{advance: 10 * time.Minute, id: "e", cost: 2, allowed: true, check: remaining(0)},
		{id: "f", retry: 50 * time.Minute, rule: "quota"},
		// a reservation takes the first unit of the next hour
		{id: "f", reserve: true, retry: 50 * time.Minute, rule: "quota", reserved: true, slot: 61 * time.Minute},
		// 1+3 > 3: the next hour has no room either; the first with room
		// starts in 110 minutes, beyond the horizon (1h): no reservation
		{id: "g", cost: 3, reserve: true, retry: time.Hour, rule: "quota"},
	})
}

func TestStepsQuotaCron(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	e.policy(t, stepTenant, `quota=2 reset="*/2 * * * *"`)
	e.clock.Set(time.Date(2026, 5, 1, 10, 1, 30, 0, time.UTC))
	runSteps(t, e, []step{
		{id: "a", allowed: true, check: counts(1, 30*time.Second, -1)},
		{id: "b", allowed: true},
		{id: "c", retry: 30 * time.Second, rule: "quota"},
		{advance: 30*time.Second - time.Microsecond, id: "c", retry: time.Microsecond, rule: "quota"},
		{advance: time.Microsecond, id: "c", allowed: true, check: counts(1, 2*time.Minute, -1)},
		{advance: 119 * time.Second, id: "d", allowed: true},
		{id: "e", retry: time.Second, rule: "quota"},
		{advance: time.Second, id: "e", allowed: true},
	})
}

func TestStepsConcurrency(t *testing.T) {
	t.Parallel()
	stepTable(t, &Config{ConcurrencyRetry: time.Second}, map[string]string{stepTenant: "concurrency=2 lease=10s"}, []step{
		{id: "j1", allowed: true, check: func(t *testing.T, d Decision) {
			require.Equal(t, int64(1), d.InFlight)
			require.Equal(t, int64(1), d.Remaining)
			require.Equal(t, 10*time.Second, d.Lease)
		}},
		// the same job again holds the same slot
		{advance: time.Second, id: "j1", allowed: true, check: inFlight(1)},
		{advance: time.Second, id: "j2", allowed: true, check: inFlight(2)},
		// full: retry-after is capped at ConcurrencyRetry (1s)
		{id: "j3", retry: time.Second, rule: "concurrency", check: inFlight(2)},
		// a holder admitted again while full keeps its slot
		{id: "j2", allowed: true, check: inFlight(2)},
		{op: "release", id: "j1"},
		{id: "j3", allowed: true, check: inFlight(2)},
		{op: "release", id: "j1"}, // releasing twice is harmless
		{id: "j4", retry: time.Second, rule: "concurrency"},
		// j2's lease (from 2s) ends at 12s, j3's at 12s too; renew j3
		{advance: 5 * time.Second, op: "renew", id: "j3", allowed: true}, // j3 now ends at 17s
		{advance: 4*time.Second + 500*ms, id: "j4", retry: 500 * ms, rule: "concurrency"},
		// at 12s j2's lease is over: its slot is free, j3's renewed one is not
		{advance: 500 * ms, id: "j4", allowed: true, check: inFlight(2)},
		{id: "j5", retry: time.Second, rule: "concurrency"},
		{op: "renew", id: "j2", allowed: false}, // j2 lost its slot
		{id: "j2", retry: time.Second, rule: "concurrency"},
		{advance: 5 * time.Second, op: "renew", id: "j3", allowed: false}, // 17s: j3's lease ran out
		{id: "j5", allowed: true, check: inFlight(2)},
	})
}

func TestStepsConcurrencyLeaseRetry(t *testing.T) {
	t.Parallel()
	stepTable(t, &Config{ConcurrencyRetry: time.Second}, map[string]string{stepTenant: "concurrency=1 lease=1s"}, []step{
		{id: "j1", allowed: true, check: func(t *testing.T, d Decision) { require.Equal(t, time.Second, d.Lease) }},
		// retry-after is the time until the first lease ends
		{advance: 300 * ms, id: "j2", retry: 700 * ms, rule: "concurrency"},
		{advance: 700 * ms, id: "j2", allowed: true},
	})
}

func TestStepsCooldown(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=10/s"}, []step{
		{id: "a", allowed: true},
		{id: "b", reserve: true, retry: 100 * ms, rule: "rate[0]", reserved: true, slot: 100 * ms},
		{advance: 50 * ms, op: "cooldown", dur: 2 * time.Second},
		// a shorter cooldown does not cut the longer one short
		{op: "cooldown", dur: time.Second, slot: 2050 * ms},
		{id: "c", retry: 2 * time.Second, rule: "cooldown"},
		// b's slot falls inside the cooldown: it gets a new one after it
		{advance: 50 * ms, id: "b", reserve: true, retry: 1950 * ms, rule: "cooldown", reserved: true, slot: 2050 * ms},
		{id: "c", reserve: true, retry: 2050 * ms, rule: "rate[0]", reserved: true, slot: 2150 * ms},
		{advance: 1950*ms - time.Microsecond, id: "b", retry: time.Microsecond, rule: "cooldown"},
		{advance: time.Microsecond, id: "b", allowed: true},
		{advance: 100 * ms, id: "c", allowed: true},
	})
}

func TestStepsReservations(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=1/s"}, []step{
		{id: "a", reserve: true, allowed: true},
		{id: "b", reserve: true, retry: time.Second, rule: "rate[0]", reserved: true, slot: time.Second},
		{id: "c", reserve: true, retry: 2 * time.Second, rule: "rate[0]", reserved: true, slot: 2 * time.Second},
		// asking again keeps the same slot
		{advance: 500 * ms, id: "b", reserve: true, retry: 500 * ms, rule: "reserved", reserved: true, slot: time.Second},
		// and so does asking without Reserve (the slot is not reported then)
		{id: "b", retry: 500 * ms, rule: "reserved"},
		// b comes back at its slot: admitted without a second charge, so the
		// next new job lines up right after c
		{advance: 500 * ms, id: "b", allowed: true},
		{id: "d", reserve: true, retry: 2 * time.Second, rule: "rate[0]", reserved: true, slot: 3 * time.Second},
		// c comes back a little late (within Grace): still its slot
		{advance: 1500 * ms, id: "c", allowed: true},
		{id: "e", retry: 1500 * ms, rule: "rate[0]"},
	})
}

func TestStepsReservationHorizon(t *testing.T) {
	t.Parallel()
	stepTable(t, &Config{Horizon: 3 * time.Second}, map[string]string{stepTenant: "rate=1/s"}, []step{
		{id: "a", reserve: true, allowed: true},
		{id: "b", reserve: true, retry: time.Second, rule: "rate[0]", reserved: true, slot: time.Second},
		{id: "c", reserve: true, retry: 2 * time.Second, rule: "rate[0]", reserved: true, slot: 2 * time.Second},
		{id: "d", reserve: true, retry: 3 * time.Second, rule: "rate[0]", reserved: true, slot: 3 * time.Second},
		// the next slot (4s) is beyond the horizon: no reservation, come back at the horizon
		{id: "e", reserve: true, retry: 3 * time.Second, rule: "rate[0]"},
		{id: "e", reserve: true, retry: 3 * time.Second, rule: "rate[0]"},
		{op: "reserve", id: "e", retry: 3 * time.Second, rule: "rate[0]"},
		{advance: time.Second, id: "e", reserve: true, retry: 3 * time.Second, rule: "rate[0]", reserved: true, slot: 4 * time.Second},
	})
}

func TestStepsReservationGrace(t *testing.T) {
	t.Parallel()
	stepTable(t, &Config{Grace: time.Second}, map[string]string{stepTenant: "rate=1/s"}, []step{
		{id: "a", allowed: true},
		{id: "b", reserve: true, retry: time.Second, rule: "rate[0]", reserved: true, slot: time.Second},
		// b returns 1.5s after its slot, past the grace of 1s: its
		// reservation is forgotten and it is charged as a new job (the
		// bucket was free again at 2s, so it starts, and fills the bucket)
		{advance: 2500 * ms, id: "b", allowed: true},
		{id: "c", retry: time.Second, rule: "rate[0]"},
	})
	// the same within the grace: b starts on its reservation, not charged again
	stepTable(t, &Config{Grace: time.Second}, map[string]string{stepTenant: "rate=1/s"}, []step{
		{id: "a", allowed: true},
		{id: "b", reserve: true, retry: time.Second, rule: "rate[0]", reserved: true, slot: time.Second},
		{advance: 1500 * ms, id: "b", allowed: true},
		{id: "c", retry: 500 * ms, rule: "rate[0]"},
	})
}

func TestStepsReserve(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{stepTenant: "rate=1/s concurrency=1"}, []step{
		// shaping: the slot is taken, nothing starts (no concurrency slot)
		{op: "reserve", id: "a", allowed: true, reserved: true, slot: 0, check: func(t *testing.T, d Decision) {
			require.Equal(t, time.Duration(0), d.Lease)
			require.Equal(t, int64(0), d.InFlight)
		}},
		{op: "reserve", id: "b", retry: time.Second, rule: "rate[0]", reserved: true, slot: time.Second},
		{op: "reserve", id: "c", retry: 2 * time.Second, rule: "rate[0]", reserved: true, slot: 2 * time.Second},
		// a, processed now, starts on its reservation
		{id: "a", allowed: true, check: inFlight(1)},
		{op: "release", id: "a"},
		// b is early
		{id: "b", retry: time.Second, rule: "reserved"},
		{advance: time.Second, id: "b", allowed: true},
		{op: "release", id: "b"},
		// a new job lines up after c
		{id: "d", reserve: true, retry: 2 * time.Second, rule: "rate[0]", reserved: true, slot: 3 * time.Second},
		{advance: time.Second, id: "c", allowed: true},
	})
}

func TestStepsDryRun(t *testing.T) {
	t.Parallel()
	stepTable(t, &Config{ConcurrencyRetry: time.Second}, map[string]string{stepTenant: "rate=1/s window=5/min concurrency=1"}, []step{
		{id: "a", dry: true, allowed: true, check: counts(1, 0, 0)},
		{id: "a", dry: true, allowed: true},
		{id: "a", allowed: true, check: counts(0, time.Minute, 1)},
		{id: "b", dry: true, retry: time.Second, rule: "rate[0]"},
		{advance: time.Second, id: "b", dry: true, retry: time.Second, rule: "concurrency", check: inFlight(1)},
		{op: "release", id: "a"},
		{id: "b", dry: true, allowed: true, check: counts(1, 59*time.Second, 0)},
		// b's dry run took neither the rate nor the slot
		{id: "c", allowed: true, check: counts(0, time.Minute, 1)},
		// a dry run tells the slot a reservation would get, and takes nothing
		{id: "d", dry: true, reserve: true, retry: time.Second, rule: "rate[0]", reserved: true, slot: 2 * time.Second},
		{id: "e", reserve: true, retry: time.Second, rule: "rate[0]", reserved: true, slot: 2 * time.Second},
	})
}

func TestStepsDefaultAndGlobal(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{
		DefaultPolicy: "rate=1/s",
		GlobalPolicy:  "rate=10/s burst=3",
		stepTenant:    "rate=100/s burst=5",
	}, []step{
		// a tenant without a policy follows *
		{tenant: "other", id: "o1", allowed: true},
		{tenant: "other", id: "o2", retry: time.Second, rule: "rate[0]", policy: DefaultPolicy},
		// @global applies on top of the tenant's own policy: o1 took one of
		// its three, so acme gets two
		{id: "a", allowed: true, check: remaining(1)},
		{id: "b", allowed: true, check: remaining(0)},
		{id: "c", retry: 100 * ms, rule: "rate[0]", policy: GlobalPolicy},
		// the denial charged acme nothing: after @global refills, acme's own
		// burst of 5 has 3 left (two used), and @global lets 3 through
		{advance: 300 * ms, id: "c", allowed: true},
		{id: "d", allowed: true},
		{id: "e", allowed: true},
		{id: "f", retry: 100 * ms, rule: "rate[0]", policy: GlobalPolicy},
		// jobs without a tenant follow @global only
		{tenant: "", id: "x", retry: 100 * ms, rule: "rate[0]", policy: GlobalPolicy},
	})
}

func TestStepsTenantRateWithinGlobal(t *testing.T) {
	t.Parallel()
	stepTable(t, nil, map[string]string{
		GlobalPolicy: "rate=10/s burst=10",
		stepTenant:   "rate=1/s burst=2",
	}, []step{
		{id: "a", allowed: true},
		{id: "b", allowed: true},
		{id: "c", retry: time.Second, rule: "rate[0]", policy: stepTenant},
		// the tenant's denial left @global untouched: another tenant gets 8
		{tenant: "t2", id: "1", allowed: true, check: remaining(7)},
	})
}

func TestStepsRemaining(t *testing.T) {
	t.Parallel()
	// Remaining is the tightest rule's; ResetAfter the slowest rule's
	stepTable(t, nil, map[string]string{stepTenant: "rate=10/s burst=5 window=3/2s quota=100/day concurrency=4 lease=5s"}, []step{
		{id: "a", allowed: true, check: func(t *testing.T, d Decision) {
			require.Equal(t, int64(2), d.Remaining) // window 3 - 1
			require.Equal(t, int64(1), d.InFlight)
			require.Positive(t, d.ResetAfter)
			require.Greater(t, d.ResetAfter, 2*time.Second) // the quota's day
		}},
		{op: "release", id: "a"},
		{id: "b", allowed: true, check: func(t *testing.T, d Decision) {
			require.Equal(t, int64(1), d.Remaining)
			require.Equal(t, int64(1), d.InFlight)
		}},
	})
	stepTable(t, nil, map[string]string{stepTenant: "rate=10/s burst=5 window=30/s concurrency=1"}, []step{
		{id: "a", allowed: true, check: counts(0, time.Second, 1)}, // concurrency is tightest
		{op: "release", id: "a"},
		{id: "b", allowed: true, check: counts(0, time.Second, 1)},
		{op: "release", id: "b"},
		{id: "c", dry: true, allowed: true, check: counts(1, time.Second, 0)},
	})
	// no rule: everything -1
	stepTable(t, nil, nil, []step{
		{id: "a", allowed: true, check: counts(-1, -1, -1)},
	})
}
