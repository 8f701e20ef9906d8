package throttle

import (
	"context"
	"fmt"
	"sort"
	"strconv"
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
	// Backlog is the number of the tenant's queued and deferred jobs, as
	// counted by the queue package.
	Backlog int64
	// Started counts the tenant's jobs started while its state has been
	// alive (it starts again from 0 once the tenant has been idle); the
	// difference between two snapshots gives starts per second.
	Started int64
	// Leftovers counts the charges a two-step admission on Redis Cluster
	// could not take back exactly, because another process admitted a job
	// of the tenant in the same moment: each left a started rate meter at
	// most one interval ahead (it passes as time does). Always 0 on a
	// single server. Like Started, it counts while the state is alive.
	Leftovers int64
}

// RateStats is the state of one rate rule.
type RateStats struct {
	Rule string // rate[i]
	Rate Rate
	// Available is how many jobs of cost 1 could start back to back now
	// (at most the burst), by both meters.
	Available int64
	// Ahead is how far the planned meter runs ahead of now: the time it
	// takes to serve the reservations already made. Zero when idle.
	Ahead time.Duration
	// StartedAhead is how far the started meter (actual starts only) runs
	// ahead of now. Zero when idle.
	StartedAhead time.Duration
}

// WindowStats is the state of the sliding window.
type WindowStats struct {
	Window Window
	// Started is how many units started in the last window length.
	Started int64
	// Planned counts started and reserved units from the last window length on.
	Planned int64
}

// QuotaStats is the state of the calendar quota.
type QuotaStats struct {
	Quota                  Quota
	Used                   int64
	WindowStart, WindowEnd time.Time
	ReservedInNextWindow   int64
	Remaining              int64
}

// ConcurrencyStats is the state of the concurrency rule.
type ConcurrencyStats struct {
	Concurrency Concurrency
	InFlight    int64
	// Holders lists up to 100 running jobs and when their leases end.
	Holders []Holder
}

// Holder is a job holding a concurrency slot.
type Holder struct {
	ID       string
	LeaseEnd time.Time
}

// Stats reads tenant's state (use GlobalPolicy for @global's).
func (l *Limiter) Stats(ctx context.Context, tenant string) (*Stats, error) {
	var p *Policy
	name := ""
	if tenant == GlobalPolicy {
		r, err := l.policies.resolve(ctx, "")
		if err != nil {
			return nil, err
		}
		if r.global != nil {
			p, name = r.global, GlobalPolicy
		}
	} else {
		if err := ValidateTenant(tenant); err != nil {
			return nil, err
		}
		r, err := l.policies.resolve(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if r.tenant != nil {
			p, name = r.tenant, r.tenantName
		}
	}
	if p == nil {
		p = &Policy{}
	}
	k := keysFor(l.cfg.Prefix, tenant)
	var wdur int64
	if p.Window != nil {
		wdur = micros(p.Window.Period)
	}
	res, err := l.batch.run(ctx, lua.Stats, []string{k.state, k.planned, k.started, k.backlog},
		[]any{l.clockArg(), wdur, micros(l.cfg.Grace)})
	if err != nil {
		return nil, fmt.Errorf("stats of tenant %q: %w", tenant, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 10 {
		return nil, fmt.Errorf("stats.lua: unexpected reply %v", res)
	}
	ints := make([]int64, 10)
	for _, i := range []int{0, 2, 3, 4, 5, 6, 7, 8} {
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
	now := ints[0]
	s := &Stats{Tenant: tenant, Policy: name, Rules: p, Now: time.UnixMicro(now), Reservations: ints[4], Backlog: ints[8]}
	if name == "" {
		s.Rules = nil
	}
	if ints[5] > 0 {
		s.FirstSlot, s.LastSlot = time.UnixMicro(ints[5]), time.UnixMicro(ints[6])
	}
	s.Started, s.Leftovers = hash["s"], hash["u"]
	if cd := hash["cd"]; cd > now {
		s.CooldownUntil = time.UnixMicro(cd)
	}
	for i, r := range p.Rates {
		_, unit, off := rateArgs(r, 1)
		planned := hash["p"+strconv.Itoa(i+1)]
		started, ok := hash["a"+strconv.Itoa(i+1)]
		if !ok {
			started = planned // not stored while equal
		}
		tat := max(planned, started, now)
		s.Rates = append(s.Rates, RateStats{
			Rule:         fmt.Sprintf("rate[%d]", i),
			Rate:         r,
			Available:    max((now+off-tat)/unit, 0),
			Ahead:        time.Duration(max(planned, now)-now) * time.Microsecond,
			StartedAhead: time.Duration(max(started, now)-now) * time.Microsecond,
		})
	}
	if p.Window != nil {
		s.Window = &WindowStats{Window: *p.Window, Started: ints[3], Planned: ints[2]}
	}
	if q := p.Quota; q != nil {
		start, end := q.WindowAt(s.Now)
		qs := &QuotaStats{Quota: *q, WindowStart: start, WindowEnd: end}
		for _, slot := range [][2]string{{"qa", "qc"}, {"qb", "qd"}} {
			switch hash[slot[0]] {
			case start.UnixMicro():
				qs.Used = hash[slot[1]]
			case end.UnixMicro():
				qs.ReservedInNextWindow = hash[slot[1]]
			}
		}
		qs.Remaining = max(q.Limit-qs.Used, 0)
		s.Quota = qs
	}
	if c := p.Concurrency; c != nil {
		cs := &ConcurrencyStats{Concurrency: *c, InFlight: ints[7]}
		if flat, ok := arr[9].([]any); ok {
			for i := 0; i+1 < len(flat); i += 2 {
				id, _ := flat[i].(string)
				v, _ := flat[i+1].(string)
				us, _ := strconv.ParseFloat(v, 64)
				cs.Holders = append(cs.Holders, Holder{ID: id, LeaseEnd: time.UnixMicro(int64(us))})
			}
		}
		sort.Slice(cs.Holders, func(i, j int) bool { return cs.Holders[i].LeaseEnd.Before(cs.Holders[j].LeaseEnd) })
		s.Concurrency = cs
	}
	return s, nil
}
