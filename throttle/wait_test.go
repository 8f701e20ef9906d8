package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitedStartsConform is the property test of decisions a job waits
// for (Request.Wait, the worker gate's): random policies (one or two
// rates, bursts from 1 up, a concurrency rule or not), jobs arriving
// faster than the rates let them start, so that the meters are kept at
// their rates. A job allowed at a slot ahead starts at a random time in
// its ticket's window (its slot up to the ticket's late after it) and
// redeems its ticket there; one in ten comes later than that, is refused
// by the ticket and decided anew, as the gate does it; a denied job asks
// again when it is told to, a little late (one in three by up to its
// burst and more). On a discrete-event clock, every start
// conforms to every rate exactly (no started-meter tolerance), the
// concurrency rule is never exceeded, and a meter with a burst lets a job
// that waits for it start late by part of that burst: its ticket carries
// a window, so that a worker that wakes a little late still starts the
// job on the decision (a job decided anew is charged twice, and its first
// slot is lost). Under rates only, a job refused late is decided anew on
// a ticket for its next slot, and its starts there conform too.
func TestWaitedStartsConform(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trials := 24
	if testing.Short() {
		trials = 4
	}
	for trial := range trials {
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(trial), 17))
			r := 20 + rng.IntN(1000)
			burst := 1 + rng.IntN(30)
			if trial%4 == 0 {
				burst = 1
			}
			text := fmt.Sprintf("rate=%d/s burst=%d", r, burst)
			if rng.IntN(3) == 0 {
				text += fmt.Sprintf(" rate=%d/min burst=%d", r*60*3/4, max(burst, 1+rng.IntN(100)))
			}
			clim := 0
			if rng.IntN(2) == 0 {
				clim = 2 + rng.IntN(30)
				text += fmt.Sprintf(" concurrency=%d", clim)
			}
			e := setup(t, false, exactConfig)
			// The fake clock drives the decisions, but Redis expires keys by
			// its own: a scope's state, kept a second or two past what the
			// fake clock needs, could expire while a loaded machine (-race,
			// every trial at once) takes longer than that between two events
			// a fake millisecond apart. The trials keep their keys.
			e.lim.noExpire = true
			e.policy(t, "acme", text)
			pol, err := ParsePolicy(text)
			require.NoError(t, err)
			res, err := jobPath{e.lim}.Resolve(ctx, "acme")
			require.NoError(t, err)
			own := jobPoliciesOf(res)

			// events on the fake clock: a job asks (ticket: the decision it
			// carries, refused), starts on its ticket, or ends
			type event struct {
				at     time.Time
				kind   int // 0 ask, 1 start on its ticket, 2 end
				id     string
				ticket string
				claim  uint64
			}
			var events []event
			push := func(ev event) {
				i, _ := slices.BinarySearchFunc(events, ev.at, func(a event, at time.Time) int { return a.at.Compare(at) })
				// after the events of the same time
				for i < len(events) && !events[i].at.After(ev.at) {
					i++
				}
				events = slices.Insert(events, i, ev)
			}
			interval := time.Second / time.Duration(r)
			at := e.clock.Now()
			jobs := 1500
			for k := range jobs {
				// arrivals at about one and a half times the rate
				at = at.Add(time.Duration(rng.Int64N(int64(interval) * 4 / 3)))
				push(event{at: at, kind: 0, id: fmt.Sprintf("j%d", k)})
			}
			var starts []int64
			running, most := 0, 0
			var windows, lateWindows, refused, again int
			start := func(ev event, claim uint64) {
				starts = append(starts, e.clock.Now().UnixMicro())
				if clim > 0 {
					require.NotZero(t, claim, "job %s started without a slot", ev.id)
					running++
					most = max(most, running)
					push(event{at: e.clock.Now().Add(time.Duration(rng.IntN(40_000)) * time.Microsecond), kind: 2, id: ev.id, claim: claim})
				}
			}
			for len(events) > 0 {
				ev := events[0]
				events = events[1:]
				if ev.at.After(e.clock.Now()) {
					e.clock.Set(ev.at)
				}
				where := fmt.Sprintf("%s: job %s at %s", text, ev.id, e.clock.Now().Sub(fakeEpoch))
				switch ev.kind {
				case 2:
					require.NoError(t, e.lim.Release(ctx, "acme", ev.id, ev.claim), where)
					running--
					continue
				case 1:
					d, ok, err := e.lim.redeem(ctx, Request{Tenant: "acme", ID: ev.id, policies: own}, ev.ticket)
					require.NoError(t, err, where)
					tk, _ := parseTicket(ev.ticket)
					if e.clock.Now().UnixMicro() <= tk.slot+tk.late {
						require.True(t, ok, "%s: its ticket refused in its window", where)
					}
					if ok {
						start(ev, d.Claim)
						continue
					}
					refused++
				}
				d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: ev.id, Reserve: true, Wait: 200 * time.Millisecond, Ticket: ev.ticket, policies: own})
				require.NoError(t, err, where)
				switch {
				case d.Allowed && d.Ticket != "":
					tk, ok := parseTicket(d.Ticket)
					require.True(t, ok, where)
					if ev.ticket != "" {
						// refused late, decided anew as its line would: at
						// its next slot, on a ticket again
						again++
					} else {
						windows++
						if tk.late > 0 {
							lateWindows++
						}
					}
					s := tk.slot + rng.Int64N(tk.late+1)
					if rng.IntN(4) == 0 {
						s = tk.slot + tk.late
					}
					if rng.IntN(10) == 0 {
						// it comes late for its window
						s = tk.slot + tk.late + 1 + rng.Int64N(int64(interval/time.Microsecond)*3)
					}
					push(event{at: time.UnixMicro(s), kind: 1, id: ev.id, ticket: d.Ticket})
				case d.Allowed:
					start(ev, d.Claim)
				default:
					require.Positive(t, d.RetryAfter, where)
					// back for its slot a little late, as a worker wakes:
					// its started meters move on past the planned ones
					// (one in three by up to its burst and more)
					late := time.Duration(rng.Int64N(int64(interval)))
					if rng.IntN(3) == 0 {
						late = time.Duration(rng.Int64N(int64(interval) * int64(burst+2)))
					}
					push(event{at: e.clock.Now().Add(d.RetryAfter + late), kind: 0, id: ev.id})
				}
			}
			require.Len(t, starts, jobs)
			for _, rate := range pol.Rates {
				conforms(t, rate, starts, text)
			}
			if clim > 0 {
				require.LessOrEqual(t, most, clim, "%s: more jobs ran at once than its concurrency", text)
			}
			t.Logf("%s: %d waited decisions, %d with a window past the slot, %d tickets refused late, %d of them decided anew on a ticket", text, windows, lateWindows, refused, again)
			if clim == 0 && refused > 0 {
				// rates only: a job refused late is decided anew for a slot
				// ahead on a ticket (when it is within its wait), not on a
				// reservation the jobs decided after it would pass
				require.Positive(t, again, "%s: no job refused late was decided anew on a ticket", text)
			}
			if burst <= 3 {
				require.Positive(t, windows, "%s: no job waited for its slot", text)
			}
			if burst >= 2 && len(pol.Rates) == 1 {
				// a meter that lets a job start only at a slot ahead runs
				// ahead of it by its burst: the job may start that late
				require.Equal(t, windows, lateWindows, "%s: tickets with a window past their slot", text)
			}
		})
	}
}

// TestLateTicketKeepsItsPlace: at a strict rate (10/s, burst 1) a job
// back for its reserved slot finds the started meter a few ms ahead (the
// job before it started late) and is allowed there on a ticket; it wakes
// 5 ms past the ticket's window and is decided anew while the next job
// holds the reservation for the slot after it. It starts at once on its
// planned charge, as on a reservation, rather than behind the next job: a
// late wake costs the next job those few ms, not this one a slot. Every
// start conforms to the rate within the tolerance.
func TestLateTicketKeepsItsPlace(t *testing.T) {
	t.Parallel()
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=1")
	t0 := e.clock.Now()
	ask := func(id, ticket string) Decision {
		t.Helper()
		d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: id, Reserve: true, Wait: 200 * time.Millisecond, Ticket: ticket})
		require.NoError(t, err)
		return d
	}
	var starts []time.Time
	require.True(t, ask("j0", "").Allowed, "the first starts at once")
	starts = append(starts, e.clock.Now())
	// the next three reserve the next three slots
	for k, id := range []string{"j1", "j2", "j3"} {
		d := ask(id, "")
		require.True(t, d.Reserved, "%+v", d)
		require.True(t, t0.Add(time.Duration(k+1)*100*time.Millisecond).Equal(d.Slot), "%s: %+v", id, d)
	}
	// j1 starts on its reservation 5 ms late
	e.clock.Set(t0.Add(105 * time.Millisecond))
	d := ask("j1", "")
	require.True(t, d.Allowed, "%+v", d)
	require.Empty(t, d.Ticket)
	starts = append(starts, e.clock.Now())

	// j2, back at its slot, is allowed on a ticket a few ms ahead, where
	// the started meter lets it start
	e.clock.Set(t0.Add(200 * time.Millisecond))
	d2 := ask("j2", "")
	require.True(t, d2.Allowed, "%+v", d2)
	require.NotEmpty(t, d2.Ticket)
	tk, ok := parseTicket(d2.Ticket)
	require.True(t, ok)

	// it wakes 5 ms past its ticket's window: the ticket no longer holds
	e.clock.Set(time.UnixMicro(tk.slot + tk.late).Add(5 * time.Millisecond))
	_, ok, err := e.lim.redeem(ctx, Request{Tenant: "acme", ID: "j2"}, d2.Ticket)
	require.NoError(t, err)
	require.False(t, ok, "late for its ticket")
	late := ask("j2", d2.Ticket)
	require.True(t, late.Allowed, "decided anew, it starts at once on its planned charge: %+v", late)
	require.Empty(t, late.Ticket, "now, not at a slot ahead")
	starts = append(starts, e.clock.Now())

	// j3, back at its slot, starts those few ms later, not a slot later
	e.clock.Set(t0.Add(300 * time.Millisecond))
	d3 := ask("j3", "")
	for !d3.Allowed {
		require.Positive(t, d3.RetryAfter, "%+v", d3)
		e.clock.Advance(d3.RetryAfter)
		d3 = ask("j3", "")
	}
	if d3.Ticket != "" {
		e.clock.Set(d3.Slot) // on its ticket, at its slot
		_, ok, err := e.lim.redeem(ctx, Request{Tenant: "acme", ID: "j3"}, d3.Ticket)
		require.NoError(t, err)
		require.True(t, ok)
	}
	starts = append(starts, e.clock.Now())
	require.Less(t, starts[3].Sub(t0), 320*time.Millisecond, "j3 started %s after j0: a slot was lost", starts[3].Sub(t0))
	for i := 1; i < len(starts); i++ {
		require.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), 100*time.Millisecond-ToleranceDefault, "start %d follows the one before too closely: %v", i, starts)
	}
}
