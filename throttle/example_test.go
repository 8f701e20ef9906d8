package throttle_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/waitroom"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// In these examples redistest.ExampleClient stands for your own
// redis.UniversalClient (a single node, Sentinel or Cluster client); the
// prefix it returns only keeps the examples apart.

func ExampleParsePolicy() {
	p, err := throttle.ParsePolicy("concurrency=5 rate=100/s burst=20 quota=10000/day tz=UTC")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(p) // the canonical text form
	fmt.Println(p.Rates[0], "|", p.Quota, "|", p.Concurrency)

	_, err = throttle.ParsePolicy("rate=100/s burst=0")
	fmt.Println(err)
	// Output:
	// rate=100/s burst=20 quota=10000/day tz=UTC concurrency=5
	// 100/s burst 20 | 10000/day | 5 lease 30s
	// burst=0: must be a whole number of at least 1 (1 spaces jobs evenly)
}

func ExamplePolicy_String() {
	p := &throttle.Policy{
		Rates:       []throttle.Rate{throttle.PerSecond(10), {Limit: 5000, Period: time.Hour, Burst: 100}},
		Concurrency: &throttle.Concurrency{Limit: 3, Lease: time.Minute},
		Overflow:    throttle.OverflowWait,
		MaxWait:     2 * time.Second,
	}
	fmt.Println(p)
	// Output: rate=10/s rate=5000/h burst=100 concurrency=3 lease=1m overflow=wait max_wait=2s
}

func ExamplePerSecond() {
	r := throttle.PerSecond(100)
	fmt.Println(r, "one every", r.Interval())
	r.Burst = 20
	fmt.Println(r)

	back, err := throttle.ParseRate("100/s burst 20")
	fmt.Println(back == r, err)
	// Output:
	// 100/s one every 10ms
	// 100/s burst 20
	// true <nil>
}

func ExampleLimiter_Admit() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=2/min burst=2")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	for _, job := range []string{"job-1", "job-2", "job-3"} {
		d, err := lim.Admit(ctx, "acme", job)
		if err != nil {
			log.Fatal(err)
		}
		if d.Allowed {
			fmt.Println(job, "starts; remaining:", d.Remaining)
		} else {
			fmt.Println(job, "must wait: denied by", d.Rule)
		}
	}
	// Output:
	// job-1 starts; remaining: 1
	// job-2 starts; remaining: 0
	// job-3 must wait: denied by rate[0]
}

func ExampleLimiter_Do() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=1/min")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	// Denied jobs that ask for a reservation each get their own slot,
	// one interval apart, instead of all coming back at once.
	var slots []time.Time
	for _, job := range []string{"job-1", "job-2", "job-3"} {
		d, err := lim.Do(ctx, throttle.Request{Tenant: "acme", ID: job, Reserve: true})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: allowed=%v reserved=%v\n", job, d.Allowed, d.Reserved)
		if d.Reserved {
			slots = append(slots, d.Slot)
		}
	}
	fmt.Println("slots apart:", slots[1].Sub(slots[0]))
	// Output:
	// job-1: allowed=true reserved=false
	// job-2: allowed=false reserved=true
	// job-3: allowed=false reserved=true
	// slots apart: 1m0s
}

func ExampleLimiter_Reserve() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=1/min")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	// Shaping at enqueue: take each job's slot now, schedule the job for
	// it (e.g. asynq.ProcessAt(d.Slot)).
	first, _ := lim.Reserve(ctx, throttle.Request{Tenant: "acme", ID: "job-1"})
	second, _ := lim.Reserve(ctx, throttle.Request{Tenant: "acme", ID: "job-2"})
	fmt.Println("job-1 due now:", first.Allowed)
	fmt.Println("job-2 due now:", second.Allowed, "- one minute later:", second.Slot.Sub(first.Slot) == time.Minute)

	// When job-1 runs, Admit finds its reservation and does not charge it again.
	d, _ := lim.Admit(ctx, "acme", "job-1")
	fmt.Println("job-1 admitted:", d.Allowed)
	// Output:
	// job-1 due now: true
	// job-2 due now: false - one minute later: true
	// job-1 admitted: true
}

func ExampleLimiter_Release() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("concurrency=1 lease=30s")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	job1, _ := lim.Admit(ctx, "acme", "job-1")
	fmt.Println("job-1:", job1.Allowed, "lease", job1.Lease)
	d, _ := lim.Admit(ctx, "acme", "job-2")
	fmt.Println("job-2:", d.Allowed, d.Rule)

	// While job-1 runs, its worker renews the lease every Lease/3, under
	// the claim its admission got: a slot that passed to another admission
	// of the job (ErrClaimLost) is left alone.
	err = lim.Renew(ctx, "acme", "job-1", job1.Claim)
	fmt.Println("job-1 still holds its slot:", err == nil)

	// Done: the slot is free for job-2.
	if err := lim.Release(ctx, "acme", "job-1", job1.Claim); err != nil {
		log.Fatal(err)
	}
	d, _ = lim.Admit(ctx, "acme", "job-2")
	fmt.Println("job-2:", d.Allowed, "in flight", d.InFlight)
	// Output:
	// job-1: true lease 30s
	// job-2: false concurrency
	// job-1 still holds its slot: true
	// job-2: true in flight 1
}

func ExampleLimiter_Cooldown() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=100/s")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	// The downstream answered 429 with Retry-After: 120: pause the tenant.
	if _, err := lim.Cooldown(ctx, "acme", 2*time.Minute); err != nil {
		log.Fatal(err)
	}
	d, _ := lim.Admit(ctx, "acme", "job-1")
	fmt.Println(d.Allowed, d.Rule, d.RetryAfter > time.Minute)
	// Output: false cooldown true
}

func ExampleLimiter_Stats() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=10/min burst=5 quota=1000/day concurrency=2")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}
	for _, job := range []string{"job-1", "job-2", "job-3"} {
		if _, err := lim.Admit(ctx, "acme", job); err != nil {
			log.Fatal(err)
		}
	}

	st, err := lim.Stats(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("policy:", st.Policy, "started:", st.Started)
	fmt.Println(st.Rates[0].Rule, "available:", st.Rates[0].Available)
	fmt.Println("quota used:", st.Quota.Used, "remaining:", st.Quota.Remaining)
	fmt.Println("in flight:", st.Concurrency.InFlight, "of", st.Concurrency.Concurrency.Limit)
	for _, h := range st.Concurrency.Holders {
		fmt.Println("holder:", h.ID)
	}
	// Output:
	// policy: acme started: 2
	// rate[0] available: 3
	// quota used: 2 remaining: 998
	// in flight: 2 of 2
	// holder: job-1
	// holder: job-2
}

func ExamplePolicyStore_Set() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	store := lim.Policies()

	// Every worker sees a change within a second; no tenant's state is reset.
	policy, _ := throttle.ParsePolicy("rate=100/s burst=20 concurrency=5")
	if err := store.Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}
	got, _ := store.Get(ctx, "acme")
	fmt.Println(got)

	_, err = store.Get(ctx, "globex")
	fmt.Println(err)
	// Output:
	// rate=100/s burst=20 concurrency=5
	// no policy for "globex"
}

func ExamplePolicyStore_List() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	store := lim.Policies()
	policies, err := throttle.ParsePolicyFile([]byte(`
"*": rate=10/s
"@global": rate=1000/s
acme: rate=100/s burst=20 concurrency=5
`))
	if err != nil {
		log.Fatal(err)
	}
	// Apply stores them all or none; with prune it deletes the others.
	if err := store.Apply(ctx, policies, true); err != nil {
		log.Fatal(err)
	}

	all, err := store.List(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range all {
		fmt.Printf("%-8s %s\n", p.Name, p.Policy)
	}
	// Output:
	// *        rate=10/s
	// @global  rate=1000/s
	// acme     rate=100/s burst=20 concurrency=5
}

func ExampleParsePolicyFile() {
	policies, err := throttle.ParsePolicyFile([]byte(`
"*": "rate=10/s concurrency=2"
acme:
  rate: [100/s burst 20, 5000/h]
  quota: 10000/day
  tz: America/Los_Angeles
`))
	if err != nil {
		log.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		fmt.Printf("%s: %s\n", name, policies[name])
	}

	// Every entry is checked; an error names the line, the entry and the field.
	_, err = throttle.ParsePolicyFile([]byte("acme:\n  rate: 100/s\n  concurrency: 0\n"))
	fmt.Println(err)
	// Output:
	// *: rate=10/s concurrency=2
	// acme: rate=100/s burst=20 rate=5000/h quota=10000/day tz=America/Los_Angeles
	// policy file line 3, "acme": concurrency=0: must be a whole number of at least 1
}

func ExampleLimiter_Learn() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=100/s burst=5")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	// The downstream answered with RateLimit-Policy: "default";q=40;w=1:
	// the whole fleet holds acme to 40/s until the limit lapses.
	out, err := lim.Learn(ctx, "acme", throttle.LearnedLimit{Limit: 40, Window: time.Second, Source: "RateLimit-Policy"})
	if err != nil {
		log.Fatal(err)
	}
	// The limit is one more rate rule of acme's; its policy is unchanged.
	st, _ := lim.Stats(ctx, "acme")
	fmt.Println(out, "|", st.Learned.Rule, st.Rates[1].Rate, "|", st.Rules)

	// Said again, nothing is written; a limit above the policy's clears it.
	out, _ = lim.Learn(ctx, "acme", throttle.LearnedLimit{Limit: 40, Window: time.Second})
	fmt.Println(out)
	out, _ = lim.Learn(ctx, "acme", throttle.LearnedLimit{Limit: 500, Window: time.Second})
	st, _ = lim.Stats(ctx, "acme")
	fmt.Println(out, "|", len(st.Rates), "rate rule |", st.Learned == nil)
	// Output:
	// learned | rate[1] 40/s | rate=100/s burst=5
	// kept
	// cleared | 1 rate rule | true
}

func ExampleLimiter_Adapt() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	// acme starts at 50/s and adapts between 10/s and 200/s.
	policy, err := throttle.ParsePolicy("rate=50/s adapt=10..200/s")
	if err != nil {
		log.Fatal(err)
	}
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}

	// A worker saw 3 answers of 429 among 40 since its last report (the
	// worker's gate reports by itself, at most once per adapt_every): the
	// whole fleet's limit is cut to three quarters.
	c, err := lim.Adapt(ctx, "acme", throttle.AdaptReport{OK: 37, Throttled: 3})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.From, "→", c.To, c.Reason)
	st, _ := lim.Stats(ctx, "acme")
	fmt.Println(st.Adaptive.Rule, st.Adaptive.Rate, "|", st.Rates[0].Rate)

	// More 429s in the same interval: cut once, not again.
	c, _ = lim.Adapt(ctx, "acme", throttle.AdaptReport{Throttled: 5, Seq: st.Adaptive.Seq})
	fmt.Printf("%d %q\n", c.To, c.Reason)
	// Output:
	// 50 → 37 throttled
	// rate[0] 37/s | 37/s
	// 37 ""
}

func ExampleLimiter_ExplainLine() {
	client, prefix := redistest.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	lim, err := throttle.NewLimiter(client, &throttle.Config{Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	policy, _ := throttle.ParsePolicy("rate=1/min")
	if err := lim.Policies().Set(ctx, "acme", policy); err != nil {
		log.Fatal(err)
	}
	// Three jobs wait in acme's line (queue.Client puts them there).
	if _, _, err := waitroom.Of(lim).Join(ctx, "acme", 0, waitroom.Waiter{ID: "job-1"}, waitroom.Waiter{ID: "job-2"}, waitroom.Waiter{ID: "job-3", Cost: 2}); err != nil {
		log.Fatal(err)
	}
	xs, err := lim.ExplainLine(ctx, "acme", "", 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, x := range xs {
		fmt.Println(x.ID, x.Ahead, x.HeldBy, x.Expected.Sub(x.Now))
	}
	// Output:
	// job-1 0 turn 0s
	// job-2 1 rate[0] 1m0s
	// job-3 2 rate[0] 3m0s
}
