package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/jobpath"
	"github.com/sluicehq/sluice/throttle"
)

// The renewal of running jobs' concurrency leases, coalesced: one loop per
// gate renews every job whose lease is due, together (the limiter merges
// the concurrent renewals into one script run), so that a process running
// many jobs makes about one call per tick, not one per job. The loop runs
// only while jobs hold leases.

// held is one running job's lease.
type held struct {
	j     *job
	lease time.Duration
	claim uint64
	next  time.Time // when its lease is next renewed
	lost  bool      // logged once
}

type renewer struct {
	g       *Gate
	mu      sync.Mutex
	jobs    map[*held]struct{}
	running bool
	wake    chan struct{}
	done    chan struct{} // closed when the loop exits
}

// renew renews the job's lease, held under claim, every lease/3 until the
// returned function is called.
func (g *Gate) renew(j *job, lease time.Duration, claim uint64) func() {
	r := &g.renewals
	h := &held{j: j, lease: lease, claim: claim, next: time.Now().Add(lease / 3)}
	r.mu.Lock()
	if r.jobs == nil {
		r.g, r.jobs, r.wake = g, map[*held]struct{}{}, make(chan struct{}, 1)
	}
	r.jobs[h] = struct{}{}
	if !r.running {
		r.running = true
		r.done = make(chan struct{})
		go r.loop(r.done)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return func() {
		r.mu.Lock()
		delete(r.jobs, h)
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// wait returns once the renewal loop has exited (no job holds a lease).
func (r *renewer) wait() {
	r.mu.Lock()
	done := r.done
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (r *renewer) loop(done chan struct{}) {
	defer close(done)
	for {
		r.mu.Lock()
		if len(r.jobs) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		// the earliest renewal due, and the jobs due within a sixth of the
		// shortest lease of it, renewed together
		var first time.Time
		shortest := time.Duration(0)
		for h := range r.jobs {
			if first.IsZero() || h.next.Before(first) {
				first = h.next
			}
			if shortest == 0 || h.lease < shortest {
				shortest = h.lease
			}
		}
		r.mu.Unlock()
		if wait := time.Until(first); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-r.wake:
				// a job began (or the last one ended): look again
				t.Stop()
				continue
			}
		}
		now := time.Now()
		var due []*held
		r.mu.Lock()
		for h := range r.jobs {
			if !h.next.After(now.Add(shortest / 6)) {
				due = append(due, h)
				h.next = now.Add(h.lease / 3)
			}
		}
		r.mu.Unlock()
		if len(due) > 0 {
			r.renewAll(due, shortest)
		}
	}
}

// renewAll renews the jobs' leases in one round trip.
func (r *renewer) renewAll(due []*held, shortest time.Duration) {
	g := r.g
	jobs := make([]jobpath.Held, len(due))
	for i, h := range due {
		jobs[i] = jobpath.Held{Tenant: h.j.tenant, ID: h.j.id, Claim: h.claim, Pools: h.j.pools, Key: h.j.key}
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(g.cfg.CallTimeout, shortest/3))
	errs := g.path.RenewAll(ctx, jobs)
	cancel()
	for i, h := range due {
		r.counted(h, errs[i])
	}
}

// counted counts a renewal's result, and logs a lost lease once per job.
func (r *renewer) counted(h *held, err error) {
	g, j := r.g, h.j
	switch {
	case errors.Is(err, throttle.ErrClaimLost):
		g.m.renewals.WithLabelValues(renewLost).Inc()
		r.mu.Lock()
		first := !h.lost
		h.lost = true
		r.mu.Unlock()
		if first {
			g.log.Warn("running job lost its concurrency slot", "task", j.taskID, "tenant", j.tenant, "lease", h.lease)
		}
	case err != nil:
		g.m.renewals.WithLabelValues(renewError).Inc()
	default:
		g.m.renewals.WithLabelValues(renewOK).Inc()
	}
}
