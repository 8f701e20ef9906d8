-- admit.lua: decides whether jobs may start now. A job is checked against
-- every scope it belongs to (its tenant's policy and @global): either every
-- rule of every scope allows it and all are charged, or nothing is written.
--
-- A job that does not fit may take its own future slot (a reservation): the
-- rate, window and quota rules are charged at that slot, and when the job
-- comes back for it, it is admitted without being charged again. Rates and
-- windows keep two meters: the planned one (reservations and immediate
-- starts) and the started one (actual starts only), so that jobs returning
-- late never crowd the jobs that return on time.
--
-- A scope is local (its keys are in KEYS: it is read and written here) or
-- remote (its state comes in ARGV as a snapshot another run of this script
-- returned: it takes part in the decision but is not written). On Redis
-- Cluster a tenant and @global live in different slots; throttle/split.go
-- decides over both in steps, each step deciding over both scopes with the
-- other one remote, at one clock, so that the result is a single server's.
-- A step's writes come back as an undo record, which a later step (flag
-- UNDO, or UNDO_ONLY) takes back when the other scope does not agree.
--
-- The waiting room (docs/architecture.md) keeps its decisions here too, so
-- one engine decides: a job its tenant cannot start now waits in the
-- tenant's line of its queue, charged nothing, and is promoted (its slot
-- taken, its concurrency slot held) when it may start; a release hands its
-- slot to the line's head. Ops of kind arrive, promote and release do that.
--
-- Several jobs may be decided in one call (ops). All times are integers in
-- microseconds.
--
-- KEYS: for every op, per local scope in order its state hash [1] and,
--   when its policy has a window rule, the window zsets [2] and [3]; then
--   for an arrive op the tenant's line of the job's queue (its list of
--   normal priority), the intents of the job's priority level (zset: line
--   entries without their time -> when they arrived to wait, µs: the jobs
--   to be parked that no line holds yet), then the line's lists of high
--   and of low priority; and for promote and release ops with a budget the
--   line (normal), the handing set, the set of queues with lines, and the
--   line's lists of high and low priority:
--   [1] state hash: cd cooldown end; s jobs started; x the expiry last given
--     to the hash; y the expiry its state needs without running jobs (a
--     second or more past the need: release.lua cuts it to ms as text); rn
--     reservations and rc a cursor sweeping stale ones; r:<job> a job's
--     reserved slot; u charges a two-step undo could not take back;
--     d:<queue> the tenant's deficit in the round robin of the queue's
--     due tenants; om, oz the first started meter as a ticket's charge
--     left it and how far past its slot that charge went where no start
--     was (its leeway, which the next job decided once is placed
--     without); and the fields of the rule kinds below
--   [2] planned window zset, [3] started window zset (score: start time)
--   line: a list of waiting jobs, each "LINED_MS<US>COST<US>QUEUE<US>ID"
--     (<US> is the byte 31; COST empty for 1, QUEUE for the default queue;
--     a job with a key below its tenant has "/KEY" after its COST),
--     first in, first out (a line is its three lists: its head is the
--     head of the highest priority that has jobs); handing: a zset of the entries taken from the
--     tenant's lines and not yet confirmed in asynq (score: when taken);
--     queues: a set of the queues the tenant has a line in
-- ARGV:
--   [1] clock: the time to decide at, or -1 for Redis TIME
--   [2] number of ops
--   [3] horizon, [4] reservation grace, [5] started-meter tolerance,
--   [6] longest retry-after of a concurrency denial
--   [7] number of policies, then per policy: number of rules, then per rule
--     its kind and arguments (one block per kind below)
--   per op: job id, cost, flags, not_before, claim token, number of scopes,
--     with TICKET the job's slot and slack, with WAIT the longest wait,
--     then per scope: its policy's number (negative
--     for a remote scope), and
--     for a remote scope its snapshot
--     then with UNDO or UNDO_ONLY an undo record per local scope, and with
--     EXPECT the verdict the op must reach (allowed 0/1, slot)
--     then for arrive: the fleet has room (0/1), the backlog cap (0: none),
--     the lead, the job's line entry without its time (recorded in the
--     intents when the job is to wait); for promote and release: budget (jobs; 0: none promoted),
--     quantum (cost units this turn adds to the deficit), repair age, lead,
--     and with a budget the queue, the base of the tenant's key scopes'
--     keys (BASE..KEY..":s", ":w", ":a"), the policy of its keys without
--     their own (0: none), the number of keys with their own, then each
--     key and its policy, then the arguments of the run's hand-over (roomops.lua)
--   flags: 1 reserve on denial, 2 hold a concurrency slot, 4 dry run (write
--     nothing), 8 plan only (take the slot, do not start), 16 set no expiry,
--     32 probe (write only when the job starts now), 64 two-step (return a
--     snapshot and an undo record of each local scope), 128 UNDO first,
--     256 EXPECT, 512 UNDO_ONLY (no decision), 1024 arrive (a new job: may
--     it go straight?), 2048 promote (the tenant's turn: promote from the
--     line's head), 4096 release (give back the job's concurrency slots
--     under its claim, then promote into them), 8192 general (the general
--     engine decides even an op of the quick path's shape: tests compare),
--     16384 once (arrive, promote: the job is decided once, here: it takes
--     no reservation and the worker's gate starts it on this decision
--     without asking again, at its slot or up to late after it: its
--     started meters are charged as if it started that late (a start
--     before its charge keeps the starts within the meters; one after it
--     would not), so that any start in between conforms. late is a
--     half of the burst the started meters have left after it and two
--     more starts, at most 50 ms, plus the tolerance; a job later than
--     that is decided anew, with TICKET. With less than 5 ms of slack (a
--     scope near its limits), a promoted job whose started meters let it
--     start at its slot is charged the tolerance after it, late the
--     tolerance or as far as the meters count it past the slot, the
--     longer; otherwise, and for an arrival, late is -2:
--     the job takes a reservation, as without once, and the gate decides
--     when it starts), 32768 ticket (the job was decided once
--     at its slot, its started meters charged its slack after it, and
--     comes late: where its charge is still the last on a meter it is
--     taken back, so that starting now charges it once; where its planned
--     charges stand followed by others' (their reservations) in a scope
--     of rates only, it starts on them as on a reservation for its slot,
--     the started meters saying when), 65536 wait (a job
--     at most ARGV wait early for a rate's started meter is allowed at its
--     time, which the reply's slot gives, and charged the tolerance after
--     it: the caller waits, instead of being denied and asking again)
-- Returns: per op {verdict, retry_after, rule * 65536 + rule_index * 256 +
--   scope, remaining, reset_after, in_flight, slot, late}, with two-step
--   also {snapshots} and {undo records}; then the time of the decisions
--   verdict: 1 allowed, 2 wrote, 4 conflict (EXPECT not met: nothing written
--     but the UNDO records)
--   rule: 0 none, a rule kind's code (1 rate, 2 window, 3 quota, 4
--     concurrency), 64 cooldown, 65 reserved (the job's own slot is not due
--     yet); rule_index is 1-based
--   retry_after, for an allowed job started on its reservation: 1 + how
--     long before the decision its reserved slot was (its planned time)
--   remaining, reset_after, in_flight: -1 when no rule applies (local
--     scopes only)
--   slot: the job's reserved slot, 0 when none was taken
--   late: for a job allowed at its slot (WAIT), how long after it the job
--     may still start on this decision: the tolerance or as far as the
--     meters count it past the slot, the longer (0 otherwise)
--   arrive ops answer {verdict, slot, waiting, {undo records}, late,
--     slack, earlier}: verdict 1 straight (the slot and concurrency slot
--     taken), 0 it waits (its intent recorded), -1 the line is at its cap;
--     late: with once, how long after its slot the job may still start on
--     this decision (-1: any time, no rate); -2 for a reservation (the
--     gate decides at its slot); slack: how long after its slot its
--     started meters were charged;
--     earlier 1 when an earlier arrival of the job left its intent (its
--     task may be parked in no line)
--   promote and release ops answer {{promoted}, {retries}, due, waiting,
--     head lined (ms; -1: none), skipped, released, lost, midturn, gone}:
--     per promoted job {entry, slot, claim, {undo records}, late, slack,
--     handed in the run (0 no; 1 moved to pending; 2 pending or running
--     already)}; the handing entries to hand over
--     again; when the line is next due (-1: empty, nothing handed over);
--     entries skipped (their job runs already); for release how many scopes
--     gave back a slot and how many held none under the claim; midturn 1
--     when the budget ended the turn with deficit left for the head: the
--     rest of the turn is kept (d:<queue> negative) and the next turn goes
--     on with it, adding no quantum; gone: jobs whose tasks the turn found
--     gone, handing over in its run (they left the line charged nothing)
-- Errors: "ERR sluice: clock" when the time is outside the quota windows
--   given (the caller's clock estimate is off; it retries with fresh bounds).
--
-- The rule kinds (ARGV kind, then its arguments; its state; its part of a
-- snapshot and of an undo record) are described in their files: rate in
-- phases.lua (a branch of each phase), window.lua, quota.lua,
-- concurrency.lua; 1 rate, 2 window, 3 quota, 4 concurrency.
-- A snapshot starts with the cooldown end and the job's valid reservation
-- (-1: none); an undo record with what the op wrote (1 planned meters, 2
-- started meters, 4 a new slot, 8 the job's slot kept), its claim, and the
-- job's reservation before and after (-1: none).
--
-- Cost matters here: every redis.call, every number Redis has to print and
-- every table and function the script makes (Redis runs the whole script
-- on every call) is paid per decision: converting a number to or from text
-- costs about what a small table does, a Redis command several times that.
-- So numbers are formatted with %d (Redis would use the slower %.17g), a
-- scope's state is read with one HMGET and written with one HSET, a
-- policy's rules are kept in flat fields, the op being decided in locals,
-- and the phases are a few functions with a branch per rule kind. Every
-- field of the hash and every key given costs each read and write, so a
-- slot is one field and a scope without a window rule gives one key. The
-- commonest admission takes the quick path (before the ops' loop), which
-- answers with one text: a table in the reply costs Redis a dozen lookups.


local call, tonumber, unpack, format = redis.call, tonumber, unpack, string.format
local floor, max, min = math.floor, math.max, math.min
local KEYS, ARGV = KEYS, ARGV
local num = tonumber

-- @include clock
-- @include slot

local function fmt(v)
  return format('%d', v)
end

-- a small number from the arguments: most are 0 or 1, which need no
-- conversion
local function int(s)
  if s == '1' then return 1 elseif s == '0' then return 0 end
  return num(s)
end

-- the call's time and settings; the settings a decision may not need are
-- read when first needed (false until then)
local now = now_us()
local nops = int(ARGV[2])
local horizon, grace, tolerance, conc_retry = false, false, false, false

-- The engine: the op being decided and the functions live in one table, so
-- that the functions capture few upvalues (Lua makes every closure anew on
-- every call). What a call pays for is what it makes: each function, each
-- table and each field of a table costs about what a conversion of a number
-- does, so the functions of a rule kind are made only when a policy of the
-- call has one, and the fields every op sets are named here (a table built
-- at its size, not grown).
local E = {
  a = 7, id = false, cost = 1, claim = false, rkey = false, hkey = false,
  reserve = false, hold = false, dry = false, plan = false,
  not_before = 0, promote = false, once = false, slack = 0, late = -1, lead = 0,
  ticket = false, tslack = 0, wait = false, wlate = 0, twostep = false, room = false,
  arriving = false
}

-- the longest a job allowed at a time near its limits (WAIT, or promoted
-- with less than SLACK_MIN of slack) may start after it, as far as its
-- started meters run ahead of it (rate.lua's wait_late)
local SLACK_MAX = 25000
-- the longest a job decided once with room to spare may start after its
-- slot, charged for (its started meters are charged at the slot plus what
-- it may be late): a promoted job waits in the queue engine's pending
-- list for a worker (the small end-to-end round's late ones waited 19-55
-- ms, 30 ms at the median), and one later than that is decided anew
local ONCE_SLACK_MAX = 50000
-- the least slack a decision travels with; with less (a scope near its
-- limits) the gate decides when the job starts
local SLACK_MIN = 5000

-- The rule kinds, which are also the decisions' rule codes, are written as
-- their numbers: 1 rate, 2 window, 3 quota, 4 concurrency; and the codes of
-- the decisions no rule kind makes: 64 cooldown, 65 reserved.

-- the arguments are read in order from a
local function next_int()
  local v = int(ARGV[E.a])
  E.a = E.a + 1
  return v
end

-- make key live at least until time t, never shortening its life: GT
-- extends a key that has a TTL, NX gives one to a key that has none
local function extend_to(key, t)
  if t <= now then return end
  local ms = fmt(floor((t - now) / 1000) + 2)
  if call('PEXPIRE', key, ms, 'GT') == 0 then
    call('PEXPIRE', key, ms, 'NX')
  end
end

-- The policies of this call, read once. A policy keeps its rules in flat
-- fields, per kind: nr rates (unit[i], off[i]: the increment for cost 1
-- and the burst offset of rate i; uarg[i]: where its arguments are, for
-- its period and limit and the unit as text), wlim/wdur, qlim/bounds/cur,
-- clim/lease (wlim, qlim and clim 0 when the policy has no such rule), and
-- fields, the hash fields they read (rate i's first: p<i>, a<i>, i<i> at
-- 3i-2, 3i-1, 3i). has[kind] says whether a policy of the call has a rule
-- of the kind.
local POL, has = {}, { false, false, false, false }
do
  -- read with a cursor of its own: the policies are most of the arguments
  local a = E.a
  local npol = int(ARGV[a])
  a = a + 1
  for p = 1, npol do
    local pol = { nr = 0, unit = false, off = false, uarg = false, wlim = 0, qlim = 0, clim = 0,
      fields = false, reservable = false, quick = false }
    local f = {}
    local nrules = int(ARGV[a])
    a = a + 1
    for _ = 1, nrules do
      local kind = int(ARGV[a])
      has[kind] = true
      if kind == 1 then
        -- unit, offset, period, limit
        local i = pol.nr + 1
        if i == 1 then pol.unit, pol.off, pol.uarg = {}, {}, {} end
        pol.nr, pol.unit[i], pol.off[i], pol.uarg[i] = i, num(ARGV[a + 1]), int(ARGV[a + 2]), a + 1
        a = a + 5
        f[#f + 1] = 'p' .. i; f[#f + 1] = 'a' .. i; f[#f + 1] = 'i' .. i
      elseif kind == 2 then
        pol.wlim, pol.wdur = num(ARGV[a + 1]), num(ARGV[a + 2])
        a = a + 3
        f[#f + 1] = 'n'
      elseif kind == 3 then
        pol.qlim = num(ARGV[a + 1])
        local b = {}
        local nb = num(ARGV[a + 2])
        a = a + 3
        for j = 1, nb do b[j] = num(ARGV[a + j - 1]) end
        a = a + nb
        pol.bounds, pol.cur = b, false
        for j = 1, nb - 1 do
          if b[j] <= now and now < b[j + 1] then pol.cur = j end
        end
        if not pol.cur then
          return redis.error_reply('ERR sluice: clock')
        end
        f[#f + 1] = 'qa'; f[#f + 1] = 'qc'; f[#f + 1] = 'qb'; f[#f + 1] = 'qd'
      elseif kind == 4 then
        pol.clim, pol.lease = num(ARGV[a + 1]), num(ARGV[a + 2])
        a = a + 3
        f[#f + 1] = 'hc'; f[#f + 1] = 'hm'; f[#f + 1] = 'y'
      end
    end
    pol.fields = f
    pol.reservable = pol.nr > 0 or pol.wlim > 0 or pol.qlim > 0
    -- the quick path's shape: some rule, at most one rate and a concurrency
    -- rule, no other kind (a kind added later is the general engine's)
    pol.quick = nrules > 0 and pol.nr <= 1 and nrules == pol.nr + (pol.clim > 0 and 1 or 0)
    POL[p] = pol
  end
  E.a = a
end

-- The functions of the rule kinds the call's policies have (declared here,
-- made only for the kinds the call has).
local window_entries, add_entries, win_index, used, count_holders, full, conc_wait
-- @include window
-- @include quota
-- @include concurrency
-- @include rate

-- A scope of the op for a job of cost c: its policy and, in its array part,
-- per rate i: [3i-2] the increment of the job's cost, [3i-1] the planned
-- meter, [3i] the started one. The increment is ceil(period * c / limit),
-- exactly (the policy's validation keeps burst × interval, and so every
-- admissible cost's increment, below 2^53). Made with the fields a
-- decision with a rate and a concurrency rule sets, the array part sized
-- for four rates (a field added to a full table makes Lua rebuild it).
local function scope(pol, c)
  local sc = { false, false, false, false, false, false, false, false, false, false, false, false,
    pol = pol, st = false, k = 0, cd = 0, R = false, Rraw = false, starts = 0,
    x = 0, rn = 0, hend = false, hc = false, hm = false, y = false, live = false,
    mine = false, soonest = false, stale = false, took = false, started = false,
    planned = false }
  for i = 1, pol.nr do
    if c == 1 then
      sc[3 * i - 2] = pol.unit[i]
    else
      local per, lim = num(ARGV[pol.uarg[i] + 2]), num(ARGV[pol.uarg[i] + 3])
      local r = per % lim
      local y = floor(r * c / lim)
      if y * lim < r * c then y = y + 1 end
      sc[3 * i - 2] = (per - r) / lim * c + y
    end
  end
  return sc
end
-- @include phases
-- @include twostep
-- @include roomops

local out = {}

-- @include quick

local k = 0
for o = 1, nops do
  E.id, E.claim = ARGV[E.a], ARGV[E.a + 4]
  E.cost, E.not_before = int(ARGV[E.a + 1]), int(ARGV[E.a + 3])
  local flags = num(ARGV[E.a + 2])
  local nscopes = int(ARGV[E.a + 5])
  E.a = E.a + 6
  E.ticket, E.wait, E.wlate = false, false, 0
  if flags >= 32768 then
    if floor(flags / 32768) % 2 == 1 then
      E.ticket, E.tslack = int(ARGV[E.a]), int(ARGV[E.a + 1])
      E.a = E.a + 2
    end
    if floor(flags / 65536) % 2 == 1 then
      E.wait = int(ARGV[E.a])
      E.a = E.a + 1
    end
  end
  -- the quick path first, when the op has its shape (flags: at most
  -- reserve, hold, no expiry, probe, which changes nothing for a job
  -- that starts, ticket and wait, which it leaves to the general engine
  -- unless the job may start at once)
  local read = true
  if nscopes == 1 and flags % 32768 < 64 and flags % 16 < 4 then
    local ref = int(ARGV[E.a])
    local pol = ref > 0 and POL[ref]
    if pol and pol.quick and E.cost == 1 then
      read = quick(pol, KEYS[k + 1], flags, o)
      if not read then E.a, k = E.a + 1, k + 1 end
    end
  end
  if read then
  -- the flags, the rare ones (64 and up) only when one is set
  local f = flags % 64
  E.reserve, E.hold = f % 2 == 1, floor(f / 2) % 2 == 1
  E.dry, E.plan = floor(f / 4) % 2 == 1, floor(f / 8) % 2 == 1
  local noexpire, probe = floor(f / 16) % 2 == 1, f >= 32
  local steps, undo_first, expect, undo_only = false, false, false, false
  local is_arrive, is_promote, is_release, roomop = false, false, false, false
  E.once = false
  local ts, rm
  if flags >= 64 then
    f = floor(flags / 64)
    steps, undo_first = f % 2 == 1, floor(f / 2) % 2 == 1
    expect, undo_only = floor(f / 4) % 2 == 1, floor(f / 8) % 2 == 1
    is_arrive, is_promote = floor(f / 16) % 2 == 1, floor(f / 32) % 2 == 1
    is_release = floor(f / 64) % 2 == 1
    E.once = floor(f / 256) % 2 == 1
    roomop = is_arrive or is_promote or is_release
    if steps or undo_first or undo_only or roomop then ts = twostep_functions() end
    if roomop then rm = room_functions(ts) end
  end
  E.rkey = 'r:' .. E.id
  if has[4] then E.hkey = 'h:' .. E.id end

  -- the op's scopes; a remote scope's state comes from its snapshot
  local scopes, bases = {}, false
  for s = 1, nscopes do
    local ref = next_int()
    local pol = POL[ref < 0 and -ref or ref]
    local sc = scope(pol, E.cost)
    if ref > 0 then
      if roomop then
        bases = bases or {}
        bases[#bases + 1] = { pol = pol, k = k }
      end
      if not (is_promote or is_release) then
        read_state(sc, k, ts ~= nil, read ~= true and read)
      end
      k = k + (pol.wlim > 0 and 3 or 1)
    else
      sc.cd, sc.R = next_int(), next_int()
      if sc.R < 0 then sc.R = false end
      for i = 1, pol.nr do sc[3 * i - 1], sc[3 * i] = next_int(), next_int() end
      if pol.wlim > 0 then sc.wtop, sc.we, sc.wea = next_int(), next_int(), next_int() end
      if pol.qlim > 0 then sc.qa, sc.qc, sc.qb, sc.qd = next_int(), next_int(), next_int(), next_int() end
      if pol.clim > 0 then
        sc.live, sc.mine, sc.soonest = next_int(), next_int() == 1, next_int()
        if sc.soonest < 0 then sc.soonest = false end
      end
    end
    scopes[s] = sc
  end

  if is_arrive then
    local intents = KEYS[k + 2]
    local lines = { KEYS[k + 3], KEYS[k + 1], KEYS[k + 4] }
    k = k + 4
    local may_go, cap = next_int() == 1, next_int()
    E.lead = next_int()
    local entry = ARGV[E.a]
    E.a = E.a + 1
    E.arriving = true
    local verdict, slot, waiting, recs, late, slack = rm.arrive(scopes, lines, may_go, cap)
    E.arriving = false
    -- a job that waits is parked next, then joins its line (line.lua takes
    -- its intent back): should its producer die in between, the sweep
    -- finds the intent; one an earlier arrival left is kept
    local earlier = 0
    if verdict == 0 and call('ZADD', intents, 'NX', fmt(now), entry) == 0 then earlier = 1 end
    out[o] = { verdict, slot, waiting, recs, late, slack, earlier }
  elseif roomop then
    local budget, quantum, repair = next_int(), next_int(), next_int()
    E.lead = next_int()
    local lines, handing, qset, queue
    local keyed, eng = false, false
    if budget > 0 then
      lines = { KEYS[k + 4], KEYS[k + 1], KEYS[k + 5] }
      handing, qset = KEYS[k + 2], KEYS[k + 3]
      queue = ARGV[E.a]
      -- the policies of the tenant's keys: their keys' base, the policy of
      -- keys without their own (0: none), then the keys with their own
      local kbase = ARGV[E.a + 1]
      E.a = E.a + 2
      local kdef, nk = next_int(), next_int()
      if kdef > 0 or nk > 0 then
        keyed = { base = kbase, def = kdef > 0 and POL[kdef] or false, own = {} }
        for _ = 1, nk do
          local key = ARGV[E.a]
          E.a = E.a + 1
          keyed.own[key] = POL[next_int()]
        end
      end
      eng = rm.engine()
      k = k + 5
    end
    local released, lost = 0, 0
    if is_release then
      released, lost = rm.release(bases, noexpire)
    end
    if budget > 0 then
      local promoted, retries, due, waiting, head, skipped, midturn, gone =
        rm.promote(bases, lines, handing, qset, queue, budget, quantum, repair, noexpire, num(E.claim) + 1, keyed, eng)
      out[o] = { promoted, retries, due, waiting, head, skipped, released, lost, midturn, gone }
    else
      out[o] = { {}, {}, -1, -1, -1, 0, released, lost, 0, 0 }
    end
  else

  if ts and (undo_first or undo_only) then
    for s = 1, nscopes do
      local sc = scopes[s]
      if sc.st then
        ts.undo(sc, noexpire)
        if undo_first then
          -- decide on the state as the undo left it
          local fresh = scope(sc.pol, E.cost)
          read_state(fresh, sc.k, true)
          scopes[s] = fresh
        end
      end
    end
  end

  if undo_only then
    out[o] = { 0, 0, 0, -1, -1, -1, 0, 0 }
  else
    local allowed, retry, slot, write, rule = decide(scopes)
    local conflict = false
    if expect then
      local want_allowed, want_slot = next_int() == 1, next_int()
      conflict = allowed ~= want_allowed or slot ~= want_slot
    end
    local snaps
    if steps then
      snaps = {}
      for s = 1, nscopes do
        local sc = scopes[s]
        if sc.st then snaps[#snaps + 1] = ts.snapshot(sc) end
      end
    end
    local wrote = write and not E.dry and not conflict and not (probe and write ~= 'start')
    if wrote then
      if write == 'reserve' or write == 'startat' then
        apply(scopes, write, slot, noexpire)
      else
        apply(scopes, write, now, noexpire)
      end
    end

    -- what is left after this decision, in the local scopes
    local remaining, reset, inflight = -1, -1, -1
    for s = 1, nscopes do
      local sc = scopes[s]
      if sc.st then
        local pol, m = sc.pol, sc
        for i = 1, pol.nr do
          local tat = max(m[3 * i - 1], now)
          local left = max(floor((now + pol.off[i] - tat) / pol.unit[i]), 0)
          if remaining < 0 or left < remaining then remaining = left end
          reset = max(reset, tat - now)
        end
        if pol.wlim > 0 then
          local lo = fmt(now - pol.wdur + 1)
          local left = max(pol.wlim - call('ZCOUNT', sc.wp, lo, '+inf'), 0)
          if remaining < 0 or left < remaining then remaining = left end
          local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
          reset = max(reset, top[2] and num(top[2]) + pol.wdur - now or 0)
        end
        if pol.qlim > 0 then
          local b = pol.bounds
          local left = max(pol.qlim - used(sc, b[pol.cur]), 0)
          if remaining < 0 or left < remaining then remaining = left end
          local last = 0
          for w = pol.cur, min(pol.cur + 1, #b - 1) do
            if used(sc, b[w]) > 0 then last = b[w + 1] end
          end
          reset = max(reset, last - now, 0)
        end
        if pol.clim > 0 then
          count_holders(sc, false)
          local left = max(pol.clim - sc.live, 0)
          if remaining < 0 or left < remaining then remaining = left end
          if inflight < 0 then inflight = sc.live end
        end
      end
    end
    local verdict = 0
    if allowed then
      verdict = 1
      -- started on its reservation: 1 + how long ago its planned meters
      -- were charged (settle.lua needs the job's planned time)
      for s = 1, nscopes do
        if scopes[s].R then retry = now - scopes[s].R + 1 break end
      end
    end
    if wrote then verdict = verdict + 2 end
    if conflict then verdict = verdict + 4 end
    out[o] = { verdict, retry, rule, remaining, reset, inflight, slot, E.wlate }
    if steps then
      local recs = {}
      for s = 1, nscopes do
        local sc = scopes[s]
        if sc.st then recs[#recs + 1] = wrote and ts.record(sc) or {} end
      end
      out[o][9] = snaps
      out[o][10] = recs
    end
  end
  end
  end
end

out[nops + 1] = now
return out