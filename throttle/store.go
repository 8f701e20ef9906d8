package throttle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoPolicy is returned by PolicyStore.Get for a name without a policy.
var ErrNoPolicy = errors.New("no policy")

// PolicyStore keeps policies in Redis, where the whole fleet reads them.
//
// Every change bumps a version number and is announced on a pub/sub channel.
// Readers (the Limiter) cache policies and drop the cache when either says
// something changed: a change takes effect fleet-wide as soon as it is
// announced; messages lost while a reader's subscription was down are made
// up for when it is back (the reader reads the version then), and at the
// latest within PollIntervalDefault. Changing a policy never touches a
// tenant's throttle state.
//
// A limiter makes its store (Limiter.Policies) and closes it on Close. A
// PolicyStore is safe for concurrent use.
type PolicyStore struct {
	client redis.UniversalClient
	prefix string
	poll   time.Duration

	mu      sync.RWMutex
	cache   map[string]cachedPolicy
	gen     atomic.Uint64 // bumped on every invalidation
	version atomic.Int64  // last version seen in Redis
	// changes counts the policy changes this store learned of (announced,
	// or seen in the version), not the invalidations of its own start
	changes atomic.Uint64
	// resubscribed counts the times the policy channel's subscription was
	// made again (a new connection), after which the version is read
	resubscribed atomic.Uint64
	// learned are the tenants' learned limits (learned.go), read with
	// their policies; dropped one by one when a learned limit changes.
	learned     map[string]*learnedEntry
	epoch       atomic.Uint64 // bumped on every invalidation, of all or one tenant
	learnedSeen int64         // learned version at the last poll (-1: none yet)
	heard       map[int64]bool

	watchOnce sync.Once
	watching  atomic.Bool
	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
}

type cachedPolicy struct {
	policy *Policy
	facts  *policyFacts
	err    error
	keys   map[string][]string // keyIndexEntry's: the key index
}

// storedPolicy is the JSON held in the policy hash.
type storedPolicy struct {
	Policy  string    `json:"policy"`
	Updated time.Time `json:"updated"`
}

// PollIntervalDefault is how often a PolicyStore checks the version number:
// the safety net under the policy channel, whose messages bring a change
// to every process at once (and which, when its connection is made again,
// makes the store read the version at once).
const PollIntervalDefault = 5 * time.Second

// maxCachedPolicies bounds the cache; past it the cache starts afresh.
const maxCachedPolicies = 200_000

// storeConfig configures a PolicyStore.
type storeConfig struct {
	// Prefix of every key; PrefixDefault ("sluice") when empty.
	Prefix string
	// PollInterval is how often the version number is checked;
	// PollIntervalDefault when zero.
	PollInterval time.Duration
}

// newPolicyStore returns a store over the caller's client.
func newPolicyStore(client redis.UniversalClient, cfg *storeConfig) (*PolicyStore, error) {
	if client == nil {
		return nil, errors.New("throttle: a policy store needs a Redis client")
	}
	var c storeConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.PollInterval == 0 {
		c.PollInterval = PollIntervalDefault
	}
	if err := validatePrefix(c.Prefix); err != nil {
		return nil, err
	}
	if c.PollInterval < 0 {
		return nil, fmt.Errorf("policy store: poll interval %s must be positive", c.PollInterval)
	}
	s := &PolicyStore{
		client:      client,
		prefix:      c.Prefix,
		poll:        c.PollInterval,
		cache:       map[string]cachedPolicy{},
		stop:        make(chan struct{}),
		learned:     map[string]*learnedEntry{},
		learnedSeen: -1,
		done:        make(chan struct{}),
	}
	s.version.Store(-1)
	return s, nil
}

func encodePolicy(p *Policy) (string, error) {
	b, err := json.Marshal(storedPolicy{Policy: p.String(), Updated: time.Now().UTC()})
	return string(b), err
}

func decodePolicy(name, raw string) (*Policy, error) {
	var sp storedPolicy
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		return nil, &StoredPolicyError{Name: name, Err: fmt.Errorf("not valid JSON (%v)", err)}
	}
	p, err := ParsePolicy(sp.Policy)
	if err != nil {
		return nil, &StoredPolicyError{Name: name, Err: fmt.Errorf("not valid (%w)", err)}
	}
	return p, nil
}

// StoredPolicyError is a policy in Redis that cannot be read (only a writer
// that bypasses the PolicyStore can leave one): Redis answers, but the
// tenant's jobs cannot be decided until the policy is set again.
type StoredPolicyError struct {
	Name string
	Err  error
}

func (e *StoredPolicyError) Error() string {
	return fmt.Sprintf("policy %q in Redis is %v; replace it with: sluice policy set %q 'RULES'", e.Name, e.Err, e.Name)
}

func (e *StoredPolicyError) Unwrap() error { return e.Err }

// Set stores the policy of name: a tenant, "*" (the default) or "@global".
func (s *PolicyStore) Set(ctx context.Context, name string, p *Policy) error {
	return s.Apply(ctx, map[string]*Policy{name: p}, false)
}

// Apply stores every policy of the map at once: either all are stored or
// none is. With prune, policies not in the map are deleted. A policy stored
// exactly as given is left as it is (its updated time too); when nothing
// changes, readers are not told to drop their caches.
func (s *PolicyStore) Apply(ctx context.Context, policies map[string]*Policy, prune bool) error {
	names := make([]string, 0, len(policies))
	for name := range policies {
		names = append(names, name)
	}
	sort.Strings(names)
	texts := make([]string, len(names))
	for i, name := range names {
		p := policies[name]
		if err := validatePolicyName(name); err != nil {
			return err
		}
		if p == nil {
			return fmt.Errorf("policy %q: nil policy; use Delete to remove one", name)
		}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("policy %q: %w", name, err)
		}
		if of, ok := shadowOf(name); ok && !p.HasRules() {
			return fmt.Errorf("shadow policy %q has no rules: a shadow tries rules (rate, window, quota, concurrency) on %s's jobs; give at least one, or delete the shadow", name, of)
		}
		if err := adaptsGlobal(name, p); err != nil {
			return err
		}
		texts[i] = p.String()
	}
	changed := false
	err := s.changeAtomically(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		var values []any
		if len(names) > 0 {
			stored, err := tx.HMGet(ctx, policiesKey(s.prefix), names...).Result()
			if err != nil {
				return nil, fmt.Errorf("read policies: %w", err)
			}
			for i, name := range names {
				var sp storedPolicy
				if raw, ok := stored[i].(string); ok && json.Unmarshal([]byte(raw), &sp) == nil && sp.Policy == texts[i] {
					continue
				}
				enc, err := encodePolicy(policies[name])
				if err != nil {
					return nil, err
				}
				values = append(values, name, enc)
			}
		}
		var stale []string
		if prune {
			existing, err := tx.HKeys(ctx, policiesKey(s.prefix)).Result()
			if err != nil {
				return nil, fmt.Errorf("list policies: %w", err)
			}
			for _, name := range existing {
				if _, keep := policies[name]; !keep {
					stale = append(stale, name)
				}
			}
		}
		if changed = len(values) > 0 || len(stale) > 0; !changed {
			return nil, nil
		}
		return func(pipe redis.Pipeliner) {
			if len(stale) > 0 {
				pipe.HDel(ctx, policiesKey(s.prefix), stale...)
			}
			if len(values) > 0 {
				pipe.HSet(ctx, policiesKey(s.prefix), values...)
			}
		}, nil
	})
	if err != nil {
		return fmt.Errorf("store policies: %w", err)
	}
	if changed {
		s.announce(ctx)
	}
	return nil
}

// changeAtomically runs read under WATCH of the policy hash; the writes it
// returns (nil: none) run in one transaction with the version's bump, and
// the whole is tried again when another writer changed the hash meanwhile.
func (s *PolicyStore) changeAtomically(ctx context.Context, read func(tx *redis.Tx) (func(redis.Pipeliner), error)) error {
	for attempt := 0; ; attempt++ {
		err := s.client.Watch(ctx, func(tx *redis.Tx) error {
			write, err := read(tx)
			if err != nil || write == nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				write(pipe)
				pipe.Incr(ctx, policiesVersionKey(s.prefix))
				return nil
			})
			return err
		}, policiesKey(s.prefix))
		if !errors.Is(err, redis.TxFailedErr) || attempt == 20 {
			return err
		}
	}
}

// announce tells every reader to drop its cache; a lost message is caught
// by the version poll.
func (s *PolicyStore) announce(ctx context.Context) {
	s.invalidate()
	s.changes.Add(1)
	_ = s.client.Publish(ctx, policiesChannel(s.prefix), "changed").Err()
}

// Get returns the policy stored under name, or ErrNoPolicy.
func (s *PolicyStore) Get(ctx context.Context, name string) (*Policy, error) {
	raw, err := s.client.HGet(ctx, policiesKey(s.prefix), name).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w for %q", ErrNoPolicy, name)
	}
	if err != nil {
		return nil, fmt.Errorf("get policy %q: %w", name, err)
	}
	return decodePolicy(name, raw)
}

// NamedPolicy is one entry of List.
type NamedPolicy struct {
	Name   string
	Policy *Policy
	// Err is set when the stored value cannot be read; Policy is nil then.
	Err error
}

// List returns every stored policy, sorted by name. An entry that cannot
// be read is listed with its error rather than failing the whole list.
func (s *PolicyStore) List(ctx context.Context) ([]NamedPolicy, error) {
	all, err := s.client.HGetAll(ctx, policiesKey(s.prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	out := make([]NamedPolicy, 0, len(all))
	for name, raw := range all {
		p, err := decodePolicy(name, raw)
		out = append(out, NamedPolicy{Name: name, Policy: p, Err: err})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete removes the policy of name and reports whether there was one. The
// tenant's throttle state is left alone.
// Deleting a policy that is not there changes nothing.
func (s *PolicyStore) Delete(ctx context.Context, name string) (bool, error) {
	existed := false
	err := s.changeAtomically(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		n, err := tx.HExists(ctx, policiesKey(s.prefix), name).Result()
		if existed = n; err != nil || !n {
			return nil, err
		}
		return func(pipe redis.Pipeliner) { pipe.HDel(ctx, policiesKey(s.prefix), name) }, nil
	})
	if err != nil {
		return false, fmt.Errorf("delete policy %q: %w", name, err)
	}
	if existed {
		s.announce(ctx)
	}
	return existed, nil
}

// readVersion is the number of changes made to the store so far.
func (s *PolicyStore) readVersion(ctx context.Context) (int64, error) {
	v, err := s.client.Get(ctx, policiesVersionKey(s.prefix)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

// readVersions reads the policies' version and the learned limits' in
// one command.
func (s *PolicyStore) readVersions(ctx context.Context) (int64, int64, error) {
	vals, err := s.client.MGet(ctx, policiesVersionKey(s.prefix), learnedVersionKey(s.prefix)).Result()
	if err != nil {
		return 0, 0, err
	}
	var out [2]int64
	for i, v := range vals {
		if str, ok := v.(string); ok {
			if out[i], err = strconv.ParseInt(str, 10, 64); err != nil {
				return 0, 0, fmt.Errorf("version %q is not a number", str)
			}
		}
	}
	return out[0], out[1], nil
}

// generation counts the cache's invalidations: it moves when a policy may
// have changed.
func (s *PolicyStore) generation() uint64 { return s.gen.Load() }

// changeCount counts the policy changes the store learned of since it
// began watching (its own start is none).
func (s *PolicyStore) changeCount() uint64 { return s.changes.Load() }

func (s *PolicyStore) invalidate() {
	s.mu.Lock()
	s.cache = map[string]cachedPolicy{}
	s.learned = map[string]*learnedEntry{}
	s.gen.Add(1)
	s.epoch.Add(1)
	s.mu.Unlock()
}

// resolved is what the limiter needs to decide for one tenant.
type resolved struct {
	tenant      *Policy // the tenant's own policy, or the default, with its learned limit; nil: none
	stored      *Policy // the tenant's own policy, or the default, as stored
	learned     *LearnedLimit
	adaptive    *AdaptiveLimit
	tenantName  string  // name of the policy in tenant: the tenant or "*"
	global      *Policy // nil when @global has no policy
	tenantFacts *policyFacts
	globalFacts *policyFacts
	// the shadow tried on the tenant's jobs (nil: none), its name
	// (ShadowPrefix and the tenant or *) and facts
	shadow      *Policy
	shadowName  string
	shadowFacts *policyFacts
}

// startReading is what every read of the cache does first: the watcher of
// changes starts with the first read, and a closed store caches nothing.
func (s *PolicyStore) startReading() {
	s.watchOnce.Do(func() {
		s.watching.Store(true)
		go s.watch()
	})
	if s.closed.Load() {
		s.invalidate()
	}
}

// resolve returns the policies that apply to tenant ("" for jobs without
// one), from the cache or with one round trip to Redis.
func (s *PolicyStore) resolve(ctx context.Context, tenant string) (resolved, error) {
	s.startReading()
	s.mu.RLock()
	t, tok := s.cache[tenant]
	d, dok := s.cache[DefaultPolicy]
	g, gok := s.cache[GlobalPolicy]
	le, lok := s.learned[tenant]
	// the shadows: the tenant's own and the default's
	shadowName := ShadowPrefix + tenant
	st, stok := s.cache[shadowName]
	sd, sdok := s.cache[ShadowPrefix+DefaultPolicy]
	s.mu.RUnlock()
	if tenant == "" {
		t, tok = cachedPolicy{}, true
		st, stok = cachedPolicy{}, true
		lok = true
	}
	if lok && le.lapsed(time.Now()) {
		lok = false
	}
	if !(tok && dok && gok && lok && stok && sdok) {
		// Read only what is missing, in one round trip; the default and
		// @global stay the same objects for every tenant that uses them.
		epoch := s.epoch.Load()
		var fields []string
		if !dok {
			fields = append(fields, DefaultPolicy)
		}
		if !gok {
			fields = append(fields, GlobalPolicy)
		}
		if !tok {
			fields = append(fields, tenant)
		}
		if !stok {
			fields = append(fields, shadowName)
		}
		if !sdok {
			fields = append(fields, ShadowPrefix+DefaultPolicy)
		}
		learnedOf := ""
		if !lok {
			learnedOf = tenant
		}
		vals, learned, err := s.read(ctx, fields, learnedOf)
		if err != nil {
			return resolved{}, fmt.Errorf("read policies: %w", err)
		}
		if !lok {
			le = learned
		}
		for i, name := range fields {
			c := cachedPolicy{}
			if raw, ok := vals[i].(string); ok {
				c.policy, c.err = decodePolicy(name, raw)
			}
			c.facts = factsOf(c.policy)
			switch name {
			case DefaultPolicy:
				d = c
			case GlobalPolicy:
				g = c
			case ShadowPrefix + DefaultPolicy:
				sd = c
			case shadowName:
				st = c
			}
			if name == tenant {
				t = c
			}
		}
		s.mu.Lock()
		if s.epoch.Load() == epoch {
			if len(s.cache) > maxCachedPolicies || len(s.learned) > maxCachedPolicies {
				s.cache = map[string]cachedPolicy{}
				s.learned = map[string]*learnedEntry{}
			}
			for _, name := range fields {
				switch name {
				case DefaultPolicy:
					s.cache[name] = d
				case GlobalPolicy:
					s.cache[name] = g
				case ShadowPrefix + DefaultPolicy:
					s.cache[name] = sd
				case shadowName:
					s.cache[name] = st
				default:
					s.cache[name] = t
				}
			}
			if !lok {
				s.learned[tenant] = le
			}
		}
		s.mu.Unlock()
	}
	for _, c := range []cachedPolicy{t, d, g} {
		if c.err != nil {
			return resolved{}, c.err
		}
	}
	r := resolved{global: g.policy, globalFacts: g.facts}
	if tenant != "" {
		r.tenant, r.tenantName, r.tenantFacts = t.policy, tenant, t.facts
		if r.tenant == nil {
			r.tenant, r.tenantName, r.tenantFacts = d.policy, DefaultPolicy, d.facts
		}
		r.stored = r.tenant
		// A shadow is the tenant's own, or the default's for a tenant
		// that follows the default. One that cannot be read is left out:
		// it must not stop the tenant's jobs.
		switch {
		case st.policy != nil:
			r.shadow, r.shadowName, r.shadowFacts = st.policy, shadowName, st.facts
		case st.err == nil && t.policy == nil && t.err == nil && sd.policy != nil:
			r.shadow, r.shadowName, r.shadowFacts = sd.policy, ShadowPrefix+DefaultPolicy, sd.facts
		}
		if le != nil && (le.ll != nil || r.tenant.adaptIndex() >= 0) {
			if r.tenant == nil {
				r.tenantName = tenant
			}
			r.tenant, r.tenantFacts, r.learned, r.adaptive = le.apply(r.tenant, r.tenantFacts)
		}
	}
	return r, nil
}

// pool returns the policy of the shared pool name (nil: none), from the
// cache or with one round trip to Redis.
func (s *PolicyStore) pool(ctx context.Context, name string) (cachedPolicy, error) {
	cs, err := s.cached(ctx, name)
	if err != nil {
		return cachedPolicy{}, err
	}
	return cs[0], cs[0].err
}

// cached returns the policies of names (a nil policy for none), from the
// cache, reading those missing in one round trip to Redis.
func (s *PolicyStore) cached(ctx context.Context, names ...string) ([]cachedPolicy, error) {
	s.startReading()
	out := make([]cachedPolicy, len(names))
	var missing []string
	s.mu.RLock()
	for i, name := range names {
		c, ok := s.cache[name]
		if !ok {
			missing = append(missing, name)
		}
		out[i] = c
	}
	s.mu.RUnlock()
	if len(missing) == 0 {
		return out, nil
	}
	epoch := s.epoch.Load()
	vals, _, err := s.read(ctx, missing, "")
	if err != nil {
		return nil, fmt.Errorf("read policies: %w", err)
	}
	read := make(map[string]cachedPolicy, len(missing))
	for i, name := range missing {
		var c cachedPolicy
		if raw, ok := vals[i].(string); ok {
			c.policy, c.err = decodePolicy(name, raw)
		}
		c.facts = factsOf(c.policy)
		read[name] = c
	}
	for i, name := range names {
		if c, ok := read[name]; ok {
			out[i] = c
		}
	}
	s.mu.Lock()
	if s.epoch.Load() == epoch {
		if len(s.cache)+len(read) > maxCachedPolicies {
			s.cache = map[string]cachedPolicy{}
		}
		for name, c := range read {
			s.cache[name] = c
		}
	}
	s.mu.Unlock()
	return out, nil
}

// keyPolicy returns the policy of tenant's key and the name it is stored
// under: the key's own (TENANT/KEY), else that of its tenant's keys
// (TENANT/*), else that of every tenant's keys (*/*); none ("", nil) when
// none of them exists.
func (s *PolicyStore) keyPolicy(ctx context.Context, tenant, key string) (string, cachedPolicy, error) {
	names := []string{keyPolicyName(tenant, key), keyPolicyName(tenant, DefaultPolicy), keyPolicyName(DefaultPolicy, DefaultPolicy)}
	cs, err := s.cached(ctx, names...)
	if err != nil {
		return "", cachedPolicy{}, err
	}
	for i, c := range cs {
		if c.err != nil {
			return "", cachedPolicy{}, c.err
		}
		if c.policy != nil {
			return names[i], c, nil
		}
	}
	return "", cachedPolicy{}, nil
}

// keyPolicies are the key policies a turn of tenant's line needs: the
// policy of its keys without one of their own (TENANT/* or */*; its name
// "" when none) and the keys that have their own, with theirs. The names
// of the stored key policies are read once per change of the policies
// (HKEYS of the policy hash, only when a key policy was ever asked for);
// a store without key policies answers with no round trip.
func (s *PolicyStore) keyPolicies(ctx context.Context, tenant string) (def string, defc cachedPolicy, own map[string]cachedPolicy, err error) {
	idx, err := s.keyIndex(ctx)
	if err != nil || len(idx) == 0 {
		return "", cachedPolicy{}, nil, err
	}
	keys := idx[tenant]
	names := make([]string, 0, len(keys)+2)
	for _, k := range keys {
		names = append(names, keyPolicyName(tenant, k))
	}
	names = append(names, keyPolicyName(tenant, DefaultPolicy), keyPolicyName(DefaultPolicy, DefaultPolicy))
	cs, err := s.cached(ctx, names...)
	if err != nil {
		return "", cachedPolicy{}, nil, err
	}
	for i, c := range cs {
		if c.err != nil {
			return "", cachedPolicy{}, nil, c.err
		}
		if i < len(keys) {
			if c.policy != nil {
				if own == nil {
					own = map[string]cachedPolicy{}
				}
				own[keys[i]] = c
			}
		} else if def == "" && c.policy != nil {
			def, defc = names[i], c
		}
	}
	return def, defc, own, nil
}

// keyIndexEntry is the cache's entry holding the key index (a name no
// policy can have).
const keyIndexEntry = "\x00keys"

// keyIndex maps each tenant to the keys that have a policy of their own;
// a tenant whose keys share TENANT/* (or */*) maps to nothing but is
// present. Empty when no key policy is stored.
func (s *PolicyStore) keyIndex(ctx context.Context) (map[string][]string, error) {
	s.startReading()
	s.mu.RLock()
	c, ok := s.cache[keyIndexEntry]
	s.mu.RUnlock()
	if ok {
		return c.keys, nil
	}
	epoch := s.epoch.Load()
	names, err := s.client.HKeys(ctx, policiesKey(s.prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("read policies: %w", err)
	}
	idx := map[string][]string{}
	for _, name := range names {
		if t, k, ok := keyOf(name); ok {
			if k == DefaultPolicy {
				if _, ok := idx[t]; !ok {
					idx[t] = nil // present: TENANT/* (or */*) applies
				}
				continue
			}
			idx[t] = append(idx[t], k)
		}
	}
	s.mu.Lock()
	if s.epoch.Load() == epoch {
		s.cache[keyIndexEntry] = cachedPolicy{keys: idx}
	}
	s.mu.Unlock()
	return idx, nil
}

// read reads the named policies' raw values and, unless learnedOf is
// empty, that tenant's learned limit, in one round trip, giving up at
// ctx's end: a go-redis call ends at the client's timeouts, not at the
// context's deadline, and a decision must not outlive the caller's
// deadline on a frozen Redis. A read given up on ends by itself at the
// client's timeouts.
func (s *PolicyStore) read(ctx context.Context, fields []string, learnedOf string) ([]any, *learnedEntry, error) {
	type result struct {
		vals    []any
		learned *learnedEntry
		err     error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		if learnedOf == "" {
			r.vals, r.err = s.client.HMGet(ctx, policiesKey(s.prefix), fields...).Result()
			ch <- r
			return
		}
		var hm *redis.SliceCmd
		var decode func(time.Time) *learnedEntry
		_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			if len(fields) > 0 {
				hm = pipe.HMGet(ctx, policiesKey(s.prefix), fields...)
			}
			decode = s.readLearned(ctx, pipe, learnedOf)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			r.err = err
		} else {
			if hm != nil {
				r.vals, r.err = hm.Result()
			}
			r.learned = decode(time.Now())
		}
		ch <- r
	}()
	select {
	case r := <-ch:
		return r.vals, r.learned, r.err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// jobPolicies are the policies that apply to a tenant's jobs, as sluice's
// worker and producer hold them for a job (policiesView, through
// jobpath.Engine.Resolve), with what each cached policy's admissions need
// worked out once.
type jobPolicies struct {
	policiesView
	facts, globalFacts, shadowFacts *policyFacts // worked out when cached
}

// policiesFor returns the policies that apply to tenant's jobs ("" for
// jobs that follow @global only), as the limiter sees them: from its
// cache, or with one round trip.
func (s *PolicyStore) policiesFor(ctx context.Context, tenant string) (jobPolicies, error) {
	r, err := s.resolve(ctx, tenant)
	return r.jobPolicies(), err
}

// jobPolicies is r as a job carries it.
func (r resolved) jobPolicies() jobPolicies {
	return jobPolicies{
		policiesView: policiesView{Policy: r.tenant, Name: r.tenantName, Global: r.global, Learned: r.learned,
			Shadow: r.shadow, ShadowName: r.shadowName, Adaptive: r.adaptive, Pace: max(r.tenant.pace(), r.global.pace())},
		facts: r.tenantFacts, globalFacts: r.globalFacts, shadowFacts: r.shadowFacts,
	}
}

// watch drops the cache whenever a change is announced or the version moves.
func (s *PolicyStore) watch() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	sub := s.client.Subscribe(ctx, policiesChannel(s.prefix))
	defer sub.Close()
	// Policies read before the subscription was live may have changed
	// unannounced: once it is, start afresh.
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	_, _ = sub.Receive(rctx)
	rcancel()
	s.invalidate()
	// Subscriptions come through too: one after the first is go-redis
	// subscribing again on a new connection, after messages may have been
	// lost: the versions are read at once.
	msgs := sub.ChannelWithSubscriptions()
	tick := time.NewTicker(s.poll)
	defer tick.Stop()
	poll := func() {
		pctx, pcancel := context.WithTimeout(ctx, min(s.poll, 5*time.Second))
		v, lv, err := s.readVersions(pctx)
		pcancel()
		if err != nil {
			return
		}
		if old := s.version.Swap(v); old != v {
			s.invalidate()
			if old >= 0 {
				s.changes.Add(1)
			}
		}
		s.checkLearned(lv)
	}
	// the version as of the subscription: a change later lost on the
	// channel shows as a new one
	poll()
	for {
		select {
		case <-s.stop:
			return
		case m, ok := <-msgs:
			if !ok {
				continue
			}
			msg, isMsg := m.(*redis.Message)
			if !isMsg {
				if sm, ok := m.(*redis.Subscription); ok && sm.Kind == "subscribe" {
					s.resubscribed.Add(1)
					poll()
				}
				continue
			}
			if v, tenant, ok := parseLearnedMessage(msg.Payload); ok {
				s.noteLearned(v)
				s.invalidateTenant(tenant)
				continue
			}
			s.invalidate()
			s.changes.Add(1)
		case <-tick.C:
			poll()
		}
	}
}

// close stops the watcher. The store can still be used for reads and
// writes; it no longer caches policies.
func (s *PolicyStore) close() error {
	s.watchOnce.Do(func() {}) // a store never used starts no watcher now
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	if s.watching.Load() {
		<-s.done
	}
	return nil
}

// policyFacts are what admissions need to know of a policy, worked out once
// when it is cached rather than for every job.
type policyFacts struct {
	maxCost     int64  // the most a job may cost; -1: no bound
	maxCostRule string // the rule that bounds it
	lease       time.Duration
	fp          uint32 // policyPrint of the policy
	// args are the policy's arguments to admit.lua, when they do not
	// depend on the time (a quota's calendar windows do); nil then.
	args *encodedPolicy
}

var noFacts = factsOf(nil)

func factsOf(p *Policy) *policyFacts {
	f := &policyFacts{fp: policyPrint(p)}
	f.maxCost, f.maxCostRule = p.maxCostOf()
	if p == nil {
		p = noPolicy
	}
	if p.Concurrency != nil {
		f.lease = p.Concurrency.lease()
	}
	if p.Quota == nil {
		args := encodePolicyArgs(p, time.Time{})
		f.args = &args
	}
	return f
}
