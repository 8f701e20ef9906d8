package throttle

import (
	"fmt"
	"strconv"
	"strings"
)

// Every Redis key sluice writes is built in this file.
//
// A scope (a tenant, or @global) owns these keys, which share one hash tag,
// so every script touching a scope runs in one Cluster slot:
//
//	PREFIX:{t:TENANT}:s   hash: rate meters, quota counters, cooldown, sequence,
//	                      reservations (field r:JOBID = slot, µs) and running
//	                      jobs' concurrency slots (field h:JOBID = lease end, µs)
//	PREFIX:{t:TENANT}:w   zset: planned window entries (score = start time, µs)
//	PREFIX:{t:TENANT}:a   zset: started window entries
//	PREFIX:{t:TENANT}:l:QUEUE  list: the tenant's line of jobs of QUEUE in the
//	                      waiting room (its jobs of normal priority; lh:QUEUE
//	                      and ll:QUEUE hold those of high and low priority)
//	PREFIX:{t:TENANT}:q   set: the queues the tenant has a line in
//	PREFIX:{t:TENANT}:g   zset: jobs taken from a line, being handed to asynq
//	PREFIX:{t:TENANT}:j   zset: intents, jobs that arrived to wait and are in
//	                      no line yet (their tasks parked, or about to be);
//	                      jh and jl those of high and low priority
//	PREFIX:{t:TENANT}:d   string: the limit learned from the downstream (JSON),
//	                      expiring when it lapses
//	PREFIX:{t:TENANT}:xs, :xw, :xa  the shadow scope: the state hash and window
//	                      zsets of the tenant's shadow policy (as :s, :w, :a)
//	PREFIX:{t:TENANT}:xn:FP  hash: the shadow's decisions counted, for the
//	                      shadow policy whose fingerprint is FP
//	PREFIX:{t:TENANT}:e   hash: the adaptive rule's state (adapt.lua), expiring
//	                      when no worker reported for a while
//	PREFIX:{t:TENANT}:k:KEY:s, :w, :a  the scope of the tenant's key KEY
//	                      ("acme/user-42"): as the tenant's :s, :w and :a
//
// TENANT is escaped so that braces, colons, spaces and percent signs never
// reach the key: a tenant cannot move its keys to another slot or collide
// with another tenant's keys. @global's tag is {g}; a shared pool's keys are
// PREFIX:{g}:p:NAME:s, :w and :a (NAME without its @), in @global's slot, so
// that on Redis Cluster a job's pools and @global are decided in one step.
//
// The policy store lives under PREFIX:{p}:policies (hash), PREFIX:{p}:version,
// PREFIX:{p}:learned (the learned limits' version) and the pub/sub channel
// PREFIX:policies:changed. The waiting room's due
// index of a queue is split in dueShards shards, PREFIX:{rN.M}:due:QUEUE
// (zset: tenant -> due time, µs; dueTags names them), a tenant in the
// shard dueShard gives it; before, it was one key, PREFIX:{r}:due:QUEUE,
// which the sweep drains into the shards. The fleet's registry of worker processes (internal/fleet) is PREFIX:{r}:fleet
// (zset: process -> lease end, ms), PREFIX:{r}:w:PROCESS (hash: the asynq
// task ids a process runs -> queue), PREFIX:{r}:queues (set) and the
// recoverer's lock PREFIX:{r}:recover.

// PrefixDefault is the key prefix used when Config.Prefix is empty.
const PrefixDefault = "sluice"

// keys of one scope.
type scopeKeys struct {
	state, planned, started string
	queues, handing         string
	intents                 string
	learned                 string
	adapt                   string
	base                    string // of the lines
}

// line is the scope's line of jobs of queue in the waiting room: the list
// of its jobs of normal priority.
func (k scopeKeys) line(queue string) string { return k.base + "l:" + queue }

// A line has a list per priority level (waitroom.Waiter.Priority): its
// head is the head of the highest level that has jobs.
const (
	priorityLow    = -1
	priorityNormal = 0
	priorityHigh   = 1
)

// priorities are the levels, highest first: the order of a line's lists.
var priorities = [3]int{priorityHigh, priorityNormal, priorityLow}

// levelSuffix names a priority level in its keys ("" for normal).
func levelSuffix(p int) string {
	switch {
	case p > 0:
		return "h"
	case p < 0:
		return "l"
	}
	return ""
}

// lineAt is the list of the scope's line of queue that holds jobs of
// priority p.
func (k scopeKeys) lineAt(queue string, p int) string {
	return k.base + "l" + levelSuffix(p) + ":" + queue
}

// lines are the lists of the scope's line of queue, highest priority
// first.
func (k scopeKeys) lines(queue string) []string {
	return []string{k.lineAt(queue, priorityHigh), k.lineAt(queue, priorityNormal), k.lineAt(queue, priorityLow)}
}

// intentsAt is the scope's intents of jobs of priority p.
func (k scopeKeys) intentsAt(p int) string { return k.intents + levelSuffix(p) }

// admitKeys are a scope's keys admit.lua may touch.
func (k scopeKeys) admitKeys() []string {
	return []string{k.state, k.planned, k.started}
}

// admitKeysFor are the keys admit.lua is given for a scope under policy p:
// the window zsets only with a window rule (every key given costs the
// script a string).
func (k scopeKeys) admitKeysFor(p *Policy) []string {
	if p != nil && p.Window != nil {
		return k.admitKeys()
	}
	return []string{k.state}
}

// escapeTenant percent-encodes the bytes that could change a key's meaning
// or hash slot; every other byte (UTF-8 included) is kept as is.
func escapeTenant(t string) string {
	if !strings.ContainsAny(t, "{}%: \t\r\n") {
		return t
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch c {
		case '{', '}', '%', ':', ' ', '\t', '\r', '\n':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// hashTag is the {…} part of every key of a scope.
// A key below a tenant ("acme/user-42") has its tenant's.
func hashTag(scope string) string {
	if scope == GlobalPolicy || isPool(scope) {
		return "{g}"
	}
	if t, _, ok := keyOf(scope); ok {
		scope = t
	}
	return "{t:" + escapeTenant(scope) + "}"
}

func keysFor(prefix, scope string) scopeKeys {
	base := prefix + ":" + hashTag(scope) + ":"
	if isPool(scope) {
		// a pool shares @global's slot (a job's pools and @global are
		// decided in one step on a Cluster), under a name of its own
		base += "p:" + scope[1:] + ":"
	} else if _, k, ok := keyOf(scope); ok {
		// a key shares its tenant's slot (a job's key and tenant are
		// decided in one run everywhere), under a name of its own: the
		// key is not escaped, its keys end in a fixed suffix after it
		base += keyInfix + k + ":"
	}
	return scopeKeys{
		state:   base + "s",
		planned: base + "w",
		started: base + "a",
		queues:  base + "q",
		handing: base + "g",
		intents: base + "j",
		learned: base + "d",
		adapt:   base + "e",
		base:    base,
	}
}

// keyInfix starts the part of a key scope's keys after its tenant's tag:
// PREFIX:{t:TENANT}:k:KEY:s, :w and :a (lua/roomops.lua builds them too).
const keyInfix = "k:"

// keyBase is what every key scope of tenant's keys starts with: admit.lua
// appends KEY and ":" and a suffix to it.
func keyBase(prefix, tenant string) string {
	return prefix + ":" + hashTag(tenant) + ":" + keyInfix
}

// shadowKeysFor are the keys of tenant's shadow scope: admit.lua decides
// a shadow's ops over them as over any scope's, under the tenant's hash
// tag. They match neither scopeKeyPattern nor scopeAndQueue: a shadow's
// state lists no tenant.
func shadowKeysFor(prefix, tenant string) scopeKeys {
	base := prefix + ":" + hashTag(tenant) + ":x"
	return scopeKeys{state: base + "s", planned: base + "w", started: base + "a", base: base}
}

// shadowCountsKey holds the counts of tenant's shadow decisions under the
// shadow policy whose fingerprint is fp: a changed shadow counts afresh.
func shadowCountsKey(prefix, tenant string, fp uint32) string {
	return prefix + ":" + hashTag(tenant) + ":xn:" + strconv.FormatUint(uint64(fp), 16)
}

// all are the scope's keys but its lines (which name their queues).
func (k scopeKeys) all() []string {
	return []string{k.state, k.planned, k.started, k.queues, k.handing, k.intents, k.intentsAt(priorityHigh), k.intentsAt(priorityLow)}
}

// dueShards is how many shards a queue's due index is split in, so that
// no one key (and no one Cluster slot) is touched by every job of every
// tenant: 12 spreads evenly over a Cluster of 1, 2, 3, 4 or 6 masters
// whose slots are split evenly, and costs an idle pump 12 small calls a
// second per queue, in one round trip per master. Changing it moves
// tenants to other shards: it is part of the key layout.
const dueShards = 12

// dueTags are the shards' hash tags: the slot of tag i lies in the i-th
// twelfth of the slot space (TestDueShardsSpread), so that shards fall
// on different masters of any Cluster that gives each master a run of
// slots.
var dueTags = [dueShards]string{
	"r0.67", "r1.33", "r2.61", "r3.12", "r4.22", "r5.61",
	"r6.49", "r7.15", "r8.10", "r9.63", "r10.45", "r11.19",
}

// dueShard is the shard of a queue's due index tenant is in: FNV-1a of
// its name, modulo dueShards. Part of the key layout, like dueShards.
func dueShard(tenant string) int {
	h := uint32(2166136261)
	for i := 0; i < len(tenant); i++ {
		h ^= uint32(tenant[i])
		h *= 16777619
	}
	return int(h % dueShards)
}

// The waiting room's keys: a shard of a queue's due index, and in a slot
// of their own the lock one pump takes to sweep for lines missing from
// the index and the index of sluice before its shards (drained by the
// sweep).
func dueKey(prefix, queue string, shard int) string {
	return prefix + ":{" + dueTags[shard] + "}:due:" + queue
}
func unshardedDueKey(prefix, queue string) string { return prefix + ":{r}:due:" + queue }
func sweepKey(prefix string) string               { return prefix + ":{r}:sweep" }

// wakeChannel is where room.lua tells the pumps that a queue's line became
// due sooner (the message is QUEUE␟SHARD␟DUE: the queue's name, the
// shard of its index and the new due time, µs).
func wakeChannel(prefix string) string { return prefix + ":{r}:wake" }

// markAllKey marks that a pump of the fleet re-marked queue's tenants for
// a policy change: one pump does it per change.
func markAllKey(prefix, queue string, version int64) string {
	return prefix + ":{r}:markall:" + queue + ":" + strconv.FormatInt(version, 10)
}

// The policy hash and its version share a hash tag so one MULTI updates both.
func policiesKey(prefix string) string        { return prefix + ":{p}:policies" }
func policiesVersionKey(prefix string) string { return prefix + ":{p}:version" }
func policiesChannel(prefix string) string    { return prefix + ":policies:changed" }

// learnedVersionKey counts the changes of learned limits (any tenant's),
// announced on policiesChannel; beside the policies' version so one read
// polls both.
func learnedVersionKey(prefix string) string { return prefix + ":{p}:learned" }

func validatePrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return fmt.Errorf("key prefix %q: must not contain { or } (they would change the hash slot of sluice's keys)", p)
	}
	return nil
}

// scopeKeyPattern is a SCAN MATCH pattern for the keys of every scope
// (tenants and @global) under prefix; scopeFromKey reads a match back.
func scopeKeyPattern(prefix string) string {
	return globEscape(prefix) + ":{[tg]*}:[swaqgljde]*"
}

// poolKeyPattern is a SCAN MATCH pattern for the keys of every shared pool.
func poolKeyPattern(prefix string) string {
	return globEscape(prefix) + ":{g}:p:*"
}

// keyKeyPattern is a SCAN MATCH pattern for the state of every key below
// a tenant.
func keyKeyPattern(prefix string) string {
	return globEscape(prefix) + ":{t:*}:" + keyInfix + "*"
}

// lineKeyPattern is a SCAN MATCH pattern for every tenant's lines (the
// lists of every priority level).
func lineKeyPattern(prefix string) string {
	return globEscape(prefix) + ":{t:*}:l*:*"
}

func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// scopeFromKey returns the tenant (or GlobalPolicy) whose key under prefix
// key is, undoing escapeTenant.
func scopeFromKey(prefix, key string) (string, bool) {
	s, _, ok := scopeAndQueue(prefix, key)
	return s, ok
}

// scopeAndQueue reads a scope's key back: its scope and, for a line, its
// queue.
func scopeAndQueue(prefix, key string) (scope, queue string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix+":")
	if !ok {
		return "", "", false
	}
	// a shared pool's key: {g}:p:NAME:X
	if name, ok := strings.CutPrefix(rest, "{g}:p:"); ok {
		i := strings.LastIndexByte(name, ':')
		if i <= 0 || i != len(name)-2 || validatePool("@"+name[:i]) != nil {
			return "", "", false
		}
		return "@" + name[:i], "", true
	}
	// a key's: {t:TENANT}:k:KEY:X (the tag ends at the first "}")
	if i := strings.Index(rest, "}:"); i > 0 && strings.HasPrefix(rest[i+2:], keyInfix) {
		k := rest[i+2+len(keyInfix):]
		if len(k) < 3 || k[len(k)-2] != ':' || !strings.Contains("swa", k[len(k)-1:]) {
			return "", "", false
		}
		t, ok := tagScope(rest[:i+1])
		if !ok || validateKey(k[:len(k)-2]) != nil {
			return "", "", false
		}
		return keyPolicyName(t, k[:len(k)-2]), "", true
	}
	// a line's key (of any priority level): the first marker is the
	// tag's end (a queue's name may hold one too)
	at, mark := -1, ""
	for _, m := range []string{"}:l:", "}:lh:", "}:ll:"} {
		if i := strings.Index(rest, m); i > 0 && (at < 0 || i < at) {
			at, mark = i, m
		}
	}
	if at > 0 {
		rest, queue = rest[:at+1]+":l", rest[at+len(mark):]
	}
	// a priority level's intents (jh, jl) belong to the scope as j does
	if strings.HasSuffix(rest, "}:jh") || strings.HasSuffix(rest, "}:jl") {
		rest = rest[:len(rest)-1]
	}
	if len(rest) < 4 || rest[len(rest)-2:len(rest)-1] != ":" {
		return "", "", false
	}
	scope, ok = tagScope(rest[:len(rest)-2])
	return scope, queue, ok
}

// tagScope reads a hash tag back.
func tagScope(tag string) (string, bool) {
	if tag == "{g}" {
		return GlobalPolicy, true
	}
	esc, ok := strings.CutPrefix(tag, "{t:")
	if !ok || !strings.HasSuffix(esc, "}") {
		return "", false
	}
	esc = esc[:len(esc)-1]
	if esc == "" || strings.ContainsAny(esc, "{}") {
		return "", false
	}
	if !strings.Contains(esc, "%") {
		return esc, true
	}
	var b strings.Builder
	for i := 0; i < len(esc); i++ {
		if esc[i] == '%' {
			if i+2 >= len(esc) {
				return "", false
			}
			hi, lo := unhex(esc[i+1]), unhex(esc[i+2])
			if hi < 0 || lo < 0 {
				return "", false
			}
			b.WriteByte(byte(hi<<4 | lo))
			i += 2
			continue
		}
		b.WriteByte(esc[i])
	}
	return b.String(), true
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}
