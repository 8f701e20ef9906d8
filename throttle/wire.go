package throttle

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/waitroom"
)

// The admission wire: how an admission is laid out for lua/admit.lua and
// how its reply is read. Its header (KEYS, ARGV, Returns) is the contract;
// this file is the only Go code that knows it.

// Flags of an op (ARGV "flags").
const (
	flagReserve  = 1     // a denied job takes its own future slot
	flagHold     = 2     // the job holds a concurrency slot while it runs
	flagDry      = 4     // decide, write nothing
	flagPlan     = 8     // take the job's slot without starting it (shaping)
	flagNoTTL    = 16    // set no expiry (tests)
	flagProbe    = 32    // write only when the job starts now
	flagTwoStep  = 64    // return each local scope's snapshot and undo record
	flagUndo     = 128   // take back the undo records first, then decide
	flagExpect   = 256   // write only when the verdict is the one expected
	flagUndoOnly = 512   // take back the undo records, decide nothing
	flagArrive   = 1024  // the waiting room: may a new job go straight?
	flagPromote  = 2048  // the waiting room: a tenant's turn
	flagRelease  = 4096  // give back the job's slots, then promote into them
	flagGeneral  = 8192  // decide with the general engine only (tests)
	flagOnce     = 16384 // arrive, promote: decide once, the job starts on it (ticket.go)
	flagTicket   = 32768 // a job decided once comes late: its own charge is taken back
	flagWait     = 65536 // a job a little early for a started meter is allowed at its time
)

// Decision rule codes that are not a rule kind's (kinds have theirs: the
// kind's code, kindRate, …).
const (
	ruleCooldown = 64
	ruleReserved = 65
)

func ruleName(code, index int64) string {
	switch {
	case code == ruleCooldown:
		return "cooldown"
	case code == ruleReserved:
		return "reserved"
	case code > 0 && int(code) < len(kinds) && kinds[code] != nil:
		return kinds[code].rule(index)
	}
	return ""
}

// admitOp is one admission as admit.lua takes it.
type admitOp struct {
	id        string
	cost      int64
	flags     int
	notBefore int64 // µs; 0 for none
	// flagTicket: the slot the job was decided for and its slack (µs)
	ticketSlot, ticketSlack int64
	wait                    int64 // µs: flagWait's longest wait
	claim                   uint64
	scopes                  []opScope
	// undo holds an undo record per local scope (flagUndo, flagUndoOnly).
	undo [][]int64
	// expectAllowed and expectSlot are the verdict the op must reach
	// (flagExpect).
	expectAllowed bool
	expectSlot    int64
	// roomKeys and roomArgs: the tenant's line (and handing) keys, and the
	// op's arguments, for a waiting-room op (flagArrive, flagPromote,
	// flagRelease); keyed: for a turn of a line, the policies of the
	// tenant's keys (nil: none)
	roomKeys []string
	roomArgs []any
	keyed    *keyedPolicies
	// engine: for a turn that hands its jobs over in its run, the queue
	// engine's key prefix of the queue, the decision's header name, the
	// policies' fingerprint and the lease (µs); nil: none
	engine []any
}

// opScope is a scope of an op: local (read and written by the op), or
// remote, decided on from its snapshot and not written.
type opScope struct {
	scope
	snapshot []int64 // nil for a local scope
}

// admitArgs is one op's part of admit.lua's ARGV: the policies it uses and
// the op, whose policy references are positions in that list (negative for
// a remote scope). Calls merged into one script run share the policies
// they have in common.
type admitArgs struct {
	header   []any // clock, 1, horizon, grace, tolerance, concurrency retry
	policies []encodedPolicy
	op       []any
	refs     []int // indexes in op of the policy references
}

type encodedPolicy struct {
	key  policyKey
	args []any
}

// policyKey identifies an encoded policy: the cached *Policy and, for a
// quota, the calendar windows sent with it.
type policyKey struct {
	p       *Policy
	windows string
}

var noPolicy = &Policy{}

// flatten lays the parts out as admit.lua reads them, for a call of its own.
func (aa *admitArgs) flatten() []any {
	n := len(aa.header) + 1 + len(aa.op)
	for _, p := range aa.policies {
		n += len(p.args)
	}
	args := make([]any, 0, n)
	args = append(args, aa.header...)
	args = append(args, len(aa.policies))
	for _, p := range aa.policies {
		args = append(args, p.args...)
	}
	return append(args, aa.op...)
}

// encodePolicyArgs lays out a policy's rules: their number, then each
// rule's kind and arguments, kind by kind.
func encodePolicyArgs(p *Policy, now time.Time) encodedPolicy {
	args := make([]any, 1, 16)
	nrules := 0
	key := policyKey{p: p}
	for _, k := range kinds {
		if k == nil {
			continue
		}
		var n int
		args, n = k.encode(p, now, args)
		nrules += n
	}
	if p.Quota != nil {
		// the calendar windows sent depend on the time: two encodings of
		// one policy are the same when their arguments are
		key.windows = fmt.Sprint(args...)
	}
	args[0] = nrules
	return encodedPolicy{key: key, args: args}
}

// encode lays out op for admit.lua, at clock (µs, -1 for Redis time); now
// is the estimate of Redis time that picks the quota windows to send.
func (l *Limiter) encode(op *admitOp, clock int64, now time.Time) ([]string, *admitArgs) {
	keys := make([]string, 0, 3*len(op.scopes))
	aa := &admitArgs{
		header: []any{clock, 1, micros(l.cfg.Horizon), micros(l.cfg.Grace),
			micros(l.cfg.Tolerance), micros(l.cfg.ConcurrencyRetry)},
		op: make([]any, 0, 6+2*len(op.scopes)),
	}
	aa.op = append(aa.op, op.id, op.cost, op.flags, op.notBefore, op.claim, len(op.scopes))
	if op.flags&flagTicket != 0 {
		aa.op = append(aa.op, op.ticketSlot, op.ticketSlack)
	}
	if op.flags&flagWait != 0 {
		aa.op = append(aa.op, op.wait)
	}
	for _, s := range op.scopes {
		p := s.policy
		if p == nil {
			p = noPolicy
		}
		ref := aa.policyRef(p, s.facts, now)
		aa.refs = append(aa.refs, len(aa.op))
		if s.snapshot == nil {
			keys = append(keys, s.keys.admitKeysFor(p)...)
			aa.op = append(aa.op, ref)
		} else {
			aa.op = append(aa.op, -ref)
		}
		for _, v := range s.snapshot {
			aa.op = append(aa.op, v)
		}
	}
	for _, rec := range op.undo {
		for _, v := range rec {
			aa.op = append(aa.op, v)
		}
	}
	if op.flags&flagExpect != 0 {
		allowed := 0
		if op.expectAllowed {
			allowed = 1
		}
		aa.op = append(aa.op, allowed, op.expectSlot)
	}
	keys = append(keys, op.roomKeys...)
	aa.op = append(aa.op, op.roomArgs...)
	if op.flags&(flagPromote|flagRelease) != 0 && len(op.roomKeys) > 0 {
		// a turn of a line: the policies of the tenant's keys
		k := op.keyed
		if k == nil {
			k = &keyedPolicies{}
		}
		aa.op = append(aa.op, k.base)
		if k.def.policy != nil {
			aa.refs = append(aa.refs, len(aa.op))
			aa.op = append(aa.op, aa.policyRef(k.def.policy, k.def.facts, now))
		} else {
			aa.op = append(aa.op, 0)
		}
		aa.op = append(aa.op, len(k.own))
		for _, key := range slices.Sorted(maps.Keys(k.own)) {
			c := k.own[key]
			aa.op = append(aa.op, key)
			aa.refs = append(aa.refs, len(aa.op))
			aa.op = append(aa.op, aa.policyRef(c.policy, c.facts, now))
		}
		if op.engine != nil {
			aa.op = append(aa.op, op.engine...)
		} else {
			aa.op = append(aa.op, "")
		}
	}
	return keys, aa
}

// policyRef is p's reference in the op (its 1-based position in the
// policies sent), adding it with facts' encoding, or encoded at now, when
// the op has not sent it yet.
func (aa *admitArgs) policyRef(p *Policy, facts *policyFacts, now time.Time) int {
	for i, ep := range aa.policies {
		if ep.key.p == p {
			return i + 1
		}
	}
	if facts != nil && facts.args != nil {
		aa.policies = append(aa.policies, *facts.args)
	} else {
		aa.policies = append(aa.policies, encodePolicyArgs(p, now))
	}
	return len(aa.policies)
}

// keyedPolicies are the policies of a tenant's keys, for a turn of its
// line (PolicyStore.keyPolicies): the base of its key scopes' keys, the
// policy of keys without their own (defName; none when its policy is
// nil), and the keys with their own.
type keyedPolicies struct {
	base    string
	defName string
	def     cachedPolicy
	own     map[string]cachedPolicy
}

// scopeOf is the scope of tenant's key under these policies; false when
// its policy has no rules (admit.lua's key_scope).
func (k *keyedPolicies) scopeOf(prefix, tenant, key string) (scope, bool) {
	if k == nil {
		return scope{}, false
	}
	name, c := keyPolicyName(tenant, key), k.own[key]
	if c.policy == nil {
		name, c = k.defName, k.def
	}
	if !c.policy.HasRules() {
		return scope{}, false
	}
	return scope{name: name, keys: keysFor(prefix, keyPolicyName(tenant, key)), policy: c.policy, facts: c.facts}, true
}

// admitMerge puts admissions into one admit.lua run: each distinct policy
// is sent (and read by the script) once, and the ops refer to it.
type admitMerger struct{}

var admitMerge admitMerger

func (admitMerger) lay(calls []*call) ([]string, []any) {
	if len(calls) == 1 {
		return calls[0].keys, calls[0].payload.(*admitArgs).flatten()
	}
	var keys []string
	index := map[policyKey]int{}
	var policies [][]any
	var ops []any
	for _, c := range calls {
		aa := c.payload.(*admitArgs)
		keys = append(keys, c.keys...)
		local := make([]int, len(aa.policies))
		for i, p := range aa.policies {
			n, ok := index[p.key]
			if !ok {
				policies = append(policies, p.args)
				n = len(policies)
				index[p.key] = n
			}
			local[i] = n
		}
		start := len(ops)
		ops = append(ops, aa.op...)
		for _, at := range aa.refs {
			// a negative reference is a remote scope's
			if ref := aa.op[at].(int); ref < 0 {
				ops[start+at] = -local[-ref-1]
			} else {
				ops[start+at] = local[ref-1]
			}
		}
	}
	header := calls[0].payload.(*admitArgs).header
	args := make([]any, 0, len(header)+1+len(ops)+8*len(policies))
	args = append(args, header...)
	args[1] = len(calls)
	args = append(args, len(policies))
	for _, p := range policies {
		args = append(args, p...)
	}
	return keys, append(args, ops...)
}

// reply: admit.lua answers one reply per op, then the time of the decisions.
func (admitMerger) reply(res any, i, n int) (any, error) {
	ops, ok := res.([]any)
	if !ok || len(ops) != n+1 {
		return nil, fmt.Errorf("admit.lua: %v replies for %d ops", res, n)
	}
	return []any{ops[i], ops[n]}, nil
}

// Verdict bits of a reply.
const (
	verdictAllowed  = 1
	verdictWrote    = 2
	verdictConflict = 4
)

// admitReply is admit.lua's answer for one op.
type admitReply struct {
	verdict                    int64
	retry                      int64 // µs
	rule, ruleIndex, ruleScope int64 // ruleScope: 1-based position in the op's scopes
	remaining, reset, inFlight int64
	slot                       int64 // µs; 0 when no slot was taken
	late                       int64 // µs, how late after slot a WAIT decision holds (its started meters charged the tolerance after it, or counted it further)
	now                        int64 // µs, Redis time of the decision
	// with flagTwoStep, per local scope: its state before the op (for a
	// later step, where it is remote) and what the op wrote (for an undo)
	snapshots, undos [][]int64
}

func (r *admitReply) allowed() bool  { return r.verdict&verdictAllowed != 0 }
func (r *admitReply) wrote() bool    { return r.verdict&verdictWrote != 0 }
func (r *admitReply) conflict() bool { return r.verdict&verdictConflict != 0 }

// decodeAdmit reads admit.lua's reply for a single op: {op, now}.
func decodeAdmit(res any) (*admitReply, error) {
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 {
		return nil, fmt.Errorf("admit.lua: unexpected reply %T %v", res, res)
	}
	now, ok := arr[1].(int64)
	if !ok {
		return nil, fmt.Errorf("admit.lua: unexpected time %T %v", arr[1], arr[1])
	}
	if text, ok := arr[0].(string); ok {
		return decodeQuick(text, now)
	}
	op, ok := arr[0].([]any)
	if !ok || (len(op) != 8 && len(op) != 10) {
		return nil, fmt.Errorf("admit.lua: unexpected reply %T %v", arr[0], arr[0])
	}
	v, err := int64s(op[:8], 8)
	if err != nil {
		return nil, fmt.Errorf("admit.lua: %w", err)
	}
	r := &admitReply{
		verdict: v[0], retry: v[1],
		rule: v[2] >> 16, ruleIndex: (v[2] >> 8) & 0xff, ruleScope: v[2] & 0xff,
		remaining: v[3], reset: v[4], inFlight: v[5], slot: v[6], late: v[7], now: now,
	}
	if len(op) == 10 {
		if r.snapshots, err = int64Lists(op[8]); err != nil {
			return nil, fmt.Errorf("admit.lua snapshots: %w", err)
		}
		if r.undos, err = int64Lists(op[9]); err != nil {
			return nil, fmt.Errorf("admit.lua undo records: %w", err)
		}
	}
	return r, nil
}

// decodeQuick reads the quick path's reply, "remaining reset in_flight":
// the job was allowed and charged (a reply of one text, not a table of
// seven numbers, costs Redis a fraction to send).
func decodeQuick(text string, now int64) (*admitReply, error) {
	r := &admitReply{verdict: verdictAllowed | verdictWrote, now: now}
	fields := strings.Fields(text)
	if len(fields) != 3 {
		return nil, fmt.Errorf("admit.lua: unexpected reply %q", text)
	}
	for i, dst := range []*int64{&r.remaining, &r.reset, &r.inFlight} {
		v, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("admit.lua: unexpected reply %q", text)
		}
		*dst = v
	}
	return r, nil
}

// decision turns a reply into a Decision, naming the deciding policy from
// the op's scopes.
func (r *admitReply) decision(scopes []opScope) Decision {
	d := Decision{
		Allowed:    r.allowed(),
		RetryAfter: time.Duration(r.retry) * time.Microsecond,
		Rule:       ruleName(r.rule, r.ruleIndex),
		Remaining:  r.remaining,
		ResetAfter: time.Duration(r.reset) * time.Microsecond,
		InFlight:   r.inFlight,
		Now:        time.UnixMicro(r.now),
	}
	if r.reset < 0 {
		d.ResetAfter = -1
	}
	if r.ruleScope > 0 && int(r.ruleScope) <= len(scopes) {
		d.Policy = scopes[r.ruleScope-1].name
	}
	if r.slot > 0 {
		d.Reserved, d.Slot = true, time.UnixMicro(r.slot)
	}
	if d.Allowed {
		d.RetryAfter = -1
		// where the job was charged: now, at its slot when it waits for a
		// started meter, its planned meters at its reservation when it
		// started on one (retry is then 1 + its age)
		d.planned, d.started = r.now, r.now
		if r.slot > 0 {
			d.planned, d.started = r.slot, r.slot
			d.late = r.late
		}
		if r.retry > 0 {
			d.planned = r.now - r.retry + 1
		}
	}
	return d
}

// int64s checks that a script reply is an array of n integers.
func int64s(reply any, n int) ([]int64, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) != n {
		return nil, fmt.Errorf("unexpected reply %T %v, want %d integers", reply, reply, n)
	}
	out := make([]int64, n)
	for i, x := range arr {
		v, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("unexpected reply element %d: %T %v", i, x, x)
		}
		out[i] = v
	}
	return out, nil
}

// int64Lists checks that a reply is an array of arrays of integers.
func int64Lists(reply any) ([][]int64, error) {
	arr, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply %T %v, want arrays of integers", reply, reply)
	}
	out := make([][]int64, len(arr))
	for i, x := range arr {
		inner, ok := x.([]any)
		if !ok {
			return nil, fmt.Errorf("unexpected reply element %d: %T %v", i, x, x)
		}
		v, err := int64s(inner, len(inner))
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// Verdicts of an arrival.
const (
	arriveFull     = -1 // the line is at its cap
	arriveWait     = 0  // the job is to wait in its line
	arriveStraight = 1  // the job took its slot and goes straight
)

// arriveReply is admit.lua's answer for an arrival: {verdict, slot,
// waiting, {undo records}, earlier}; earlier is 1 when the job is to wait
// and an earlier arrival of it left its intent.
type arriveReply struct {
	verdict, slot, waiting int64
	undo                   [][]int64
	late                   int64 // µs a job decided once may start after its slot; -1: any time
	slack                  int64 // µs after its slot its started meters were charged
	now                    int64 // µs, Redis time of the decision
	earlier                bool
}

func decodeArrive(raw any) (arriveReply, error) {
	op, now, err := roomOpReply(raw, 7)
	if err != nil {
		return arriveReply{}, err
	}
	late, ok := op[4].(int64)
	slack, ok2 := op[5].(int64)
	if !ok || !ok2 {
		return arriveReply{}, fmt.Errorf("admit.lua arrival: unexpected reply %v", op)
	}
	v, err := int64s(op[:3], 3)
	if err != nil {
		return arriveReply{}, fmt.Errorf("admit.lua arrival: %w", err)
	}
	undo, err := int64Lists(op[3])
	if err != nil {
		return arriveReply{}, fmt.Errorf("admit.lua arrival's undo records: %w", err)
	}
	earlier, ok := op[6].(int64)
	if !ok {
		return arriveReply{}, fmt.Errorf("admit.lua arrival: unexpected intent %T %v", op[6], op[6])
	}
	return arriveReply{verdict: v[0], slot: v[1], waiting: v[2], undo: undo, late: late, slack: slack, now: now, earlier: earlier == 1}, nil
}

// roomOpReply checks a waiting-room op's reply, {op's reply, now}, and
// returns the op's n items and the time of the decision (µs).
func roomOpReply(raw any, n int) ([]any, int64, error) {
	arr, ok := raw.([]any)
	if !ok || len(arr) != 2 {
		return nil, 0, fmt.Errorf("admit.lua: unexpected reply %T %v", raw, raw)
	}
	op, ok := arr[0].([]any)
	now, okNow := arr[1].(int64)
	if !ok || !okNow || len(op) != n {
		return nil, 0, fmt.Errorf("admit.lua: unexpected reply %v", raw)
	}
	return op, now, nil
}

// decodeTurn reads a promote or release op's reply: {{promoted}, {retries},
// due, waiting, head lined (ms), skipped, released, lost, midturn, gone}, each
// promoted job {entry, slot, claim, {undo records}, late, slack, handed in
// the run}. scopes are the turn's, keyed the policies of the tenant's keys
// (a promoted job with a key was decided in its key's scope too). With
// once, each promoted job the run did not hand over gets its ticket (it
// holds its concurrency slots for lease; fp is its policies' fingerprint).
func decodeTurn(prefix, tenant string, raw any, scopes []scope, keyed *keyedPolicies, once bool, fp uint32) (waitroom.Turn, error) {
	op, now, err := roomOpReply(raw, 10)
	if err != nil {
		return waitroom.Turn{}, err
	}
	promoted, ok1 := op[0].([]any)
	retries, ok2 := op[1].([]any)
	v, err := int64s(op[2:], 8)
	if !ok1 || !ok2 || err != nil {
		return waitroom.Turn{}, fmt.Errorf("admit.lua: unexpected turn %v", op)
	}
	t := waitroom.Turn{Waiting: max(v[1], 0), Skipped: int(v[3]), Released: int(v[4]), Lost: int(v[5]), MidTurn: v[6] == 1, Gone: int(v[7])}
	if v[0] >= 0 {
		t.Due = time.UnixMicro(v[0])
	}
	if v[2] >= 0 {
		t.Oldest = time.UnixMilli(v[2])
	}
	for _, x := range promoted {
		p, ok := x.([]any)
		if !ok || len(p) != 7 {
			return waitroom.Turn{}, fmt.Errorf("admit.lua: unexpected promoted job %v", x)
		}
		m, ok := p[0].(string)
		late, okLate := p[4].(int64)
		slack, okSlack := p[5].(int64)
		inRun, okRun := p[6].(int64)
		ok = ok && okLate && okSlack && okRun
		nums, err := int64s(p[1:3], 2)
		if !ok || err != nil {
			return waitroom.Turn{}, fmt.Errorf("admit.lua: unexpected promoted job %v", x)
		}
		undo, err := int64Lists(p[3])
		if err != nil {
			return waitroom.Turn{}, fmt.Errorf("admit.lua: promoted job's undo records: %w", err)
		}
		j, err := promotedFrom(tenant, m)
		if err != nil {
			return waitroom.Turn{}, err
		}
		js, jonce := scopes, once
		if ks, ok := keyed.scopeOf(prefix, tenant, j.Key); j.Key != "" && ok {
			js = append(scopes[:len(scopes):len(scopes)], ks)
			// a key's window or quota is decided again at the start, as a
			// tenant's is (room.decidesAll)
			jonce = once && ks.policy.Window == nil && ks.policy.Quota == nil
		}
		j.Slot, j.Claim, j.Undo = time.UnixMicro(nums[0]), uint64(nums[1]), &promotion{undo: undo, scopes: js}
		j.InRun = inRun > 0
		if (jonce || late == lateReserved) && !j.InRun {
			j.Ticket = ticketFor(nums[0], late, slack, now, leaseOf(js), j.Claim, printWith(fp, js))
		}
		t.Promoted = append(t.Promoted, j)
	}
	for _, x := range retries {
		m, ok := x.(string)
		if !ok {
			return waitroom.Turn{}, fmt.Errorf("admit.lua: unexpected handover %v", x)
		}
		j, err := promotedFrom(tenant, m)
		if err != nil {
			return waitroom.Turn{}, err
		}
		j.Retry = true
		t.Promoted = append(t.Promoted, j)
	}
	return t, nil
}

func promotedFrom(tenant, member string) (waitroom.Promoted, error) {
	e, ok := parseLineEntry(member)
	if !ok {
		return waitroom.Promoted{}, fmt.Errorf("line entry %q of tenant %q is not LINED_MS␟COST[/KEY]␟QUEUE␟ID", member, tenant)
	}
	return waitroom.Promoted{Tenant: tenant, Queue: e.queue, ID: e.id, Key: e.key, Cost: e.cost, Lined: e.lined, Entry: member}, nil
}
