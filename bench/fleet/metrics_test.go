package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestMain also runs this test binary as a worker process: the end-to-end
// test starts the benchmark, which starts its workers from its own
// executable.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "worker" {
		os.Exit(runWorker(os.Args[1:]))
	}
	redistest.Main(m)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func msList(ns ...int) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = ms(n)
	}
	return out
}

func TestGCRASteps(t *testing.T) {
	t.Parallel()
	// 10/s (100 ms apart), burst 2, allowance 5 ms: each step is a request
	// at `at`; a conforming one is charged.
	steps := []struct {
		at   int
		want bool
	}{
		{0, true},    // full bucket
		{0, true},    // the burst's second
		{0, false},   // tat is 200 ms ahead: more than (2-1)·100 ms + 5 ms
		{96, true},   // tat 200 − 96 = 104 ≤ 105: within the allowance
		{100, false}, // tat 300 − 100 = 200 > 105
		{195, true},  // 300 − 195 = 105
		{250, false}, // 400 − 250 = 150
		{1000, true}, // a long pause refills the bucket
		{1000, true},
		{1000, false},
	}
	g := newGCRA(10, 2, ms(5))
	for i, s := range steps {
		got := g.conforms(ms(s.at))
		require.Equal(t, s.want, got, "step %d at %d ms", i, s.at)
		if got {
			g.charge(ms(s.at))
		}
	}
}

func TestNonConforming(t *testing.T) {
	t.Parallel()
	// 10/s burst 1: 100 ms apart conforms; 90 ms apart does not without
	// an allowance, does with 10 ms.
	even := msList(0, 100, 200, 300, 400)
	require.Equal(t, 0, nonConforming(even, 10, 1, 0))
	tight := msList(0, 90, 180, 270)
	require.Equal(t, 2, nonConforming(tight, 10, 1, 0)) // 90 refused (not charged), 180 ok, 270 refused
	require.Equal(t, 0, nonConforming(tight, 10, 1, ms(30)))
	require.Equal(t, 0, nonConforming(nil, 10, 1, 0))
	require.Equal(t, 0, nonConforming(tight, 0, 1, 0), "no rate: nothing refused")
}

func TestRateExcess(t *testing.T) {
	t.Parallel()
	uniform := func(n int, every time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i) * every
		}
		return out
	}
	cases := []struct {
		name  string
		times []time.Duration
		rate  int64
		burst int64
		w     time.Duration
		want  float64
	}{
		{"none", nil, 10, 1, time.Second, 0},
		{"at the limit", uniform(100, 100*time.Millisecond), 10, 1, 10 * time.Second, 0},
		// 10/s for 10 s allows 1 + 100; 200 requests in 10 s is 99 too many: 99%.
		{"twice the limit", uniform(200, 50*time.Millisecond), 10, 1, 10 * time.Second, 0.99},
		// 6 at once fit in a 1 s window of 10/s burst 5 (5 + 10).
		{"a burst within the window", make([]time.Duration, 6), 10, 5, time.Second, 0},
		{"burst 1, 12 at once", make([]time.Duration, 12), 10, 1, time.Second, 0.1},
		{"no rate rule", uniform(100, 0), 0, 1, time.Second, 0},
	}
	for _, c := range cases {
		require.InDelta(t, c.want, rateExcess(c.times, c.rate, c.burst, c.w), 1e-9, c.name)
	}
}

func TestAchievedRate(t *testing.T) {
	t.Parallel()
	// A burst of 5 at 0, then one every 10 ms until 1 s: 100 more in 1 s.
	times := make([]time.Duration, 5)
	for i := 1; i <= 100; i++ {
		times = append(times, ms(10*i))
	}
	require.InDelta(t, 100, achievedRate(times, 5), 1e-9)
	require.Zero(t, achievedRate(times[:5], 5))
	require.Zero(t, achievedRate(nil, 1))
	require.Zero(t, achievedRate(make([]time.Duration, 3), 1), "no time passed")
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	vals := msList(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	require.Equal(t, ms(5), percentile(vals, 50))
	require.Equal(t, ms(10), percentile(vals, 99))
	require.Equal(t, ms(10), percentile(vals, 100))
	require.Equal(t, ms(1), percentile(vals, 1))
	require.Equal(t, ms(1), percentile(vals, 0))
	require.Zero(t, percentile(nil, 50))
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = ms(i + 1)
	}
	require.Equal(t, ms(99), percentile(hundred, 99))
	require.Equal(t, ms(50), percentile(hundred, 50))
	require.Equal(t, msList(1, 2, 3), sortDurations(msList(3, 1, 2)))
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	// 10/s (100 ms apart), burst 1, allowance 2 ms: a request at `at`
	// conforms when tat − at ≤ 2 ms. d is its delivery delay; its
	// handler started at at − d. Its admission is not known.
	a := func(at, d int, status uint8) arrival {
		return arrival{at: ms(at), delay: ms(d), sinceAdmit: unknownDelay, status: status}
	}
	arr := []arrival{
		a(1000, 5, accepted),     // tat 1100; started at 995, tat of starts 1095
		a(1097, 1, rejectedRate), // 1100 − 1097 − 2 = 1 ms early; the previous took 4 ms longer: explained
		a(1100, 2, accepted),     // tat 1200; started 1098, tat of starts 1198
		a(1150, 1, rejectedConc), // over a cap: neither charged nor a rate refusal
		a(1190, 3, rejectedRate), // 8 ms early; the previous took 1 ms less: not explained; started 1187, 9 ms early
	}
	got := refusals(arr, 10, 1, ms(2))
	require.Equal(t, []refusal{
		{early: ms(1), delay: ms(1), prevDelay: ms(5), startEarly: ms(-3), startKnown: true},
		{early: ms(8), delay: ms(3), prevDelay: ms(2), startEarly: ms(9), startKnown: true},
	}, got)
	require.True(t, got[0].explained())
	require.False(t, got[1].explained())

	// A request with no recorded start: its successor has no previous
	// delay to compare, and the tenant's starts cannot be replayed.
	arr = append(arr, arrival{at: ms(1300), delay: unknownDelay, sinceAdmit: unknownDelay}, a(1390, 1, rejectedRate))
	got = refusals(arr, 10, 1, ms(2))
	require.Len(t, got, 3)
	require.Equal(t, refusal{early: ms(8), delay: ms(1), prevDelay: unknownDelay}, got[2])
	require.False(t, got[2].explained(), "nothing to compare")
	for _, f := range got {
		require.False(t, f.startKnown)
	}

	// Burst 2 (slack 100 + 2 ms): the refused request came 1 ms early;
	// the previous accepted one took no longer than it, but the one
	// before took 9 ms longer. Over the starts (990, 999, 1096) it
	// conforms: tat 1190 − 1096 − 102 = −8 ms.
	arr = []arrival{a(1000, 10, accepted), a(1000, 1, accepted), a(1097, 1, rejectedRate)}
	got = refusals(arr, 10, 2, ms(2))
	require.Equal(t, []refusal{{early: ms(1), delay: ms(1), prevDelay: ms(1), startEarly: ms(-8), startKnown: true}}, got)
	require.False(t, got[0].explained())

	// The starts are replayed in the order they started: the refused
	// request started (990) before the accepted one (999) and came late
	// by its own delivery, so at its start nothing was charged yet.
	arr = []arrival{a(1000, 1, accepted), a(1050, 60, rejectedRate)}
	got = refusals(arr, 10, 1, ms(2))
	require.Equal(t, []refusal{{early: ms(48), delay: ms(60), prevDelay: ms(1), startEarly: ms(-992), startKnown: true}}, got)

	// Over the admissions (at − sinceAdmit): both refused requests were
	// early at their handler's start by 2 ms; the first was admitted
	// early too, the second in time, but its handler started 1 ms after
	// its admission where the previous one's started 4 ms after.
	b := func(at, d, sinceAdmit int, status uint8) arrival {
		return arrival{at: ms(at), delay: ms(d), sinceAdmit: ms(sinceAdmit), status: status}
	}
	arr = []arrival{
		b(1000, 1, 3, accepted),     // admitted 997: tat of admissions 1097
		b(1096, 1, 2, rejectedRate), // admitted 1094: 1097 − 1094 − 2 = 1 ms early
		b(1200, 1, 5, accepted),     // admitted 1195, started 1199: tat of admissions 1295
		b(1296, 1, 2, rejectedRate), // admitted 1294: 1295 − 1294 − 2 = −1: in time
	}
	got = refusals(arr, 10, 1, ms(2))
	require.Equal(t, []refusal{
		{early: ms(2), delay: ms(1), prevDelay: ms(1), startEarly: ms(2), startKnown: true, admitEarly: ms(1), admitKnown: true},
		{early: ms(2), delay: ms(1), prevDelay: ms(1), startEarly: ms(2), startKnown: true, admitEarly: ms(-1), admitKnown: true},
	}, got)

	require.Empty(t, refusals(arr, 0, 1, 0), "no rate: no rate refusals")
	require.Empty(t, refusals(nil, 10, 1, 0))

	all := [][]arrival{{b(0, 3, 4, accepted), a(0, 1, rejectedRate)}, nil, {{delay: unknownDelay, sinceAdmit: ms(1)}, b(0, 2, 1, accepted)}}
	known, unknown := lagStats(all, deliveryDelay)
	require.Equal(t, msList(1, 2, 3), known)
	require.Equal(t, 1, unknown)
	known, unknown = lagStats(all, admitToStart)
	require.Equal(t, msList(-1, 1), known, "admitted 1 ms before its start, and 1 ms after")
	require.Equal(t, 2, unknown)
	require.Equal(t, spread{n: 2, unknown: 2, p50: ms(-1), p99: ms(1), p999: ms(1), max: ms(1)}, spreadOf(known, unknown))
	require.Equal(t, "-1.00 / 1.00 / 1.00 / 1.00 ms (2 unknown)", spreadOf(known, unknown).cell("unknown"))
	require.Equal(t, "not recorded", spreadOf(nil, 5).cell("unknown"))
	require.Equal(t, "0.412 / 23.5 / 100 ms", millis(412*time.Microsecond)+" / "+millis(23500*time.Microsecond)+" / "+millis(ms(100))+" ms")
}

func TestPeakConcurrencyAndDeliveries(t *testing.T) {
	t.Parallel()
	arr := []arrival{{conc: 1}, {conc: 3, status: rejectedConc}, {conc: 2}}
	require.Equal(t, 3, peakConcurrency(arr))
	require.Zero(t, peakConcurrency(nil))
	require.InDelta(t, 1.5, perJob(150, 100), 1e-9)
	require.Zero(t, perJob(10, 0))
}

func TestLostAndDuplicated(t *testing.T) {
	t.Parallel()
	enqueued := []bool{true, true, true, false, true}
	served := []uint32{1, 0, 3, 0, 2}
	missing, dups := lostAndDuplicated(enqueued, served)
	require.Equal(t, 1, missing, "job 1 was never answered; job 3 was never enqueued")
	require.Equal(t, 3, dups, "job 2 twice more, job 4 once more")
}

func TestIdealStarts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name              string
		enq               []time.Duration
		rate, burst, conc int64
		hold              time.Duration
		want              []time.Duration
	}{
		{"no limits", msList(0, 0, 5), 0, 0, 0, 0, msList(0, 0, 5)},
		{"rate 10/s burst 2", msList(0, 0, 0, 0, 500), 10, 2, 0, 0, msList(0, 0, 100, 200, 500)},
		{"concurrency 2, hold 50 ms", msList(0, 0, 0, 10, 200), 0, 0, 2, ms(50), msList(0, 0, 50, 50, 200)},
		{"rate 20/s and concurrency 1, hold 100 ms", msList(0, 0, 0), 20, 1, 1, ms(100), msList(0, 100, 200)},
		{"rate 20/s and concurrency 2, hold 100 ms", msList(0, 0, 0, 0), 20, 1, 2, ms(100), msList(0, 50, 100, 150)},
	}
	for _, c := range cases {
		require.Equal(t, c.want, idealStarts(c.enq, c.rate, c.burst, c.conc, c.hold), c.name)
	}
}

func TestWorkload(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"tiny", "small", "full"} {
		cfg := presets[name]
		w, err := newWorkload(cfg)
		require.NoError(t, err, name)
		require.Len(t, w.jobs, cfg.jobs, name)
		require.Len(t, w.tenants, cfg.tenants, name)
		sum := 0
		for _, tn := range w.tenants {
			require.Positive(t, tn.jobs, "%s: %s has jobs", name, tn.name)
			_, err := tn.policy()
			require.NoError(t, err, "%s: %s policy %q", name, tn.name, tn.policyText())
			sum += tn.jobs
		}
		require.Equal(t, cfg.jobs, sum, name)
		per := map[int32]int{}
		for i, j := range w.jobs {
			per[j.tenant]++
			if i > 0 {
				require.LessOrEqual(t, w.jobs[i-1].at, j.at, "%s: jobs sorted", name)
			}
		}
		for _, tn := range w.tenants {
			require.Equal(t, tn.jobs, per[int32(tn.id)], "%s: %s", name, tn.name)
		}
		for i := w.bigFrom; i < w.bigFrom+cfg.big; i++ {
			require.Equal(t, int32(0), w.jobs[i].tenant, "%s: the big burst is contiguous", name)
			require.Equal(t, cfg.bigAt, w.jobs[i].at)
		}
		again, err := newWorkload(cfg)
		require.NoError(t, err)
		require.Equal(t, w.jobs, again.jobs, "%s: deterministic", name)
	}
	require.Equal(t, "rate=5/s burst=2 concurrency=3", tenant{rate: 5, burst: 2, conc: 3}.policyText())
	require.Equal(t, "concurrency=3", tenant{conc: 3}.policyText())
	_, err := newWorkload(config{name: "bad"})
	require.Error(t, err)
}

func TestSaturationWorkload(t *testing.T) {
	t.Parallel()
	for name, sc := range satPresets {
		w, err := newSaturationWorkload(name, sc, 5)
		require.NoError(t, err, name)
		require.Equal(t, kindSaturation, w.kind)
		require.Len(t, w.tenants, sc.small+1, name)
		require.Equal(t, "", w.tenants[0].policyText(), "%s: the flooding tenant has no limits", name)
		require.Equal(t, len(w.jobs), w.cfg.jobs)
		require.Equal(t, sc.workers, w.cfg.workers)
		n := 0
		for i, j := range w.jobs {
			if j.tenant == 0 {
				n++
				require.Equal(t, sc.bigAt, j.at)
			} else {
				require.Less(t, j.at, sc.span)
			}
			if i > 0 {
				require.LessOrEqual(t, w.jobs[i-1].at, j.at, "sorted")
			}
		}
		require.Equal(t, sc.big, n, name)
		require.Equal(t, int32(0), w.jobs[w.bigFrom].tenant)
		// The small tenants' limits never bind at their trickle.
		require.Greater(t, float64(w.tenants[1].rate), 2*sc.trickle, name)
		// The fleet needs at least half the small tenants' span after the
		// burst to work the burst off, at its slots' best.
		require.GreaterOrEqual(t, float64(sc.big)/sc.capacity(), (sc.span-sc.bigAt).Seconds()/2, "%s: the fleet cannot keep up", name)
		again, err := newSaturationWorkload(name, sc, 5)
		require.NoError(t, err)
		require.Equal(t, w.jobs, again.jobs, "%s: deterministic", name)
	}
	// -flood-concurrency gives the flooding tenant a rule that never binds
	sc := satPresets["small"]
	sc.floodConc = 50
	w, err := newSaturationWorkload("small", sc, 5)
	require.NoError(t, err)
	require.Equal(t, "concurrency=50", w.tenants[0].policyText())
	_, err = newSaturationWorkload("bad", satConfig{}, 5)
	require.Error(t, err)
}

func TestCompute(t *testing.T) {
	t.Parallel()
	w, err := newWorkload(presets["tiny"])
	require.NoError(t, err)
	rd := &runData{setup: setupSluice, enq: make([]time.Duration, len(w.jobs)), served: make([]uint32, len(w.jobs)),
		arrivals: make([][]arrival, len(w.tenants)), deliveries: int64(len(w.jobs)) + 7, leftover: map[string]int{}, elapsed: time.Minute}
	// Every job enqueued on schedule and started 10 ms later, once; job 0
	// a second time (a duplicate); the last job never (lost).
	for i, j := range w.jobs {
		rd.enq[i] = j.at
		if i == len(w.jobs)-1 {
			continue
		}
		rd.served[i] = 1
		rd.arrivals[j.tenant] = append(rd.arrivals[j.tenant], arrival{at: j.at + ms(10), delay: ms(2), sinceAdmit: ms(3), job: int32(i), conc: 1})
		rd.lastOK = max(rd.lastOK, j.at+ms(10))
	}
	rd.served[0] = 2
	// And 1,500 more requests of the big tenant (100/s burst 20), refused:
	// 1,700 sent within 10 ms, against 20 + 1,000 allowed in 10 s and
	// 20 + 100 in 1 s.
	for k := 0; k < 1500; k++ {
		rd.arrivals[0] = append(rd.arrivals[0], arrival{at: time.Second + ms(20), delay: ms(1), sinceAdmit: ms(2), job: int32(w.bigFrom), conc: 1, status: rejectedRate})
	}
	// One more request says no start: counted apart from the delays.
	rd.arrivals[1] = append(rd.arrivals[1], arrival{at: time.Minute, delay: unknownDelay, sinceAdmit: unknownDelay, job: 1, conc: 1, status: rejectedConc})
	rd.gate = map[string]float64{
		"sluice_worker_decisions_total{rule=,verdict=allowed}":           500,
		"sluice_worker_decisions_total{rule=rate[0],verdict=denied}":     20,
		"sluice_worker_decisions_total{rule=reserved,verdict=denied}":    30,
		"sluice_worker_decisions_total{rule=concurrency,verdict=denied}": 5,
	}
	rd.denied = map[string]int64{whyRate: 4, whyConc: 6}
	r := compute(w, rd)
	require.Equal(t, len(w.jobs), r.enqueued)
	require.InDelta(t, 25, r.gateDenied, 1e-9, "denied, reserved decisions apart")
	require.InDelta(t, 30, r.gateReserved, 1e-9)
	require.Equal(t, int64(4), r.deniedRate)
	require.Equal(t, int64(6), r.deniedConc)
	require.Equal(t, len(w.jobs)-1, r.completed)
	require.Equal(t, 1, r.lost)
	require.Equal(t, 1, r.duplicates)
	require.Equal(t, 1500, r.rejRate)
	require.Equal(t, 1, r.rejConc)
	// Delivery: 1,500 refused requests took 1 ms, 499 accepted 2 ms.
	require.Equal(t, spread{n: len(w.jobs) - 1 + 1500, unknown: 1, p50: ms(1), p99: ms(2), p999: ms(2), max: ms(2)}, r.delivery)
	// Every job admitted 1 ms before its handler started.
	require.Equal(t, spread{n: len(w.jobs) - 1 + 1500, unknown: 1, p50: ms(1), p99: ms(1), p999: ms(1), max: ms(1)}, r.admitToStart)
	// The big tenant's 200 accepted requests at 1.01 s charged its GCRA
	// (100/s, burst 20) to 3.01 s; the refused ones, at 1.02 s, came
	// 3.01 − 1.02 − 0.19 = 1.8 s early, far more than the previous request's
	// 1 ms longer delivery: none explained, every one early at its start.
	require.Equal(t, 1800*time.Millisecond, r.earlyP50)
	require.Equal(t, 1800*time.Millisecond, r.earlyMax)
	require.Zero(t, r.explained)
	require.Zero(t, r.unexplainedUnknown)
	require.Equal(t, 1500, r.startedEarly)
	require.Equal(t, 1799*time.Millisecond, r.startEarlyP50, "the accepted ones started 2 ms before arriving, the refused ones 1 ms")
	require.Equal(t, 1500, r.admittedEarly)
	require.Zero(t, r.admittedInTime)
	require.Equal(t, 1799*time.Millisecond, r.admitEarlyP50, "each admitted 1 ms before its start")
	require.Empty(t, r.problems, "the replay agrees with the statuses")
	require.InDelta(t, float64(len(w.jobs)+7)/float64(len(w.jobs)), r.perJob, 1e-9)
	require.NotEmpty(t, r.waits, "small tenants' conforming jobs in the burst window")
	require.Equal(t, ms(10), r.waitP50)
	require.Equal(t, "t0000", r.rateErrTenant)
	require.InDelta(t, 0.68, r.rateErr, 1e-9)
	require.Equal(t, "t0000", r.rateErr1sTenant)
	require.InDelta(t, 15.8, r.rateErr1s, 1e-9)
	// A job still queued at the end is unfinished, not lost.
	rd.leftover["retry"] = 1
	r = compute(w, rd)
	require.Zero(t, r.lost)
	require.Equal(t, 1, r.unfinished)
}

// TestRejectionNote: sluice's Rejections bullet cites the run's delivery
// delays and accounts for every refusal over a rate.
func TestRejectionNote(t *testing.T) {
	t.Parallel()
	b := &benchmark{o: options{allowance: ms(2)}}
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	r := &result{rejRate: 10, rejConc: 1, delivery: spread{n: 1000, p50: us(412), p99: us(1930), p999: us(6100), max: ms(41)},
		earlyP50: us(520), earlyMax: us(3100), explained: 6, prevLongerP50: us(1200), unexplainedUnknown: 1,
		startedEarly: 2, startEarlyP50: us(300), startConformed: 1, admittedEarly: 1, admitEarlyP50: us(250), admittedInTime: 1}
	var out bytes.Buffer
	b.rejectionNote(&out, r)
	note := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{
		"**Rejections (11: 10 over a rate, 1 over a cap).**",
		"Here that took 0.412 ms (p50), 1.93 ms (p99), 6.10 ms (p99.9) and at most 41.0 ms",
		"against the 2ms the downstream forgives",
		"The 10 requests refused over a rate came 0.520 ms early (median), 3.10 ms at most",
		"For 6 of them the tenant's previous accepted request had taken longer",
		"(1.20 ms longer, median)",
		"3 are not explained so",
		"2 of them were early already when their handler started, by 0.300 ms (median)",
		"Replayed over the gate's admissions (Redis time), 1 of those was early already there, by 0.250 ms:",
		"1 was admitted in time: the variation in the time from admission to handler start",
		"1 conformed at its handler's start",
		"1 had no delivery delay to compare",
	} {
		require.Contains(t, note, want)
	}
	require.NotContains(t, note, "could not be replayed")

	// Every one explained; a run that recorded no delays says so.
	r = &result{rejRate: 2, earlyP50: us(100), earlyMax: us(200), explained: 2, prevLongerP50: us(900)}
	out.Reset()
	b.rejectionNote(&out, r)
	note = strings.Join(strings.Fields(out.String()), " ")
	require.Contains(t, note, "This run did not record how long that took.")
	require.Contains(t, note, "For every one the tenant's previous accepted request")
	require.Contains(t, note, "alone explains them.")
	require.NotContains(t, note, "not explained")
}

// TestSavedDelays: a saved run keeps its arrivals' delays and the
// downstream's allowance; a run saved before delays were recorded reads
// them as unknown.
func TestSavedDelays(t *testing.T) {
	t.Parallel()
	w, err := newWorkload(presets["tiny"])
	require.NoError(t, err)
	rd := &runData{setup: setupSluice, enq: make([]time.Duration, len(w.jobs)), served: make([]uint32, len(w.jobs)),
		arrivals: make([][]arrival, len(w.tenants)), allowance: ms(2)}
	for ti := range rd.arrivals {
		rd.arrivals[ti] = []arrival{}
	}
	rd.arrivals[0] = []arrival{{at: ms(5), delay: ms(1), sinceAdmit: ms(-1), job: 3, conc: 1},
		{at: ms(6), delay: unknownDelay, sinceAdmit: unknownDelay, job: 4, conc: 2, status: rejectedRate}}
	saved := toSaved(rd)
	again, err := fromSaved(saved, w, 2, ms(2))
	require.NoError(t, err)
	require.Equal(t, rd.arrivals, again.arrivals)
	require.Equal(t, ms(2), again.allowance)

	saved.Delay, saved.SinceAdmit = nil, nil
	again, err = fromSaved(saved, w, 2, ms(2))
	require.NoError(t, err)
	for _, a := range again.arrivals[0] {
		require.Equal(t, unknownDelay, a.delay)
		require.Equal(t, unknownDelay, a.sinceAdmit)
	}
	saved.Delay = [][]time.Duration{{0}}
	_, err = fromSaved(saved, w, 2, ms(2))
	require.Error(t, err, "delays of another workload")
}

func TestInfoField(t *testing.T) {
	t.Parallel()
	text := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.5\r\n"
	v, err := infoField(text, "used_cpu_user")
	require.NoError(t, err)
	require.InDelta(t, 2.5, v, 1e-9)
	_, err = infoField(text, "used_memory_peak")
	require.Error(t, err)
}

func TestSamples(t *testing.T) {
	t.Parallel()
	// Redis busy 0.5 core for 10 s, then a whole core for 10 s.
	var ss []sample
	for i := 0; i <= 20; i++ {
		cpu := 0.5 * float64(min(i, 10))
		if i > 10 {
			cpu += float64(i - 10)
		}
		ss = append(ss, sample{At: time.Duration(i) * time.Second, RedisCPU: cpu, Pending: int64(i % 7)})
	}
	require.InDelta(t, 1.0, redisBusy(ss, 10*time.Second), 1e-9)
	require.InDelta(t, 0.5, redisBusy(ss[:11], 10*time.Second), 1e-9)
	require.Zero(t, redisBusy(nil, 10*time.Second))
	require.Equal(t, int64(6), peakPending(ss))
}

func TestGateCounters(t *testing.T) {
	t.Parallel()
	g := map[string]float64{
		"sluice_worker_decisions_total{rule=,verdict=allowed}":           10,
		"sluice_worker_decisions_total{rule=rate[0],verdict=denied}":     7,
		"sluice_worker_decisions_total{rule=concurrency,verdict=denied}": 2000,
		"sluice_worker_decisions_total{rule=window,verdict=denied}":      0, // exported at zero, never denied
		"sluice_worker_deferrals_total{reason=throttled}":                3,
		"sluice_worker_deferrals_total{reason=cooldown}":                 0,
	}
	require.Equal(t, "concurrency 2,000, rate[0] 7", counterSummary(g, "sluice_worker_decisions_total", "rule", "verdict=denied"))
	require.Equal(t, "throttled 3", counterSummary(g, "sluice_worker_deferrals_total", "reason", ""))
	require.Equal(t, "rate[0] 7", counterSummaryExcept(g, "sluice_worker_decisions_total", "rule", "verdict=denied", "concurrency"))
	require.Equal(t, "(none recorded)", counterSummary(g, "sluice_worker_drops_total", "tenant", ""))
	require.InDelta(t, 2017, counterTotal(g, "sluice_worker_decisions_total"), 1e-9)
	require.InDelta(t, 2007, counterTotal(g, "sluice_worker_decisions_total", "verdict=denied"), 1e-9)
}

func TestStallsOf(t *testing.T) {
	t.Parallel()
	s := time.Second
	// Jobs enqueued at 0, 0, 0 and 50 s; started at 0.1, 31 and 62 s, the
	// last one never; requests at their starts and a refused one at 40 s.
	enq := []time.Duration{0, 0, 0, 50 * s}
	started := []time.Duration{100 * time.Millisecond, 31 * s, 62 * s, -1}
	arr := []time.Duration{100 * time.Millisecond, 31 * s, 40 * s, 62 * s}
	got := stallsOf(enq, started, arr, 90*s, 10*s)
	require.Equal(t, [][2]time.Duration{
		{100 * time.Millisecond, 31 * s}, // two wait, nothing arrives
		{40 * s, 62 * s},                 // the third still waits after the refused request
		{62 * s, 90 * s},                 // the last one never starts
	}, got)
	require.Empty(t, stallsOf(enq[:1], started[:1], arr[:1], 90*s, 10*s), "nothing waits")
	require.Empty(t, stallsOf(nil, nil, nil, 90*s, 10*s))
	// A job that waits 9 s is no stall.
	require.Empty(t, stallsOf([]time.Duration{s}, []time.Duration{10 * s}, []time.Duration{10 * s}, 20*s, 10*s))
}

func TestSummarizeE2E(t *testing.T) {
	t.Parallel()
	s := time.Second
	rounds := []e2eRound{
		{Setup: setupPlain, Handler: handlerHTTP, Jobs: 1000, Done: s, Enqueued: s / 4, RedisCPU: 0.1, WorkerCPU: s / 5},
		{Setup: setupSluice, Handler: handlerHTTP, Jobs: 1000, Done: 2 * s, Enqueued: s, RedisCPU: 0.3, WorkerCPU: s / 2},
		{Setup: setupSluice, Handler: handlerHTTP, Jobs: 1000, Done: 4 * s},
		{Setup: setupPlain, Handler: handlerHTTP, Jobs: 1000, Done: s / 2},
		{Setup: setupSluice, Handler: handlerHTTP, Jobs: 1000, Done: 3 * s, Profile: &redisProfile{}}, // not counted
		{Setup: setupPlain, Handler: handlerNoop, Jobs: 1000, Done: s},
	}
	sums := summarizeE2E(rounds)
	require.Len(t, sums, 1, "noop has no sluice round")
	h := sums[0]
	require.Equal(t, handlerHTTP, h.handler)
	require.InDelta(t, 1500, h.plainJPS, 1e-9, "median of 1,000 and 2,000")
	require.InDelta(t, 375, h.sluiceJPS, 1e-9, "median of 500 and 250")
	require.InDelta(t, 0.25, h.ratio, 1e-9)
	require.InDelta(t, 0.05e-3, h.plainRedis, 1e-12)
	require.InDelta(t, 2.5, median([]float64{4, 1, 2, 3}), 1e-9)
	require.Zero(t, median(nil))
}
