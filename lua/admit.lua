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
--   for an arrive op the tenant's line of the job's queue and its intents
--   (zset: line entries without their time -> when they arrived to wait,
--   µs: the jobs to be parked that no line holds yet), and for promote
--   and release ops with a budget the line, the handing set and the set of
--   queues with lines:
--   [1] state hash: cd cooldown end; s jobs started; x the expiry last given
--     to the hash; y the expiry its state needs without running jobs (a
--     second or more past the need: release.lua cuts it to ms as text); rn
--     reservations and rc a cursor sweeping stale ones; r:<job> a job's
--     reserved slot; u charges a two-step undo could not take back;
--     d:<queue> the tenant's deficit in the round robin of the queue's
--     due tenants; and the fields of the rule kinds below
--   [2] planned window zset, [3] started window zset (score: start time)
--   line: a list of waiting jobs, each "LINED_MS<US>COST<US>QUEUE<US>ID"
--     (<US> is the byte 31; COST empty for 1, QUEUE for the default queue),
--     first in, first out; handing: a zset of the entries taken from the
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
--     and with a budget the queue
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
--     started meters are charged as if it started that late, less their
--     tolerance, so that any start in between conforms. late is an eighth
--     of the burst the started meters have left after it and two more
--     starts, at most 25 ms, plus the tolerance; a job later than that is
--     decided anew, with TICKET. With less than 5 ms of slack (a scope near
--     its limits) late is -2: the job takes a reservation, as without once,
--     and the gate decides when it starts), 32768 ticket (the job was decided once
--     at its slot, its started meters charged its slack after it, and
--     comes late: where its charge is still the last on a meter it is
--     taken back, so that starting now charges it once), 65536 wait (a job
--     at most ARGV wait early for a rate's started meter is allowed at its
--     time, which the reply's slot gives, and charged then: the caller
--     waits, instead of being denied and asking again)
-- Returns: per op {verdict, retry_after, rule * 65536 + rule_index * 256 +
--   scope, remaining, reset_after, in_flight, slot}, with two-step also
--   {snapshots} and {undo records}; then the time of the decisions
--   verdict: 1 allowed, 2 wrote, 4 conflict (EXPECT not met: nothing written
--     but the UNDO records)
--   rule: 0 none, a rule kind's code (1 rate, 2 window, 3 quota, 4
--     concurrency), 64 cooldown, 65 reserved (the job's own slot is not due
--     yet); rule_index is 1-based
--   remaining, reset_after, in_flight: -1 when no rule applies (local
--     scopes only)
--   slot: the job's reserved slot, 0 when none was taken
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
--     head lined (ms; -1: none), skipped, released, lost, midturn}: per promoted job
--     {entry, slot, claim, {undo records}, late, slack}; the handing
--     entries to hand over
--     again; when the line is next due (-1: empty, nothing handed over);
--     entries skipped (their job runs already); for release how many scopes
--     gave back a slot and how many held none under the claim; midturn 1
--     when the budget ended the turn with deficit left for the head: the
--     rest of the turn is kept (d:<queue> negative) and the next turn goes
--     on with it, adding no quantum
-- Errors: "ERR sluice: clock" when the time is outside the quota windows
--   given (the caller's clock estimate is off; it retries with fresh bounds).
--
-- The rule kinds (ARGV kind, then its arguments; its state; its part of a
-- snapshot and of an undo record), each a branch of the phases below:
--   1 rate: increment of cost 1, burst offset, period, limit; p<i>/a<i>
--     the planned and started meter of the policy's i-th rate (a<i> not
--     stored while equal to p<i>), i<i> the interval (increment of cost 1)
--     they were charged at: read under another interval, the time they hold
--     ahead of now is scaled to it; snapshot p, a; undo p before, p after,
--     a before, a after
--   2 window: limit, length; zsets [2] and [3], n the entries' sequence;
--     snapshot the newest live planned entry, the planned and the started
--     entry whose leaving makes room for the job (-1: none); undo the
--     sequence ranges added to [2] and to [3]
--   3 quota: limit, number of window starts, the starts; qa/qc and qb/qd two
--     window starts and their counts (the current window and the next are
--     all it needs); snapshot qa, qc, qb, qd; undo the window charged
--   4 concurrency: limit, lease; h:<job> a running job's slot: its lease end
--     and the claim token of the admission holding it (slot.lua), hc how
--     many slots are
--     recorded, hm a lower bound of their earliest lease end (while hm is in
--     the future every recorded slot is live and hc counts them exactly);
--     snapshot live slots, 1 when the job holds one, the earliest lease end
--     when full (-1 otherwise); undo the job's lease end and claim before
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
  ticket = false, tslack = 0, wait = false, twostep = false, room = false
}

-- the longest a job decided once may start after its slot, charged for
-- (its started meters are charged at the slot plus what it may be late)
local SLACK_MAX = 25000
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
if has[2] then
  -- window: the newest live planned entry, and the planned and started
  -- entries whose leaving makes room for the job (-1: none), read once
  window_entries = function(sc, started)
    local lo = fmt(now - sc.pol.wdur + 1)
    local slack = fmt(sc.pol.wlim - E.cost)
    if not sc.wtop then
      local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
      local e = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', slack, '1')
      sc.wtop, sc.we = num(top[2]) or -1, num(e[2]) or -1
    end
    if started and not sc.wea then
      local e = call('ZREVRANGEBYSCORE', sc.wa, '+inf', lo, 'WITHSCORES', 'LIMIT', slack, '1')
      sc.wea = num(e[2]) or -1
    end
  end

  -- add the cost's window entries at time t; members come from the scope's
  -- sequence (started at the current time, so they never meet members of an
  -- expired log); returns the first and last member
  add_entries = function(sc, key, t)
    local seq = sc.n or now
    local first = seq + 1
    local z = {}
    for c = 1, E.cost do
      seq = seq + 1
      z[#z + 1] = fmt(t)
      z[#z + 1] = fmt(seq)
      if #z >= 2000 or c == E.cost then
        call('ZADD', key, unpack(z))
        z = {}
      end
    end
    sc.n = seq
    return first, seq
  end
end

if has[3] then
  -- quota: the window of the bounds that holds time t
  win_index = function(bounds, t)
    for j = 1, #bounds - 1 do
      if bounds[j] <= t and t < bounds[j + 1] then
        return j
      end
    end
    return nil
  end

  -- quota: the count of the window starting at start
  used = function(sc, start)
    if sc.qa == start then return sc.qc end
    if sc.qb == start then return sc.qd end
    return 0
  end
end

if has[4] then
  -- concurrency: count the live slots (sc.live, sc.mine); the slots are
  -- listed only when one may have run out (or, with need_soonest, to know
  -- which ends first); a listing also finds the stale ones (other than the
  -- job's own) to remove
  count_holders = function(sc, need_soonest)
    if sc.live and (sc.soonest or not need_soonest or not sc.st) then
      return
    end
    if not sc.live and sc.hc == 0 then
      sc.live, sc.mine = 0, false
      return
    end
    if not sc.live and sc.hm > now and not need_soonest then
      sc.live, sc.mine = sc.hc, sc.hend ~= false
      return
    end
    local live, soonest, stale = 0, false, {}
    local cursor = '0'
    repeat
      local res = call('HSCAN', sc.st, cursor, 'MATCH', 'h:*', 'COUNT', '1000')
      cursor = res[1]
      local kv = res[2]
      for i = 1, #kv, 2 do
        local e = slot_lease(kv[i + 1])
        if e > now then
          live = live + 1
          if not soonest or e < soonest then soonest = e end
        elseif kv[i] ~= E.hkey then
          stale[#stale + 1] = kv[i]
        end
      end
    until cursor == '0'
    if not sc.live then
      sc.live, sc.stale = live, stale
      sc.mine = sc.hend ~= false and sc.hend > now
    end
    sc.soonest = soonest
  end

  -- is the job denied a concurrency slot in this scope?
  full = function(sc)
    count_holders(sc, false)
    if not sc.mine and sc.live >= sc.pol.clim then
      count_holders(sc, true)
      return true
    end
    return false
  end

  -- How long until every scope has a concurrency slot for the job (false:
  -- now), at most cap when cap is given (a slot freed by a release is not
  -- announced to a job that waits in a worker), and the rule that makes it
  -- wait.
  conc_wait = function(scopes, cap)
    local cwait, rule = false, 0
    for s = 1, #scopes do
      local sc = scopes[s]
      if sc.pol.clim > 0 and full(sc) then
        local w = sc.soonest - now
        if cap then w = min(w, cap) end
        if not cwait or w > cwait then
          cwait, rule = w, 4 * 65536 + s
        end
      end
    end
    return cwait, rule
  end
end

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

-- a local scope's state, from its keys (its claim token only for the steps
-- of a two-scope admission: their undo records give it back), or from v,
-- the quick path's read of the same fields
local function read_state(sc, k, claims, v)
  local pol = sc.pol
  sc.k, sc.st = k, KEYS[k + 1]
  if pol.wlim > 0 then sc.wp, sc.wa = KEYS[k + 2], KEYS[k + 3] end
  local j
  if pol.clim > 0 then
    v = v or call('HMGET', sc.st, 'cd', 's', 'x', 'rn', E.rkey, E.hkey, unpack(pol.fields))
    local slot = v[6]
    sc.hend, j = slot and slot_lease(slot) or false, 7
    if claims then sc.htok = slot and slot_claim(slot) end
  else
    v = v or call('HMGET', sc.st, 'cd', 's', 'x', 'rn', E.rkey, unpack(pol.fields))
    j = 6
  end
  sc.cd, sc.starts, sc.x = num(v[1]) or 0, num(v[2]) or 0, num(v[3]) or 0
  sc.rn = num(v[4]) or 0
  local m = sc
  for i = 1, pol.nr do
    local P = num(v[j]) or 0
    local A = v[j + 1]
    if A then
      sc.astored = sc.astored or {}
      sc.astored[i] = true
      A = num(A)
    else
      A = P -- a started meter equal to its planned one is not stored
    end
    -- the interval the meters were last charged at: a policy change
    -- re-times what they hold ahead of now to the new interval, so that a
    -- raised rate speeds up at once and a lowered one slows down at once;
    -- the re-timed meters are kept at once (a dry run excepted), or every
    -- read would re-time from its own now and never drain (the interval is
    -- compared as text: the same one needs no conversion)
    local I, unit = v[j + 2], pol.unit[i]
    if I ~= ARGV[pol.uarg[i]] then
      I = num(I)
      if I and I > 0 and (P > now or A > now) then
        if P > now then P = now + floor((P - now) * (unit / I)) end
        -- the started meter holds starts decided already (a job decided
        -- once starts on its decision): a raised rate does not move them
        -- closer, a lowered one spaces what follows them
        if A > now and unit > I then A = now + floor((A - now) * (unit / I)) end
        if not E.dry then
          local f = pol.fields
          call('HSET', sc.st, f[3 * i - 2], fmt(P), f[3 * i - 1], fmt(A), f[3 * i], ARGV[pol.uarg[i]])
          sc.astored = sc.astored or {}
          sc.astored[i] = true
        end
      end
      if E.dry or not (I and I > 0 and (P > now or A > now)) then
        sc.inew = sc.inew or {}
        sc.inew[i] = true
      end
    end
    if E.ticket then
      -- the job's own charges, decided once for its slot E.ticket (the
      -- started meter's E.tslack after it), are taken back where they are
      -- the last (no one was charged after it)
      local inc = m[3 * i - 2]
      if P == E.ticket + inc then P = E.ticket end
      if A == E.ticket + E.tslack + inc then A = E.ticket + E.tslack end
      sc.astored = sc.astored or {}
      sc.astored[i] = true
    end
    m[3 * i - 1], m[3 * i] = P, A
    j = j + 3
  end
  if pol.wlim > 0 then
    sc.n = num(v[j]) or false
    j = j + 1
  end
  if pol.qlim > 0 then
    sc.qa, sc.qc = num(v[j]) or 0, num(v[j + 1]) or 0
    sc.qb, sc.qd = num(v[j + 2]) or 0, num(v[j + 3]) or 0
    j = j + 4
  end
  if pol.clim > 0 then
    sc.hc, sc.hm, sc.y = num(v[j]) or 0, num(v[j + 1]) or 0, num(v[j + 2]) or 0
  end
  -- the job's own reservation, if it is still good
  local r = num(v[5])
  sc.Rraw = r or false
  if r then
    grace = grace or num(ARGV[4])
    if r + grace <= now then
      r = false -- expired: the job is treated as new
    elseif sc.cd > now and r < sc.cd then
      r = false -- a cooldown began before the slot: take a new one after it
    elseif pol.qlim > 0 and r <= now and win_index(pol.bounds, r) ~= pol.cur then
      r = false -- the slot's quota window is over
    end
  end
  sc.R = r or false
end

-- The decision over every scope of the op, without writing anything:
-- allowed, retry-after, slot, what to write ('reserve', 'start' or false)
-- and the rule.
local function decide(scopes)
  -- S: the earliest time every scope allows the job; rule, ridx and rscope
  -- name what pushed it furthest
  local S = max(now, E.not_before)
  local rule, ridx, rscope = 0, 0, 0
  for s = 1, #scopes do
    local sc = scopes[s]
    local pol = sc.pol
    if sc.cd > now and sc.cd > S then
      S, rule, ridx, rscope = sc.cd, 64, 0, s
    end
    if sc.R then
      if sc.R > S then
        S, rule, ridx, rscope = sc.R, 65, 0, s
      end
    else
      local m = sc
      for i = 1, pol.nr do
        local t = m[3 * i - 1] + m[3 * i - 2] - pol.off[i]
        if E.once then
          -- decided once: the job starts at its slot on both meters
          t = max(t, m[3 * i] + m[3 * i - 2] - pol.off[i])
        end
        if t > S then
          S, rule, ridx, rscope = t, 1, i, s
        end
      end
      if pol.wlim > 0 then
        if sc.st then window_entries(sc, E.once) end
        -- first in, first out: never before the last planned entry
        local t = sc.wtop
        if sc.we >= 0 then t = max(t, sc.we + pol.wdur) end
        if E.once and sc.wea >= 0 then t = max(t, sc.wea + pol.wdur) end
        if t > S then
          S, rule, ridx, rscope = t, 2, 0, s
        end
      end
    end
  end
  -- quota: move S to the first window with room; only the current and the
  -- next window are kept, so a slot further out is not reservable
  local beyond = false
  local changed = true
  while changed do
    changed = false
    for s = 1, #scopes do
      local sc = scopes[s]
      local pol = sc.pol
      if pol.qlim > 0 and not sc.R then
        local b = pol.bounds
        local w = win_index(b, S)
        while true do
          if w == nil or w > pol.cur + 1 then
            beyond = true
            break
          end
          if used(sc, b[w]) + E.cost <= pol.qlim then break end
          w = w + 1
          if w > #b then
            beyond = true
            break
          end
          if b[w] > S then
            S, rule, ridx, rscope = b[w], 3, 0, s
            changed = true
          end
        end
      end
    end
  end

  local allowed, retry, slot, write = false, 0, 0, false
  if E.promote then
    -- may the job leave its line? Its slot must be due within the lead and
    -- a concurrency slot free; it takes both, and the gate starts it on
    -- them. retry is when to look again.
    if beyond then
      -- past the quota windows this call knows: look again in a while
      horizon = horizon or num(ARGV[3])
      return false, horizon, 0, false, rule * 65536 + ridx * 256 + rscope
    end
    if S > now + E.lead then
      return false, S - E.lead - now, 0, false, rule * 65536 + ridx * 256 + rscope
    end
    local cwait, crule = false, 0
    if has[4] then cwait, crule = conc_wait(scopes, false) end
    if cwait then
      return false, cwait, 0, false, crule
    end
    if E.once then
      -- how late the job may start: its started meters are charged that
      -- much after its slot, from the burst left (so that the starts that
      -- follow are not held back), plus the started meters' tolerance
      local slack, tol = SLACK_MAX, false
      tolerance = tolerance or num(ARGV[5])
      for s = 1, #scopes do
        local sc = scopes[s]
        local pol = sc.pol
        for i = 1, pol.nr do
          -- the burst left after the job, less two starts' worth: a small
          -- burst gets no slack (its starts that follow at once would wait)
          local inc = sc[3 * i - 2]
          local room = S + pol.off[i] - inc - max(sc[3 * i], S) - 2 * inc
          slack = min(slack, max(0, floor(room / 8)))
          local t = min(tolerance, floor(pol.unit[i] / 4))
          tol = tol and min(tol, t) or t
        end
      end
      if not tol then
        E.slack, E.late = 0, -1
      elseif slack >= SLACK_MIN then
        E.slack, E.late = slack, slack + tol
      else
        -- near its limits: no slack to be late with, so the gate decides
        -- when the job starts, on the reservation it takes here
        E.slack, E.late = 0, -2
        return true, 0, S, 'promote', 0
      end
      return true, 0, S, 'startat', 0
    end
    -- a reservation: the gate decides at its slot
    E.slack, E.late = 0, -2
    return true, 0, S, 'promote', 0
  end
  if S > now then
    retry = S - now
    horizon = horizon or num(ARGV[3])
    if E.reserve and not beyond and retry <= horizon then
      slot, write = S, 'reserve'
    elseif retry > horizon then
      retry = horizon
    end
  elseif E.plan then
    -- the slot is due now; take it without starting (shaping at enqueue)
    allowed, slot, write = true, now, 'reserve'
    rule, ridx, rscope = 0, 0, 0
  else
    -- due now: concurrency, then the started meters
    local cwait, crule = false, 0
    if E.hold and has[4] then
      conc_retry = conc_retry or num(ARGV[6])
      cwait, crule = conc_wait(scopes, conc_retry)
    end
    if cwait then
      retry = cwait
      rule, ridx, rscope = floor(crule / 65536), floor(crule / 256) % 256, crule % 256
    else
      local w = 0
      rule, ridx, rscope = 0, 0, 0
      for s = 1, #scopes do
        local sc = scopes[s]
        local pol = sc.pol
        local m = sc
        for i = 1, pol.nr do
          tolerance = tolerance or num(ARGV[5])
          local tol = min(tolerance, floor(pol.unit[i] / 4))
          local over = max(m[3 * i], now) + m[3 * i - 2] - now - pol.off[i] - tol
          if over > w then
            w, rule, ridx, rscope = over, 1, i, s
          end
        end
        if pol.wlim > 0 then
          if sc.st then window_entries(sc, true) end
          if sc.wea >= 0 and sc.wea + pol.wdur - now > w then
            w, rule, ridx, rscope = sc.wea + pol.wdur - now, 2, 0, s
          end
        end
      end
      if w > 0 and E.wait and rule == 1 and w <= E.wait then
        -- a few moments early for a rate's started meter, and the caller
        -- waits: allowed at its time, charged then (WAIT)
        allowed, write, slot, E.slack = true, 'startat', now + w, 0
        rule, ridx, rscope = 0, 0, 0
      elseif w > 0 then
        -- a few moments early for the started meter: keep the place in line
        retry = w
        if E.reserve and not E.dry then
          slot, write = now, 'reserve'
        end
      else
        allowed, write = true, 'start'
      end
    end
  end
  return allowed, retry, slot, write, rule * 65536 + ridx * 256 + rscope
end

-- the meters and counts of a local scope into h (fields to HSET), and the
-- time its state needs to live without running jobs
local function meters_state(sc, h)
  local pol, m, need = sc.pol, sc, now
  for i = 1, pol.nr do
    local P, A = m[3 * i - 1], m[3 * i]
    local f = pol.fields
    h[#h + 1] = f[3 * i - 2]; h[#h + 1] = fmt(P)
    if A ~= P then
      h[#h + 1] = f[3 * i - 1]; h[#h + 1] = fmt(A)
    elseif sc.astored and sc.astored[i] then
      sc.hdel = sc.hdel or {}
      sc.hdel[#sc.hdel + 1] = f[3 * i - 1]
    end
    if sc.inew and sc.inew[i] then
      h[#h + 1] = f[3 * i]; h[#h + 1] = ARGV[pol.uarg[i]]
    end
    need = max(need, P, A)
  end
  if pol.qlim > 0 then
    h[#h + 1] = 'qa'; h[#h + 1] = fmt(sc.qa)
    h[#h + 1] = 'qc'; h[#h + 1] = fmt(sc.qc)
    h[#h + 1] = 'qb'; h[#h + 1] = fmt(sc.qb)
    h[#h + 1] = 'qd'; h[#h + 1] = fmt(sc.qd)
    local b = pol.bounds
    for j = 1, #b - 1 do
      if (b[j] == sc.qa and sc.qc > 0) or (b[j] == sc.qb and sc.qd > 0) then
        need = max(need, b[j + 1])
      end
    end
  end
  return need
end

-- Write the decision into every local scope: at t the planned meters of a
-- scope without a reservation, and the job's reservation ('reserve',
-- 'promote') or the start (the started meters: now for 'start', at t for
-- 'startat', a job decided once that starts at its slot t); the job's
-- concurrency slot ('start', 'startat', 'promote'); then persist.
-- Expiry only ever grows and only reclaims memory, but for y, the expiry
-- the state needs once no job runs (release.lua shortens the hash's life to
-- it when the last slot goes).
local function apply(scopes, write, t, noexpire)
  for s = 1, #scopes do
    local sc = scopes[s]
    if sc.st then
      local pol, m = sc.pol, sc
      -- the fields to write, built at the size most writes need
      local h = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
        nil, nil, nil, nil, nil, nil, nil, nil }
      local need = now
      if not sc.R then
        for i = 1, pol.nr do
          m[3 * i - 1] = max(m[3 * i - 1], t) + m[3 * i - 2]
        end
        if pol.wlim > 0 then
          sc.wpf, sc.wpl = add_entries(sc, sc.wp, t)
          need = t + pol.wdur
          if not noexpire then extend_to(sc.wp, t + pol.wdur) end
        end
        if pol.qlim > 0 then
          local start = pol.bounds[win_index(pol.bounds, t)]
          sc.qstart = start
          if sc.qa == start then sc.qc = sc.qc + E.cost
          elseif sc.qb == start then sc.qd = sc.qd + E.cost
          -- take the slot holding the older (ended) window, or an empty one
          elseif sc.qa == 0 or (sc.qb ~= 0 and sc.qa < sc.qb) then sc.qa, sc.qc = start, E.cost
          else sc.qb, sc.qd = start, E.cost end
        end
        sc.planned = true
      end
      if write == 'reserve' or write == 'promote' then
        if pol.reservable then
          if not sc.Rraw then sc.rn = sc.rn + 1 end
          sc.rtop = t
          h[1] = E.rkey; h[2] = fmt(t)
          grace = grace or num(ARGV[4])
          need = max(need, t + grace)
        end
      else
        local at = write == 'startat' and t + E.slack or now
        if pol.reservable or pol.clim > 0 then
          -- counted for sluice top; kept a few seconds past recovery
          sc.starts = sc.starts + 1
          h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts)
          need = max(need, now + 5000000)
        end
        for i = 1, pol.nr do
          m[3 * i] = max(m[3 * i], at) + m[3 * i - 2]
        end
        if pol.wlim > 0 then
          sc.waf, sc.wal = add_entries(sc, sc.wa, at)
          call('ZREMRANGEBYSCORE', sc.wa, '-inf', fmt(now - pol.wdur))
          need = max(need, at + pol.wdur)
          if not noexpire then extend_to(sc.wa, at + pol.wdur) end
        end
        if sc.Rraw then
          sc.dropR = true
          sc.hdel = sc.hdel or {}
          sc.hdel[#sc.hdel + 1] = E.rkey
          sc.rn = max(sc.rn - 1, 0)
        end
        sc.started = true
      end
      if sc.rn > 0 or sc.dropR then
        if sc.starts % 64 == 0 and sc.rn > 0 and write == 'start' then
          -- forget, a few at a time, reservations of jobs that never came back
          -- (rc, the sweep's cursor, is read only here)
          local res = call('HSCAN', sc.st, call('HGET', sc.st, 'rc') or '0', 'MATCH', 'r:*', 'COUNT', '64')
          h[#h + 1] = 'rc'; h[#h + 1] = res[1]
          local stale = {}
          local kv = res[2]
          for i = 1, #kv, 2 do
            grace = grace or num(ARGV[4])
            if num(kv[i + 1]) + grace <= now and kv[i] ~= E.rkey then
              stale[#stale + 1] = kv[i]
            end
          end
          if #stale > 0 then
            sc.rn = max(sc.rn - call('HDEL', sc.st, unpack(stale)), 0)
          end
        end
        h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
      end
      need = max(need, meters_state(sc, h))
      if pol.wlim > 0 then
        h[#h + 1] = 'n'; h[#h + 1] = fmt(sc.n or now)
        call('ZREMRANGEBYSCORE', sc.wp, '-inf', fmt(now - pol.wdur))
      end
      local held = 0
      if pol.clim > 0 then
        if write ~= 'reserve' and E.hold then
          -- take the job's slot: after a listing the stale slots go and hc
          -- counts the live; hm stays a lower bound of the earliest lease end
          local e = now + pol.lease
          local hc = sc.stale and sc.live or sc.hc
          if sc.mine then sc.kept = true else hc = hc + 1; sc.took = true end
          local hm
          if sc.stale then
            hm = min(sc.soonest or e, e)
          elseif sc.hc == 0 then
            hm = e
          else
            hm = min(sc.hm, e)
          end
          local es = fmt(e)
          h[#h + 1] = E.hkey; h[#h + 1] = slot_text(es, E.claim)
          -- a slot kept changes neither the count (unless a listing
          -- recounted it) nor, most often, the bound
          if sc.took or sc.stale then
            h[#h + 1] = 'hc'; h[#h + 1] = fmt(hc)
          end
          if hm ~= sc.hm or sc.stale then
            h[#h + 1] = 'hm'; h[#h + 1] = hm == e and es or fmt(hm)
          end
          if sc.stale and #sc.stale > 0 then
            sc.hdel = sc.hdel or {}
            for i = 1, #sc.stale do sc.hdel[#sc.hdel + 1] = sc.stale[i] end
          end
          sc.hc, sc.hm, sc.live, held = hc, hm, sc.live + (sc.mine and 0 or 1), e
        end
        if need + 1000000 > sc.y then
          -- like x below, moved a second further than needed: a busy scope
          -- writes it about once a second
          sc.y = need + 2000000
          h[#h + 1] = 'y'; h[#h + 1] = fmt(sc.y)
        end
      end
      if sc.hdel and #sc.hdel > 0 then
        for i = 1, #sc.hdel, 1000 do call('HDEL', sc.st, unpack(sc.hdel, i, min(i + 999, #sc.hdel))) end
      end
      -- the hash's expiry is moved a second past what is needed, so that a
      -- busy scope calls PEXPIRE about once a second, not every time
      local until_ = max(need, held)
      if until_ > sc.x and not noexpire then
        h[#h + 1] = 'x'; h[#h + 1] = fmt(until_ + 1000000)
        call('HSET', sc.st, unpack(h))
        extend_to(sc.st, until_ + 1000000)
      elseif #h > 0 then
        call('HSET', sc.st, unpack(h))
      end
    end
  end
end

-- The steps of a two-scope admission: a local scope's snapshot (what a
-- remote scope is made of), its undo record, and the undo. Made only when
-- an op asks for them.
local function twostep_functions()
  if E.twostep then return E.twostep end
  E.twostep = {}
  E.twostep.snapshot = function(sc)
    local pol, m = sc.pol, sc
    local out = { sc.cd, sc.R or -1 }
    for i = 1, pol.nr do
      out[#out + 1] = m[3 * i - 1]; out[#out + 1] = m[3 * i]
    end
    if pol.wlim > 0 then
      window_entries(sc, true)
      out[#out + 1] = sc.wtop; out[#out + 1] = sc.we; out[#out + 1] = sc.wea
    end
    if pol.qlim > 0 then
      out[#out + 1] = sc.qa; out[#out + 1] = sc.qc; out[#out + 1] = sc.qb; out[#out + 1] = sc.qd
    end
    if pol.clim > 0 then
      local f = full(sc)
      out[#out + 1] = sc.live; out[#out + 1] = sc.mine and 1 or 0
      out[#out + 1] = (f and sc.soonest) or -1
    end
    E.twostep.remember(sc)
    return out
  end
  -- what an undo record compares against
  E.twostep.remember = function(sc)
    local b = { R = sc.Rraw or -1 }
    for i = 1, 3 * sc.pol.nr do b[i] = sc[i] end
    sc.before = b
  end
  E.twostep.record = function(sc)
    local pol, m, b = sc.pol, sc, sc.before
    local what = 0
    if sc.planned then what = what + 1 end
    if sc.started then what = what + 2 end
    if sc.took then what = what + 4 end
    if sc.kept then what = what + 8 end
    local rec = { what, num(E.claim), b.R, sc.rtop or (sc.dropR and -1) or b.R }
    for i = 1, pol.nr do
      rec[#rec + 1] = b[3 * i - 1]; rec[#rec + 1] = m[3 * i - 1]
      rec[#rec + 1] = b[3 * i]; rec[#rec + 1] = m[3 * i]
    end
    if pol.wlim > 0 then
      rec[#rec + 1] = sc.wpf or 0; rec[#rec + 1] = sc.wpl or -1
      rec[#rec + 1] = sc.waf or 0; rec[#rec + 1] = sc.wal or -1
    end
    if pol.qlim > 0 then rec[#rec + 1] = sc.qstart or 0 end
    if pol.clim > 0 then
      rec[#rec + 1] = sc.hend or -1; rec[#rec + 1] = sc.htok or -1
    end
    return rec
  end
  -- Take back what an earlier op wrote to a local scope: exactly, as long
  -- as nothing else changed the same fields since. A meter charged since
  -- on top of ours gives back the increment on the planned meter (it only
  -- plans: the started one decides) and keeps it on the started meter, at
  -- most one interval ahead, counted in u.
  E.twostep.undo = function(sc, noexpire)
    local pol, m = sc.pol, sc
    local what, token, Rb, Ra = next_int(), next_int(), next_int(), next_int()
    local planned, started = what % 2 == 1, floor(what / 2) % 2 == 1
    local h = {}
    local leftover = false
    for i = 1, pol.nr do
      local Pb, Pa, Ab, Aa = next_int(), next_int(), next_int(), next_int()
      local P, A = m[3 * i - 1], m[3 * i]
      if planned then
        if P == Pa then P = Pb else P = max(P - m[3 * i - 2], Pb) end
      end
      if started then
        if A == Aa then A = Ab else leftover = true end
      end
      m[3 * i - 1], m[3 * i] = P, A
    end
    if pol.wlim > 0 then
      for _, key in ipairs({ sc.wp, sc.wa }) do
        local from, to = next_int(), next_int()
        -- in pieces: Lua's unpack refuses about 8,000 values
        local z = {}
        for seq = from, to do
          z[#z + 1] = fmt(seq)
          if #z == 1000 or seq == to then
            call('ZREM', key, unpack(z))
            z = {}
          end
        end
      end
    end
    if pol.qlim > 0 then
      local start = next_int()
      if planned and start > 0 then
        if sc.qa == start then sc.qc = max(sc.qc - E.cost, 0) end
        if sc.qb == start then sc.qd = max(sc.qd - E.cost, 0) end
      end
    end
    if pol.clim > 0 then
      -- a slot this op took is given back, a slot it kept gets back its
      -- lease and claim, as long as the op's claim still holds it
      local hend, htok = next_int(), next_int()
      if sc.htok == token then
        if floor(what / 4) % 2 == 1 then
          sc.hdel = sc.hdel or {}
          sc.hdel[#sc.hdel + 1] = E.hkey
          h[#h + 1] = 'hc'; h[#h + 1] = fmt(max(sc.hc - 1, 0))
        elseif floor(what / 8) % 2 == 1 then
          h[#h + 1] = E.hkey; h[#h + 1] = slot_text(fmt(hend), fmt(htok))
        end
      end
    end
    meters_state(sc, h)
    if started and sc.starts > 0 then
      h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts - 1)
    end
    local r = sc.Rraw or -1
    if r == Ra and Ra ~= Rb then
      if Rb >= 0 then
        h[#h + 1] = E.rkey; h[#h + 1] = fmt(Rb)
        if Ra < 0 then sc.rn = sc.rn + 1 end
      else
        sc.hdel = sc.hdel or {}
        sc.hdel[#sc.hdel + 1] = E.rkey
        sc.rn = max(sc.rn - 1, 0)
      end
      h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
      -- a reservation put back keeps the hash alive through its grace
      grace = grace or num(ARGV[4])
      if Rb >= 0 and not noexpire then
        extend_to(sc.st, Rb + grace)
        if pol.clim > 0 then
          h[#h + 1] = 'y'; h[#h + 1] = fmt(max(sc.y, Rb + grace + 1000000))
        end
      end
    end
    if leftover then
      h[#h + 1] = 'u'; h[#h + 1] = fmt((num(call('HGET', sc.st, 'u')) or 0) + 1)
    end
    if sc.hdel and #sc.hdel > 0 then call('HDEL', sc.st, unpack(sc.hdel)) end
    if #h > 0 and call('EXISTS', sc.st) == 1 then call('HSET', sc.st, unpack(h)) end
  end
  return E.twostep
end


-- The waiting room's ops (arrive, promote, release), made only when an op
-- asks for them. bases are the op's local scopes, the tenant's first: each
-- {pol, k}.
local function room_functions(ts)
  if E.room then return E.room end
  E.room = {}
  -- @include release_slot (the release of one scope's slot, from release.lua)
  -- a local scope read afresh for a job of cost c
  local function scope_at(base, c)
    local pol = base.pol
    local sc = scope(pol, c)
    read_state(sc, base.k, true)
    return sc
  end
  -- a line entry: LINED_MS, COST (empty: 1), QUEUE (empty: default), ID,
  -- separated by the byte 31
  local SEP = string.char(31)
  local function parse(m)
    local a1 = m:find(SEP, 1, true)
    local a2 = m:find(SEP, a1 + 1, true)
    local a3 = m:find(SEP, a2 + 1, true)
    return num(m:sub(1, a1 - 1)), num(m:sub(a1 + 1, a2 - 1)) or 1, m:sub(a3 + 1)
  end

  -- does the job hold a live concurrency slot in one of the scopes (it is
  -- running, or handed to asynq already)?
  local function running(scopes)
    for s = 1, #scopes do
      local sc = scopes[s]
      if sc.pol.clim > 0 and sc.hend and sc.hend > now then return true end
    end
    return false
  end

  -- Promote from the line's head while the job may start (its slot due
  -- within the lead, a concurrency slot free), the tenant's deficit covers
  -- its cost and the budget lasts: each takes its slot and its concurrency
  -- slot and moves to the handing set. A job that holds a live slot
  -- already (it runs, brought by asynq's fallback) leaves the line and is
  -- counted, whatever it costs. The deficit (deficit round robin) counts
  -- cost where a rule of the tenant's scopes counts it (rate, window,
  -- quota: a job's cost is bounded by them), and each job as one where
  -- none does (concurrency only, or no rule: a cost is unbounded there);
  -- it carries over while the head's cost exceeds it, so a costly head is
  -- served within cost / quantum turns, and a head its rules hold back
  -- keeps what it is owed (up to its cost). Returns the promoted jobs,
  -- the handovers to retry, when the tenant is next due (-1: never), how
  -- many wait, when the head was lined (ms; -1: none) and how many
  -- entries were skipped.
  E.room.promote = function(bases, line, handing, qset, queue, budget, quantum, repair, noexpire, base_claim)
    local st = KEYS[bases[1].k + 1]
    local out, retries = {}, {}
    -- handovers not confirmed in time are handed over again (and held a
    -- while, so that one pump does it)
    local stale = call('ZRANGEBYSCORE', handing, '-inf', fmt(now - repair), 'LIMIT', '0', '100')
    for i = 1, #stale do
      retries[i] = stale[i]
      call('ZADD', handing, 'XX', fmt(now), stale[i])
    end
    -- a tenant whose scopes have no rules is charged nothing: its jobs
    -- leave the line in turn, unless it cools down
    local plain, costed = true, false
    for s = 1, #bases do
      local pol = bases[s].pol
      if pol.nr + pol.wlim + pol.qlim + pol.clim > 0 then plain = false end
      if pol.nr + pol.wlim + pol.qlim > 0 then costed = true end
    end
    local dfield = 'd:' .. queue
    local v = call('HMGET', st, dfield, 'cd')
    -- a negative deficit is a turn the budget (the fleet's room) cut
    -- short: it goes on with what is left, without a new quantum
    local dq0 = num(v[1]) or 0
    local resumed = dq0 < 0
    if resumed then dq0 = -dq0 end
    local dq = resumed and dq0 or dq0 + quantum
    local midturn = false
    local due, head = -1, -1
    local np, skipped = 0, 0
    local cd = plain and num(v[2]) or 0
    if cd > now + E.lead then
      budget = 0
      due = cd - E.lead
    end
    while true do
      local m = call('LINDEX', line, '0')
      if not m then
        dq = 0
        call('SREM', qset, queue)
        break
      end
      local lined, c, jid = parse(m)
      local rc = costed and c or 1
      head = lined
      local scopes, run = false, false
      if np < budget and not plain then
        E.id, E.cost, E.claim = jid, c, fmt(base_claim + np)
        E.rkey, E.hkey = 'r:' .. jid, 'h:' .. jid
        E.reserve, E.hold, E.dry, E.plan, E.not_before, E.promote = true, true, false, false, 0, true
        scopes = {}
        for s = 1, #bases do scopes[s] = scope_at(bases[s], c) end
        run = running(scopes)
      end
      if not run and (np >= budget or rc > dq) then
        -- the deficit carries over only what a costly head is owed, or
        -- the rest of a turn the budget cut short
        if np >= budget and rc <= dq and not run then
          midturn = true
        elseif np >= budget then
          dq = min(dq, quantum)
        end
        if due < 0 then due = now end
        break
      end
      if plain then
        call('LPOP', line)
        call('ZADD', handing, fmt(now), m)
        dq = dq - rc
        np = np + 1
        out[np] = { m, now, 0, {}, -1, 0 }
      else
        if run then
          call('LPOP', line)
          skipped = skipped + 1
        else
          local ok, wait, slot, write = decide(scopes)
          if not ok then
            -- held back by its own limits: it keeps what it is owed
            due, dq = now + wait, min(dq, rc)
            break
          end
          for s = 1, #scopes do ts.remember(scopes[s]) end
          apply(scopes, write, slot, noexpire)
          local recs = {}
          for s = 1, #scopes do recs[s] = ts.record(scopes[s]) end
          call('LPOP', line)
          call('ZADD', handing, fmt(now), m)
          dq = dq - rc
          np = np + 1
          out[np] = { m, slot, num(E.claim), recs, E.late, E.slack }
        end
      end
      head = -1
    end
    E.promote = false
    -- a handover not confirmed yet keeps the tenant due for its retry
    local first = call('ZRANGE', handing, '0', '0', 'WITHSCORES')
    if first[2] then
      local r = num(first[2]) + repair
      if due < 0 or r < due then due = r end
    end
    if dq > 0 then
      call('HSET', st, dfield, fmt(midturn and -dq or dq))
    elseif dq0 > 0 then
      call('HDEL', st, dfield)
    end
    return out, retries, due, call('LLEN', line), head, skipped, midturn and 1 or 0
  end

  -- A new job, not yet in asynq: may it go straight to asynq's pending
  -- list? Only when the tenant's line is empty, the fleet has room
  -- (may_go) and the job may start within the lead; then it takes its slot
  -- and its concurrency slot now. Returns the verdict (1 straight, 0 it
  -- waits, -1 the line is at its cap), the slot, how many wait and, for a
  -- job sent straight, its undo records.
  E.room.arrive = function(scopes, line, may_go, cap)
    local waiting = call('LLEN', line)
    if cap > 0 and waiting >= cap then
      return -1, 0, waiting, {}, -1, 0
    end
    if waiting > 0 or not may_go then
      return 0, 0, waiting, {}, -1, 0
    end
    E.promote = true
    local ok, _, slot, write = decide(scopes)
    E.promote = false
    if not ok then
      return 0, 0, waiting, {}, -1, 0
    end
    if running(scopes) then
      -- the same job admitted already: it is not sent again
      return 0, 0, waiting, {}, -1, 0
    end
    local plain = true
    for s = 1, #scopes do
      local pol = scopes[s].pol
      if pol.nr + pol.wlim + pol.qlim + pol.clim > 0 then plain = false end
    end
    if plain then
      return 1, now, 0, {}, -1, 0
    end
    for s = 1, #scopes do ts.remember(scopes[s]) end
    apply(scopes, write, slot, false)
    local recs = {}
    for s = 1, #scopes do recs[s] = ts.record(scopes[s]) end
    return 1, slot, 0, recs, E.late, E.slack
  end

  -- Give back the job's concurrency slots under its claim (0: whichever
  -- admission holds them); the hash of a scope whose last slot goes lives
  -- only as long as the rest of its state needs (y).
  E.room.release = function(bases, noexpire)
    local released, lost = 0, 0
    for s = 1, #bases do
      if bases[s].pol.clim > 0 then
        local r = release_slot(KEYS[bases[s].k + 1], E.hkey, E.claim, noexpire)
        if r > 0 then released = released + 1 elseif r < 0 then lost = lost + 1 end
      end
    end
    return released, lost
  end
  return E.room
end

local out = {}

-- The quick path: the commonest admission, a job of cost 1 in one local
-- scope whose policy has at most one rate and a concurrency rule, allowed
-- at once. It reads the scope as read_state does (the same fields, in the
-- same order), makes decide's checks and apply's writes with locals (the
-- general engine's tables cost the decision about a third), and answers
-- as the general engine does. Anything else (a denial, a reservation, a
-- cooldown, an interval change, slots to list, a sweep due) is left to the
-- general engine before anything is written: quick then returns its read,
-- which read_state takes instead of reading again. TestQuickPath holds the
-- two to the same decisions and the same state.
local function quick(pol, st, flags, o)
  local id, nr, clim = E.id, pol.nr, pol.clim
  local v, hkey
  if clim > 0 then
    hkey = 'h:' .. id
    v = call('HMGET', st, 'cd', 's', 'x', 'rn', 'r:' .. id, hkey, unpack(pol.fields))
  else
    v = call('HMGET', st, 'cd', 's', 'x', 'rn', 'r:' .. id, unpack(pol.fields))
  end
  -- a reservation, a cooldown or a job not to start yet: decide
  if v[5] or (v[1] and num(v[1]) > now) or E.not_before > now then return v end
  local j = clim > 0 and 7 or 6
  local P, A, inc, off, astored, inew
  if nr == 1 then
    -- the meters, charged at the policy's interval (or new)
    inew = not v[j + 2]
    if not inew and v[j + 2] ~= ARGV[pol.uarg[1]] then return v end
    inc, off = pol.unit[1], pol.off[1]
    P, astored = num(v[j]) or 0, v[j + 1]
    A = astored and num(astored) or P
    if P + inc - off > now then return v end
    tolerance = tolerance or num(ARGV[5])
    if max(A, now) + inc - now - off - min(tolerance, floor(inc / 4)) > 0 then return v end
    j = j + 3
  end
  -- the live slots, known without a listing (hc 0, or hm still ahead)
  local hold = flags % 4 >= 2
  local hc, hm, live, mine = 0, 0, 0, false
  if clim > 0 then
    hc = num(v[j]) or 0
    if hc > 0 then
      hm = num(v[j + 1]) or 0
      if hm <= now then return v end
      live, mine = hc, v[6] ~= false
    end
    if hold and not mine and live >= clim then return v end
  end
  local starts, rn = num(v[2]) or 0, num(v[4]) or 0
  if rn > 0 and (starts + 1) % 64 == 0 then return v end
  -- allowed: the fields apply would write, in one HSET
  local h = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    nil, nil }
  local n, need = 0, now
  if nr == 1 then
    P, A = max(P, now) + inc, max(A, now) + inc
    h[1], h[2], n = 'p1', fmt(P), 2
    if A ~= P then
      h[3], h[4], n = 'a1', fmt(A), 4
    elseif astored then
      call('HDEL', st, 'a1')
    end
    if inew then h[n + 1], h[n + 2], n = 'i1', ARGV[pol.uarg[1]], n + 2 end
    need = max(P, A)
  end
  h[n + 1], h[n + 2], n = 's', fmt(starts + 1), n + 2
  need = max(need, now + 5000000)
  if rn > 0 then h[n + 1], h[n + 2], n = 'rn', v[4], n + 2 end
  local held = 0
  if clim > 0 then
    if hold then
      held = now + pol.lease
      local es = fmt(held)
      h[n + 1], h[n + 2], n = hkey, slot_text(es, E.claim), n + 2
      if not mine then
        h[n + 1], h[n + 2], n = 'hc', fmt(hc + 1), n + 2
        live = live + 1
      end
      if hc == 0 or held < hm then h[n + 1], h[n + 2], n = 'hm', es, n + 2 end
    end
    if need + 1000000 > (num(v[j + 2]) or 0) then
      h[n + 1], h[n + 2], n = 'y', fmt(need + 2000000), n + 2
    end
  end
  local until_ = max(need, held)
  if until_ > (num(v[3]) or 0) and floor(flags / 16) % 2 == 0 then
    h[n + 1], h[n + 2] = 'x', fmt(until_ + 1000000)
    call('HSET', st, unpack(h))
    extend_to(st, until_ + 1000000)
  else
    call('HSET', st, unpack(h))
  end
  -- what is left, as the general engine reports it
  local remaining, reset, inflight = -1, -1, -1
  if nr == 1 then
    remaining, reset = max(floor((now + off - P) / inc), 0), P - now
  end
  if clim > 0 then
    local left = max(clim - live, 0)
    if remaining < 0 or left < remaining then remaining = left end
    inflight = live
  end
  out[o] = format('%d %d %d', remaining, reset, inflight)
  return false
end

local k = 0
for o = 1, nops do
  E.id, E.claim = ARGV[E.a], ARGV[E.a + 4]
  E.cost, E.not_before = int(ARGV[E.a + 1]), int(ARGV[E.a + 3])
  local flags = num(ARGV[E.a + 2])
  local nscopes = int(ARGV[E.a + 5])
  E.a = E.a + 6
  E.ticket, E.wait = false, false
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
  -- reserve, hold, no expiry and probe, which changes nothing for a job
  -- that starts)
  local read = true
  if nscopes == 1 and flags % 65536 < 64 and flags % 16 < 4 then
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
    local line, intents = KEYS[k + 1], KEYS[k + 2]
    k = k + 2
    local may_go, cap = next_int() == 1, next_int()
    E.lead = next_int()
    local entry = ARGV[E.a]
    E.a = E.a + 1
    local verdict, slot, waiting, recs, late, slack = rm.arrive(scopes, line, may_go, cap)
    -- a job that waits is parked next, then joins its line (line.lua takes
    -- its intent back): should its producer die in between, the sweep
    -- finds the intent; one an earlier arrival left is kept
    local earlier = 0
    if verdict == 0 and call('ZADD', intents, 'NX', fmt(now), entry) == 0 then earlier = 1 end
    out[o] = { verdict, slot, waiting, recs, late, slack, earlier }
  elseif roomop then
    local budget, quantum, repair = next_int(), next_int(), next_int()
    E.lead = next_int()
    local line, handing, qset, queue
    if budget > 0 then
      line, handing, qset = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
      queue = ARGV[E.a]
      E.a = E.a + 1
      k = k + 3
    end
    local released, lost = 0, 0
    if is_release then
      released, lost = rm.release(bases, noexpire)
    end
    if budget > 0 then
      local promoted, retries, due, waiting, head, skipped, midturn =
        rm.promote(bases, line, handing, qset, queue, budget, quantum, repair, noexpire, num(E.claim) + 1)
      out[o] = { promoted, retries, due, waiting, head, skipped, released, lost, midturn }
    else
      out[o] = { {}, {}, -1, -1, -1, 0, released, lost, 0 }
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
    out[o] = { 0, 0, 0, -1, -1, -1, 0 }
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
    if allowed then verdict = 1 end
    if wrote then verdict = verdict + 2 end
    if conflict then verdict = verdict + 4 end
    out[o] = { verdict, retry, rule, remaining, reset, inflight, slot }
    if steps then
      local recs = {}
      for s = 1, nscopes do
        local sc = scopes[s]
        if sc.st then recs[#recs + 1] = wrote and ts.record(sc) or {} end
      end
      out[o][8] = snaps
      out[o][9] = recs
    end
  end
  end
  end
end

out[nops + 1] = now
return out
