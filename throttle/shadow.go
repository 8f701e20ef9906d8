package throttle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// Shadow policies: a policy tried on a tenant's jobs as they start, without
// being enforced. Each start of a job of a tenant with a shadow is decided
// by admit.lua, as an ordinary admission, over the tenant's shadow scope
// (its own keys under the tenant's hash tag, shadowKeysFor), at the time the
// job started: charged only when the shadow allows it, no reservation, and a
// shadow concurrency slot held while the job runs (released when it ends,
// renewed here under its own lease, so that a crashed process's slots free
// themselves). The decisions of a process are gathered and sent in one
// pipeline a tick, in the order of their times, off the job's path; the
// verdicts are counted per tenant and rule in Redis (fleet-wide, read by
// Stats) and handed to the caller's counter.

const (
	// shadowTick is how long a process gathers shadow decisions before it
	// sends them together.
	shadowTick = 50 * time.Millisecond
	// shadowMaxPending bounds the decisions waiting to be sent (Redis
	// unreachable for long): past it, starts are not recorded, and the
	// callers are told.
	shadowMaxPending = 100_000
	// shadowRetryFor is how long a decision that could not be sent is
	// tried again.
	shadowRetryFor = 10 * time.Second
	// shadowCountsTTL is how long a shadow's counts outlive its last
	// decision.
	shadowCountsTTL = 7 * 24 * time.Hour
)

// errShadowBacklog is handed to the callers of starts not recorded because
// too many wait to be sent.
var errShadowBacklog = errors.New("shadow decisions: too many wait to be sent (Redis unreachable?); this start is not recorded")

// noShadow is the end of a job whose tenant has no shadow: nothing to do.
func noShadow() {}

// shadow records that job req.ID of req.Tenant started at at (Redis time,
// as Decision.Now gives it; zero: now), for the tenant's shadow policy
// (jobPolicies.Shadow; req.policies, or the cached policies when nil): the
// shadow decides whether it would have let the job start then, as if it
// were enforced, and counts the verdict. Nothing waits for the decision:
// it is sent in the background, with the process's others, within about
// 50 ms; counted, when not nil, is then called with it (or with the error
// that kept it from being made), on a goroutine of the limiter's, and must
// not block. Call the returned end when the job ends: it gives back the
// shadow concurrency slot the job holds. A tenant without a shadow costs
// nothing (the policy cache says so); req.Cost is the job's cost (0: 1),
// req's other options are ignored. shadow is safe for concurrent use; the
// worker's gate calls it, through jobpath.Of, for every job it starts.
func (l *Limiter) shadow(req Request, at time.Time, counted func(Decision, error)) (end func()) {
	res := req.policies
	if res == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := l.policies.policiesFor(ctx, req.Tenant)
		cancel()
		if err != nil {
			if counted != nil {
				counted(Decision{}, fmt.Errorf("shadow of tenant %q: %w", req.Tenant, err))
			}
			return noShadow
		}
		res = &r
	}
	if res.Shadow == nil || req.Tenant == "" {
		return noShadow
	}
	fail := func(err error) func() {
		if counted != nil {
			counted(Decision{}, fmt.Errorf("shadow of tenant %q: %w", req.Tenant, err))
		}
		return noShadow
	}
	if err := validateTenant(req.Tenant); err != nil {
		return fail(err)
	}
	if at.IsZero() {
		at = l.estimatedNow()
	}
	facts := res.shadowFacts
	if facts == nil {
		facts = factsOf(res.Shadow)
	}
	e := &shadowEvent{
		at:      at.UnixMicro(),
		tenant:  req.Tenant,
		id:      req.ID,
		cost:    max(req.Cost, 1),
		sc:      scope{name: res.ShadowName, keys: shadowKeysFor(l.cfg.Prefix, req.Tenant), policy: res.Shadow, facts: facts},
		counted: counted,
	}
	if facts.lease > 0 {
		if req.ID == "" {
			return fail(fmt.Errorf("the shadow %q has a concurrency rule, which needs the job's id to hold a slot", res.ShadowName))
		}
		e.claim, e.lease = newClaim(), facts.lease
	}
	if !l.shadows.add(l, e) || e.claim == 0 {
		return noShadow
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.shadows.add(l, &shadowEvent{at: l.estimatedNow().UnixMicro(), end: true, tenant: e.tenant, id: e.id, sc: e.sc, claim: e.claim})
		})
	}
}

// shadowEvent is a job's start (decided) or end (its shadow slot given
// back), to be sent.
type shadowEvent struct {
	at      int64 // µs, Redis time
	end     bool
	tenant  string
	id      string
	cost    int64
	sc      scope // the shadow scope
	claim   uint64
	lease   time.Duration
	counted func(Decision, error)
	first   time.Time // when it was first tried (zero: not yet)
}

// shadowSlot is a shadow concurrency slot a running job holds.
type shadowSlot struct {
	e    *shadowEvent // its start
	next time.Time    // when its lease is next renewed
}

// shadower gathers a limiter's shadow decisions and sends them; its loop
// runs while there is something to send or a slot to renew.
type shadower struct {
	mu      sync.Mutex
	pending []*shadowEvent
	held    map[uint64]*shadowSlot      // by claim
	counts  map[string]map[string]int64 // counts key -> field -> increment
	firsts  map[string]int64            // counts key -> earliest decision (µs)
	since   time.Time                   // when the oldest of pending (or counts) came
	running bool
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	flushMu sync.Mutex // one flush at a time
}

// add queues e; false when it was not (the limiter is closed, or too much
// waits), and then e's caller has been told.
func (s *shadower) add(l *Limiter, e *shadowEvent) bool {
	s.mu.Lock()
	if s.closed || len(s.pending) >= shadowMaxPending {
		err := errShadowBacklog
		if s.closed {
			err = errClosed
		}
		s.mu.Unlock()
		if e.counted != nil {
			e.counted(Decision{}, err)
		}
		return false
	}
	if len(s.pending) == 0 && len(s.counts) == 0 {
		s.since = time.Now()
	}
	s.pending = append(s.pending, e)
	if s.wake == nil {
		s.wake = make(chan struct{}, 1)
	}
	if !s.running {
		s.running = true
		s.done = make(chan struct{})
		go s.loop(l, s.done)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

func (s *shadower) loop(l *Limiter, done chan struct{}) {
	defer close(done)
	for {
		s.mu.Lock()
		if len(s.pending) == 0 && len(s.held) == 0 && len(s.counts) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		// a tick after the oldest decision waiting, or the first renewal
		var next time.Time
		if len(s.pending) > 0 || len(s.counts) > 0 {
			next = s.since.Add(shadowTick)
		}
		for _, h := range s.held {
			if next.IsZero() || h.next.Before(next) {
				next = h.next
			}
		}
		s.mu.Unlock()
		t := time.NewTimer(time.Until(next))
		select {
		case <-t.C:
		case <-s.wake:
			// something came: look again
			t.Stop()
			continue
		case <-l.closing:
		}
		t.Stop()
		select {
		case <-l.closing:
			s.mu.Lock()
			s.closed = true
			s.mu.Unlock()
			// the last decisions, then their counts
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.flush(ctx, l, true)
			s.flush(ctx, l, true)
			cancel()
			s.mu.Lock()
			s.running = false
			s.pending, s.held, s.counts = nil, nil, nil
			s.mu.Unlock()
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.flush(ctx, l, false)
		cancel()
	}
}

// close waits for the loop to send what waits (the limiter is closing),
// and takes nothing more.
func (s *shadower) close() {
	s.mu.Lock()
	s.closed = true
	done := s.done
	s.mu.Unlock()
	if done != nil {
		<-done
	}
}

// shadowCmd is one command of a flush's pipeline: a script's call, or a
// plain command (do) writing counts to key.
type shadowCmd struct {
	script *redis.Script
	keys   []string
	args   []any
	do     func(redis.Pipeliner) redis.Cmder
	key    string
	cmd    redis.Cmder
	val    any // a script's reply
}

// flush sends what waits, in one pipeline: the renewals due, then the
// starts and ends in the order of their times, then the counts of the
// verdicts the last flush read. last: the limiter is closing; every slot
// renewal is skipped and nothing is tried again.
func (s *shadower) flush(ctx context.Context, l *Limiter, last bool) {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	now := time.Now()
	s.mu.Lock()
	events, counts, firsts := s.pending, s.counts, s.firsts
	s.pending, s.counts, s.firsts = nil, nil, nil
	var renew []*shadowSlot
	for _, h := range s.held {
		if !last && !h.next.After(now.Add(h.e.lease/6)) {
			renew = append(renew, h)
			h.next = now.Add(h.e.lease / 3)
		}
	}
	ended := map[uint64]bool{}
	for _, e := range events {
		if e.end {
			ended[e.claim] = true
			delete(s.held, e.claim)
		}
	}
	s.mu.Unlock()
	sort.SliceStable(events, func(i, j int) bool { return events[i].at < events[j].at })

	noTTL := 0
	if l.noExpire {
		noTTL = 1
	}
	var cmds []*shadowCmd
	for _, h := range renew {
		if ended[h.e.claim] {
			continue
		}
		cmds = append(cmds, &shadowCmd{script: lua.Renew, keys: []string{h.e.sc.keys.state},
			args: []any{l.clockArg(), 1, noTTL, h.e.id, h.e.claim, 1, micros(h.e.lease)}})
	}
	sent := make([]*shadowCmd, len(events)) // each event's command (nil: none)
	for i, e := range events {
		switch {
		case e.end:
			sent[i] = &shadowCmd{script: lua.Release, keys: []string{e.sc.keys.state},
				args: []any{e.at, 1, noTTL, e.id, e.claim, 1, 0}}
		case e.sc.facts.maxCost >= 0 && e.cost > e.sc.facts.maxCost:
			// no rule of the shadow could ever admit it: denied, no call
			continue
		default:
			op := &admitOp{id: e.id, cost: e.cost, flags: flagHold | l.noTTLFlag(), claim: e.claim,
				scopes: []opScope{{scope: e.sc}}}
			keys, aa := l.encode(op, e.at, time.UnixMicro(e.at))
			sent[i] = &shadowCmd{script: lua.Admit, keys: keys, args: aa.flatten()}
		}
		cmds = append(cmds, sent[i])
	}
	countKeys := make([]string, 0, len(counts))
	for key := range counts {
		countKeys = append(countKeys, key)
	}
	sort.Strings(countKeys)
	for _, key := range countKeys {
		for field, n := range counts[key] {
			cmds = append(cmds, &shadowCmd{key: key, do: func(p redis.Pipeliner) redis.Cmder { return p.HIncrBy(ctx, key, field, n) }})
		}
		first := firsts[key]
		cmds = append(cmds,
			&shadowCmd{key: key, do: func(p redis.Pipeliner) redis.Cmder { return p.HSetNX(ctx, key, "f", first) }},
			&shadowCmd{key: key, do: func(p redis.Pipeliner) redis.Cmder { return p.PExpire(ctx, key, shadowCountsTTL) }})
	}
	if len(cmds) > 0 {
		s.exec(ctx, l, cmds)
	}

	// the counts that could not be written go with the next flush
	var failedCounts []string
	for _, c := range cmds {
		if c.script == nil && c.cmd.Err() != nil {
			failedCounts = append(failedCounts, c.key)
		}
	}
	var retry []*shadowEvent
	type verdict struct {
		e   *shadowEvent
		d   Decision
		err error
	}
	var verdicts []verdict
	s.mu.Lock()
	if s.held == nil {
		s.held = map[uint64]*shadowSlot{}
	}
	for _, key := range failedCounts {
		if c := counts[key]; c != nil {
			s.addCounts(key, c, firsts[key])
			delete(counts, key)
		}
	}
	retried := map[uint64]bool{} // starts tried again: their ends follow them
	for i, e := range events {
		c := sent[i]
		if e.end && retried[e.claim] {
			retry = append(retry, e)
			continue
		}
		if c != nil && c.cmd.Err() != nil {
			if !last && shouldRetry(c.cmd.Err()) && (e.first.IsZero() || now.Sub(e.first) < shadowRetryFor) {
				if e.first.IsZero() {
					e.first = now
				}
				retry = append(retry, e)
				if !e.end && e.claim != 0 {
					retried[e.claim] = true
				}
				continue
			}
			if !e.end {
				verdicts = append(verdicts, verdict{e: e, err: fmt.Errorf("shadow of tenant %q: %w", e.tenant, c.cmd.Err())})
			}
			continue
		}
		if e.end {
			continue
		}
		var d Decision
		if c == nil {
			d = Decision{RetryAfter: -1, Rule: "cost", Policy: e.sc.name, Remaining: -1, ResetAfter: -1, InFlight: -1, Now: time.UnixMicro(e.at)}
		} else {
			r, err := decodeAdmit(c.val)
			if err != nil {
				verdicts = append(verdicts, verdict{e: e, err: fmt.Errorf("shadow of tenant %q: %w", e.tenant, err)})
				continue
			}
			d = r.decision([]opScope{{scope: e.sc}})
		}
		if d.Allowed && e.claim != 0 && !ended[e.claim] {
			s.held[e.claim] = &shadowSlot{e: e, next: now.Add(e.lease / 3)}
		}
		key := shadowCountsKey(l.cfg.Prefix, e.tenant, e.sc.facts.fp)
		inc := map[string]int64{"n": 1}
		if d.Allowed {
			inc["a"] = 1
		} else {
			inc["d:"+d.Rule] = 1
			if d.RetryAfter > 0 {
				inc["r"] = micros(d.RetryAfter)
			}
		}
		s.addCounts(key, inc, e.at)
		verdicts = append(verdicts, verdict{e: e, d: d})
	}
	// what failed goes first next time: it happened before what came since
	s.pending = append(retry, s.pending...)
	if len(s.pending) > 0 || len(s.counts) > 0 {
		s.since = now
	}
	s.mu.Unlock()
	for _, v := range verdicts {
		if v.e.counted != nil {
			v.e.counted(v.d, v.err)
		}
	}
}

// addCounts adds inc to the counts to write to key; at is a decision's
// time (µs). Called with s.mu held.
func (s *shadower) addCounts(key string, inc map[string]int64, at int64) {
	if s.counts == nil {
		s.counts, s.firsts = map[string]map[string]int64{}, map[string]int64{}
	}
	c := s.counts[key]
	if c == nil {
		c = map[string]int64{}
		s.counts[key] = c
		s.firsts[key] = at
	}
	for f, n := range inc {
		c[f] += n
	}
	s.firsts[key] = min(s.firsts[key], at)
}

// shouldRetry reports whether a command's error may pass (Redis could not
// be reached, or answered that it is busy or loading) rather than being an
// answer that a retry would repeat.
func shouldRetry(err error) bool {
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "LOADING") || strings.HasPrefix(msg, "BUSY") ||
			strings.HasPrefix(msg, "TRYAGAIN") || strings.HasPrefix(msg, "CLUSTERDOWN") ||
			strings.HasPrefix(msg, "MASTERDOWN") || strings.HasPrefix(msg, "READONLY")
	}
	return true
}

// exec runs cmds in one pipeline; the script calls Redis answered NOSCRIPT
// (a restart, a failover or a flush lost the scripts) run again with EVAL,
// in order, in a second one.
func (s *shadower) exec(ctx context.Context, l *Limiter, cmds []*shadowCmd) {
	run := func(cmds []*shadowCmd, eval bool) {
		pipe := l.client.Pipeline()
		for _, c := range cmds {
			switch {
			case c.script == nil:
				c.cmd = c.do(pipe)
			case eval:
				c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
			default:
				c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		for _, c := range cmds {
			if sc, ok := c.cmd.(*redis.Cmd); ok && c.script != nil {
				c.val = sc.Val()
			}
		}
	}
	run(cmds, false)
	var again []*shadowCmd
	for _, c := range cmds {
		if c.script != nil && isNoScript(c.cmd.Err()) {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		run(again, true)
	}
}

// ShadowStats is what a tenant's shadow policy would have done to its jobs
// as they started (the worker's gate records every start), counted by the
// whole fleet since the shadow was set as it is now: a changed shadow
// counts afresh.
type ShadowStats struct {
	// Name is the name the shadow is stored under: ShadowPrefix and the
	// tenant, or "*".
	Name   string
	Policy *Policy
	// Decisions counts the starts decided, Denied those the shadow would
	// have held back (a job it would have let start later counts too), by
	// the rule that denied them in DeniedBy (a decision's Rule: rate[0],
	// window, quota, concurrency, cost).
	Decisions, Denied int64
	DeniedBy          map[string]int64
	// RetryAfter is the sum of the waits the denials would have imposed.
	RetryAfter time.Duration
	// Since is the time of the first decision counted; zero when none is.
	Since time.Time
}

// shadowStats reads the counts of tenant's shadow p, stored as name.
func (l *Limiter) shadowStats(ctx context.Context, tenant, name string, p *Policy, fp uint32) (*ShadowStats, error) {
	raw, err := l.client.HGetAll(ctx, shadowCountsKey(l.cfg.Prefix, tenant, fp)).Result()
	if err != nil {
		return nil, fmt.Errorf("shadow stats of tenant %q: %w", tenant, err)
	}
	st := &ShadowStats{Name: name, Policy: p, DeniedBy: map[string]int64{}}
	for f, v := range raw {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch {
		case f == "n":
			st.Decisions = n
		case f == "r":
			st.RetryAfter = time.Duration(n) * time.Microsecond
		case f == "f":
			st.Since = time.UnixMicro(n)
		case strings.HasPrefix(f, "d:"):
			st.DeniedBy[f[2:]] += n
			st.Denied += n
		}
	}
	return st, nil
}
