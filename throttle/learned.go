package throttle

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Learned limits: a limit the downstream declared for a tenant (a
// RateLimit-Policy of 40 per second when the tenant's policy allows 100/s)
// lowers the tenant's effective policy, fleet-wide, until it lapses. It is
// an overlay on the policy, not a policy change: it lives under the
// tenant's hash tag (PREFIX:{t:TENANT}:d, expiring when it lapses), is read
// with the tenant's policy into the PolicyStore's cache, and is merged
// into the policy when the policy is resolved, as one more rate rule
// (N per W, burst 1). It never raises a limit: a declared limit that is not
// below the policy's is not applied, and a policy with learn=false
// (Policy.NoLearn) is pinned. A change reaches every process's cache
// through the store's channel, or its poll when a message is lost, as a
// policy change does, but it drops only that tenant's cached entry.

// LearnHoldDefault is the shortest time a learned limit holds: a limit
// declared over a shorter window (40 per second) still holds this long,
// and each response that declares it again extends it once half of it
// has passed, so a fleet that keeps hearing it writes it about twice a
// hold, not once a response.
const LearnHoldDefault = time.Minute

// LearnHoldMax is the longest a learned limit holds past the last answer
// that declared it, however long its window: a downstream that stops
// saying it (or said something odd, w=31536000) is not believed for ever.
const LearnHoldMax = 24 * time.Hour

// learnHold is how long a limit declared over window holds.
func learnHold(window time.Duration) time.Duration {
	return min(max(window, LearnHoldDefault), LearnHoldMax)
}

// LearnedLimit is a limit a downstream declared for a tenant: Limit
// requests per Window, from Learned until Until.
type LearnedLimit struct {
	Limit  int64
	Window time.Duration
	// Learned is when the response was read; Until when the limit lapses
	// (as of the process that read it from Redis: its own clock plus the
	// key's remaining time to live).
	Learned, Until time.Time
	// Source is the header that declared it (RateLimit-Policy, ...), and
	// From the response it came in ("200 from GET api.example.com/v1/send,
	// task 5c1f…").
	Source, From string
	// Rule is the rule it became in the tenant's effective policy
	// ("rate[1]"), empty when it is not applied; then Note says why.
	Rule, Note string
}

// Rate is the rule a learned limit adds to its tenant's policy: Limit per
// Window, burst 1 (evenly spaced; a downstream that counts strictly is
// never asked for more than it declared in any window).
func (l LearnedLimit) Rate() Rate { return Rate{Limit: l.Limit, Period: l.Window, Burst: 1} }

// String describes the learned limit in one line.
func (l LearnedLimit) String() string {
	s := fmt.Sprintf("%d per %s (%s)", l.Limit, formatDuration(l.Window), l.Rate())
	if !l.Until.IsZero() {
		s += " until " + l.Until.UTC().Format(time.RFC3339)
	}
	if l.Source != "" || l.From != "" {
		s += ", from " + strings.TrimSpace(l.Source+" of "+l.From)
	}
	switch {
	case l.Rule != "":
		s += ", applied as " + l.Rule
	case l.Note != "":
		s += ", not applied: " + l.Note
	}
	return s
}

// LearnOutcome says what Learn did.
type LearnOutcome string

// What Learn did with a declared limit.
const (
	// LearnStored: the limit was stored; the fleet follows it.
	LearnStored LearnOutcome = "learned"
	// LearnKept: the same limit is in place and far from lapsing.
	LearnKept LearnOutcome = "kept"
	// LearnCleared: the limit is not below the policy's any more; the
	// limit learned before was removed.
	LearnCleared LearnOutcome = "cleared"
	// LearnNotLower: the limit is not below the policy's; nothing to do.
	LearnNotLower LearnOutcome = "not_lower"
	// LearnPinned: the tenant's policy says learn=false.
	LearnPinned LearnOutcome = "pinned"
)

// learnedJSON is a learned limit as stored.
type learnedJSON struct {
	Limit    int64     `json:"limit"`
	WindowUS int64     `json:"window_us"`
	Learned  time.Time `json:"learned"`
	Until    time.Time `json:"until"`
	Source   string    `json:"source,omitempty"`
	From     string    `json:"from,omitempty"`
}

// Learn records that the downstream of tenant declared l: when it is below
// the rate of the tenant's policy (its own or the default), the whole
// fleet follows it until l.Until (zero: now plus the longer of l.Window
// and LearnHoldDefault, at most LearnHoldMax). A limit not below the
// policy's clears one learned before (the downstream raised it). The
// tenant's policy is read from the cache, and nothing is written when the
// same limit is in place for more than half its hold, so a handler may
// call it for every response.
func (l *Limiter) Learn(ctx context.Context, tenant string, ll LearnedLimit) (LearnOutcome, error) {
	if err := validateTenant(tenant); err != nil {
		return "", err
	}
	if err := ll.Rate().validate("learned limit"); err != nil {
		return "", fmt.Errorf("learn a limit for tenant %q: %w", tenant, err)
	}
	now := time.Now()
	hold := learnHold(ll.Window)
	if ll.Learned.IsZero() {
		ll.Learned = now
	}
	if ll.Until.IsZero() {
		ll.Until = now.Add(hold)
	}
	ttl := ll.Until.Sub(now)
	if ttl < time.Millisecond {
		return "", fmt.Errorf("learn a limit for tenant %q: it lapses at %s, already past", tenant, ll.Until.UTC().Format(time.RFC3339Nano))
	}
	r, err := l.policies.resolve(ctx, tenant)
	if err != nil {
		return "", fmt.Errorf("learn a limit for tenant %q: %w", tenant, err)
	}
	switch {
	case r.stored != nil && r.stored.NoLearn:
		return LearnPinned, nil
	case !lowers(r.stored, ll):
		if r.learned == nil {
			return LearnNotLower, nil
		}
		if _, err := l.Forget(ctx, tenant); err != nil {
			return "", err
		}
		return LearnCleared, nil
	case r.learned != nil && r.learned.Limit == ll.Limit && r.learned.Window == ll.Window &&
		r.learned.Until.Sub(now) > min(ttl, hold)/2:
		return LearnKept, nil
	}
	raw, err := json.Marshal(learnedJSON{Limit: ll.Limit, WindowUS: micros(ll.Window), Learned: ll.Learned.UTC(), Until: ll.Until.UTC(), Source: ll.Source, From: ll.From})
	if err != nil {
		return "", err
	}
	k := keysFor(l.cfg.Prefix, tenant)
	if err := l.policies.changeLearned(ctx, tenant, func(pipe redis.Pipeliner) {
		pipe.Set(ctx, k.learned, raw, ttl)
	}); err != nil {
		return "", fmt.Errorf("learn a limit for tenant %q: %w", tenant, err)
	}
	return LearnStored, nil
}

// Forget removes the limit learned for tenant, and reports whether there
// was one: the tenant follows its policy again, fleet-wide.
func (l *Limiter) Forget(ctx context.Context, tenant string) (bool, error) {
	if err := validateTenant(tenant); err != nil {
		return false, err
	}
	k := keysFor(l.cfg.Prefix, tenant)
	var del *redis.IntCmd
	if err := l.policies.changeLearned(ctx, tenant, func(pipe redis.Pipeliner) {
		del = pipe.Del(ctx, k.learned)
	}); err != nil {
		return false, fmt.Errorf("forget the learned limit of tenant %q: %w", tenant, err)
	}
	return del.Val() > 0, nil
}

// lowers reports whether ll is below policy p's rate: its interval is
// longer than the slowest rate or window interval of p (any limit is below
// a policy without those).
func lowers(p *Policy, ll LearnedLimit) bool {
	if p != nil {
		p = p.atCeiling() // an adaptive rule may rise to its ceiling
	}
	pace := p.pace()
	return pace == 0 || ll.Rate().Interval() > pace
}

// mergeLearned is base with ll applied, and ll with Rule or Note set.
func mergeLearned(base *Policy, ll LearnedLimit) (*Policy, *LearnedLimit) {
	switch {
	case base != nil && base.NoLearn:
		ll.Note = "pinned: the policy says learn=false"
		return base, &ll
	case !lowers(base, ll):
		ll.Note = "not below the policy's rate"
		return base, &ll
	case base != nil && len(base.Rates) >= MaxRates:
		ll.Note = fmt.Sprintf("the policy has %d rate rules already, the most a policy may have", MaxRates)
		return base, &ll
	}
	p := &Policy{}
	if base != nil {
		cp := *base
		p = &cp
	}
	p.Rates = append(slices.Clone(p.Rates), ll.Rate())
	ll.Rule = fmt.Sprintf("rate[%d]", len(p.Rates)-1)
	return p, &ll
}

// learnedEntry is what a tenant's downstream taught the fleet, as cached
// beside its policy: its learned limit (ll nil: none) and its adaptive
// rule's state (ad nil: none, or not begun), with the policy it was last
// merged into.
type learnedEntry struct {
	ll    *LearnedLimit
	until time.Time // local time ll lapses; zero when none
	ad    *adaptState
	memo  atomic.Pointer[learnedMemo]
}

type learnedMemo struct {
	base, merged *Policy
	facts        *policyFacts
	ll           *LearnedLimit
	al           *AdaptiveLimit
}

func (e *learnedEntry) lapsed(now time.Time) bool {
	return e != nil && ((e.ll != nil && !now.Before(e.until)) || (e.ad != nil && !now.Before(e.ad.until)))
}

// apply merges the entry into base (the tenant's policy), once per base:
// the adaptive rule at its current limit, then the learned limit as one
// more rule (a declared limit below the adapted one still holds).
func (e *learnedEntry) apply(base *Policy, baseFacts *policyFacts) (*Policy, *policyFacts, *LearnedLimit, *AdaptiveLimit) {
	if m := e.memo.Load(); m != nil && m.base == base {
		return m.merged, m.facts, m.ll, m.al
	}
	merged, al := mergeAdapt(base, e.ad)
	var ll *LearnedLimit
	if e.ll != nil {
		merged, ll = mergeLearned(merged, *e.ll)
	}
	facts := baseFacts
	if merged != base {
		facts = factsOf(merged)
	}
	e.memo.Store(&learnedMemo{base: base, merged: merged, facts: facts, ll: ll, al: al})
	return merged, facts, ll, al
}

// decodeLearned reads a stored learned limit whose key lives ttl more.
func decodeLearned(raw string, ttl time.Duration, now time.Time) (*learnedEntry, error) {
	var j learnedJSON
	if err := json.Unmarshal([]byte(raw), &j); err != nil {
		return nil, fmt.Errorf("learned limit is not valid JSON (%v)", err)
	}
	ll := &LearnedLimit{Limit: j.Limit, Window: time.Duration(j.WindowUS) * time.Microsecond, Learned: j.Learned, Until: now.Add(ttl), Source: j.Source, From: j.From}
	if err := ll.Rate().validate("learned limit"); err != nil {
		return nil, err
	}
	return &learnedEntry{ll: ll, until: ll.Until}, nil
}

// readLearned adds to pipe the reads of tenant's learned limit and
// adaptive state; the function it returns decodes them once the pipeline
// ran. What cannot be read counts as none (it lapses by itself).
func (s *PolicyStore) readLearned(ctx context.Context, pipe redis.Pipeliner, tenant string) func(now time.Time) *learnedEntry {
	k := keysFor(s.prefix, tenant)
	get := pipe.Get(ctx, k.learned)
	ttl := pipe.PTTL(ctx, k.learned)
	adapt := readAdapt(ctx, pipe, k.adapt)
	return func(now time.Time) *learnedEntry {
		ad := adapt(now)
		raw, err := get.Result()
		d, terr := ttl.Result()
		if err != nil || terr != nil || d <= 0 {
			return &learnedEntry{ad: ad}
		}
		e, err := decodeLearned(raw, d, now)
		if err != nil {
			return &learnedEntry{ad: ad}
		}
		e.ad = ad
		return e
	}
}

// changeLearned runs write (a change of tenant's learned limit), then
// announces it (announceTenant).
func (s *PolicyStore) changeLearned(ctx context.Context, tenant string, write func(redis.Pipeliner)) error {
	if _, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		write(pipe)
		return nil
	}); err != nil {
		return err
	}
	return s.announceTenant(ctx, tenant)
}

// announceTenant bumps the learned version and announces that what
// tenant's downstream taught changed (a learned limit, an adaptive
// limit): every process drops its cached entry of tenant.
func (s *PolicyStore) announceTenant(ctx context.Context, tenant string) error {
	version, err := s.client.Incr(ctx, learnedVersionKey(s.prefix)).Result()
	s.invalidateTenant(tenant)
	if err != nil {
		return err
	}
	return s.client.Publish(ctx, policiesChannel(s.prefix), learnedMessage(version, tenant)).Err()
}

const learnedPrefix = "learned "

func learnedMessage(version int64, tenant string) string {
	return learnedPrefix + strconv.FormatInt(version, 10) + " " + tenant
}

// parseLearnedMessage reads a learned limit's announcement.
func parseLearnedMessage(msg string) (int64, string, bool) {
	rest, ok := strings.CutPrefix(msg, learnedPrefix)
	if !ok {
		return 0, "", false
	}
	v, tenant, ok := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		return 0, "", false
	}
	return n, tenant, true
}

// invalidateTenant drops tenant's cached learned limit.
func (s *PolicyStore) invalidateTenant(tenant string) {
	s.mu.Lock()
	delete(s.learned, tenant)
	s.epoch.Add(1)
	s.mu.Unlock()
}

// noteLearned records an announced learned version; checkLearned, at each
// poll, drops the whole cache when the version moved by a change whose
// announcement was lost.
func (s *PolicyStore) noteLearned(version int64) {
	s.mu.Lock()
	if s.heard == nil {
		s.heard = map[int64]bool{}
	}
	if version > s.learnedSeen {
		s.heard[version] = true
	}
	s.mu.Unlock()
}

func (s *PolicyStore) checkLearned(version int64) {
	s.mu.Lock()
	last := s.learnedSeen
	s.learnedSeen = version
	missed := false
	switch {
	case last < 0:
	case version-last > 1000:
		missed = true
	default:
		for v := last + 1; v <= version; v++ {
			if !s.heard[v] {
				missed = true
			}
		}
	}
	for v := range s.heard {
		if v <= version {
			delete(s.heard, v)
		}
	}
	s.mu.Unlock()
	if missed {
		s.invalidate()
	}
}
