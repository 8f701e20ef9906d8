package throttle

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/lua"
)

// Stats is a snapshot of one tenant's throttle state, read in one round
// trip at Redis time Now.
type Stats struct {
	Tenant string
	// Policy is the name of the policy that applies: the tenant, "*" or
	// "@global"; empty when none does.
	Policy string
	Rules  *Policy
	Now    time.Time

	Rates       []RateStats
	Window      *WindowStats
	Quota       *QuotaStats
	Concurrency *ConcurrencyStats

	// Reservations is the number of jobs holding a future slot, the first
	// and last of which are FirstSlot and LastSlot.
	Reservations        int64
	FirstSlot, LastSlot time.Time
	// CooldownUntil is when the tenant's cooldown ends; zero when none.
	CooldownUntil time.Time
	// Learned is the limit learned from the tenant's downstream, nil when
	// none is in place. Rules is the policy as stored; Rates includes the
	// learned limit's rule (Learned.Rule) when it is applied.
	Learned *LearnedLimit
	// Adaptive is the state of the policy's adaptive rule with its last
	// changes, nil when the policy has none. Rates holds the rule at its
	// current limit; Rules the policy as stored.
	Adaptive *AdaptiveLimit
	// Waiting is how many of the tenant's jobs wait in its line in the
	// waiting room, and WaitingSince when the one at its head joined it
	// (zero when none waits).
	Waiting      int64
	WaitingSince time.Time
	// Started counts the tenant's jobs started while its state has been
	// alive (it starts again from 0 once the tenant has been idle); the
	// difference between two snapshots gives starts per second.
	Started int64
	// Shadow is what the tenant's shadow policy would have done to its
	// jobs as the workers started them, nil when it has none.
	Shadow *ShadowStats
	// Leftovers counts the charges a two-step admission on Redis Cluster
	// could not take back exactly, because another process admitted a job
	// of the tenant in the same moment: each left a started rate meter at
	// most one interval ahead (it passes as time does). Always 0 on a
	// single server. Like Started, it counts while the state is alive.
	Leftovers int64
	// Refunded and Extra count the cost settled after jobs ran
	// (Limiter.Settle): given back by jobs cheaper than their estimate,
	// and charged for jobs dearer. Like Started, they count while the
	// state is alive.
	Refunded, Extra int64
}

// Stats reads tenant's state (use GlobalPolicy for @global's, and a shared
// pool's name, "@openai", for the pool's).
func (l *Limiter) Stats(ctx context.Context, tenant string) (*Stats, error) {
	var p, stored *Policy
	var learned *LearnedLimit
	var shadow resolved
	var adaptive bool
	name := ""
	if tenant == GlobalPolicy {
		r, err := l.policies.resolve(ctx, "")
		if err != nil {
			return nil, err
		}
		if r.global != nil {
			p, name = r.global, GlobalPolicy
		}
	} else if strings.HasPrefix(tenant, "@") && !strings.HasPrefix(tenant, ShadowPrefix) {
		if err := validatePool(tenant); err != nil {
			return nil, err
		}
		c, err := l.policies.pool(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if c.policy != nil {
			p, name = c.policy, tenant
		}
	} else if t, key, ok := keyOf(tenant); ok {
		// a key below a tenant ("acme/user-42"): its scope's state under
		// the policy that applies to it
		if err := validateTenant(t); err != nil {
			return nil, err
		}
		if err := validateKey(key); err != nil {
			return nil, err
		}
		kname, c, err := l.policies.keyPolicy(ctx, t, key)
		if err != nil {
			return nil, err
		}
		if c.policy != nil {
			p, name = c.policy, kname
		}
	} else {
		if err := validateTenant(tenant); err != nil {
			return nil, err
		}
		r, err := l.policies.resolve(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if r.tenant != nil {
			p, name, stored, learned, adaptive = r.tenant, r.tenantName, r.stored, r.learned, r.adaptive != nil
		}
		shadow = r
	}
	if p == nil {
		p = &Policy{}
	}
	k := keysFor(l.cfg.Prefix, tenant)
	var wdur int64
	if p.Window != nil {
		wdur = micros(p.Window.Period)
	}
	keys := []string{k.state, k.planned, k.started}
	if _, _, isKey := keyOf(tenant); tenant != GlobalPolicy && !isPool(tenant) && !isKey {
		qs, err := l.room().queuesOf(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, q := range qs {
			keys = append(keys, k.lines(q)...)
		}
	}
	res, err := l.batch.run(ctx, lua.Stats, keys, []any{l.clockArg(), wdur, micros(l.cfg.Grace)})
	if err != nil {
		return nil, fmt.Errorf("stats of tenant %q: %w", tenant, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 11 {
		return nil, fmt.Errorf("stats.lua: unexpected reply %v", res)
	}
	ints := make([]int64, 11)
	for _, i := range []int{0, 2, 3, 4, 5, 6, 7, 8, 10} {
		v, ok := arr[i].(int64)
		if !ok {
			return nil, fmt.Errorf("stats.lua: unexpected element %d: %v", i, arr[i])
		}
		ints[i] = v
	}
	hash := map[string]int64{}
	if flat, ok := arr[1].([]any); ok {
		for i := 0; i+1 < len(flat); i += 2 {
			f, _ := flat[i].(string)
			v, _ := flat[i+1].(string)
			n, _ := strconv.ParseInt(v, 10, 64)
			hash[f] = n
		}
	}
	raw := &rawStats{now: ints[0], hash: hash, windowPlanned: ints[2], windowStarted: ints[3], live: ints[7]}
	if flat, ok := arr[9].([]any); ok {
		for i := 0; i+1 < len(flat); i += 2 {
			id, _ := flat[i].(string)
			us, _ := flat[i+1].(int64)
			raw.holders = append(raw.holders, Holder{ID: id, LeaseEnd: time.UnixMicro(us)})
		}
	}
	sort.Slice(raw.holders, func(i, j int) bool { return raw.holders[i].LeaseEnd.Before(raw.holders[j].LeaseEnd) })
	s := &Stats{Tenant: tenant, Policy: name, Rules: p, Now: time.UnixMicro(raw.now), Reservations: ints[4], Waiting: ints[8]}
	if name == "" {
		s.Rules = nil
	}
	if learned != nil {
		s.Rules, s.Learned = stored, learned
		if name == tenant && stored == nil {
			s.Policy = "" // no policy of its own: the learned limit alone
		}
	}
	if adaptive {
		// the rule at its limit read now (the cache may be a moment old)
		if s.Adaptive, err = l.adaptive(ctx, tenant, stored); err != nil {
			return nil, err
		}
		pp := *stored
		pp.Rates = slices.Clone(stored.Rates)
		pp.Rates[stored.adaptIndex()] = s.Adaptive.Rate
		if learned != nil && learned.Rule != "" {
			pp.Rates = append(pp.Rates, learned.Rate())
		}
		p, s.Rules = &pp, stored
	}
	if ints[10] > 0 {
		s.WaitingSince = time.UnixMilli(ints[10])
	}
	if ints[5] > 0 {
		s.FirstSlot, s.LastSlot = time.UnixMicro(ints[5]), time.UnixMicro(ints[6])
	}
	s.Started, s.Leftovers = hash["s"], hash["u"]
	s.Refunded, s.Extra = hash["sr"], hash["se"]
	if cd := hash["cd"]; cd > raw.now {
		s.CooldownUntil = time.UnixMicro(cd)
	}
	for _, k := range kinds {
		if k != nil {
			k.stats(p, raw, s)
		}
	}
	if shadow.shadow != nil {
		if s.Shadow, err = l.shadowStats(ctx, tenant, shadow.shadowName, shadow.shadow, shadow.shadowFacts.fp); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// rawStats is a scope's state as stats.lua reads it, from which each rule
// kind fills its part of Stats.
type rawStats struct {
	now                          int64            // Redis time, µs
	hash                         map[string]int64 // the state hash's scalar fields
	windowPlanned, windowStarted int64            // window entries in the last window length
	live                         int64            // running jobs
	holders                      []Holder         // up to 100 of them
}
