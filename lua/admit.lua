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
-- Several jobs may be decided in one call (ops). All times are integers in
-- microseconds.
--
-- KEYS: for every op, 3 per local scope, in order:
--   [1] state hash: cd cooldown end; s jobs started; x the expiry last given
--     to the hash; y the expiry its state needs without running jobs; rn
--     reservations and rc a cursor sweeping stale ones; r:<job> a job's
--     reserved slot; u charges a two-step undo could not take back; and the
--     fields of the rule kinds below
--   [2] planned window zset, [3] started window zset (score: start time)
-- ARGV:
--   [1] clock: the time to decide at, or -1 for Redis TIME
--   [2] number of ops
--   [3] horizon, [4] reservation grace, [5] started-meter tolerance,
--   [6] longest retry-after of a concurrency denial
--   [7] number of policies, then per policy: number of rules, then per rule
--     its kind and arguments (one block per kind below)
--   per op: job id, cost, flags, not_before, claim token, number of scopes,
--     then per scope: its policy's number (negative for a remote scope),
--     when the cost is not 1 the increment of each of the policy's rate
--     rules, and for a remote scope its snapshot
--     then with UNDO or UNDO_ONLY an undo record per local scope, and with
--     EXPECT the verdict the op must reach (allowed 0/1, slot)
--   flags: 1 reserve on denial, 2 hold a concurrency slot, 4 dry run (write
--     nothing), 8 plan only (take the slot, do not start), 16 set no expiry,
--     32 probe (write only when the job starts now), 64 two-step (return a
--     snapshot and an undo record of each local scope), 128 UNDO first,
--     256 EXPECT, 512 UNDO_ONLY (no decision)
-- Returns: per op {verdict, retry_after, rule * 65536 + rule_index * 256 +
--   scope, remaining, reset_after, in_flight, slot}, with two-step also
--   {snapshots} and {undo records}; then the time of the decisions
--   verdict: 1 allowed, 2 wrote, 4 conflict (EXPECT not met: nothing written
--     but the UNDO records)
--   rule: 0 none, 1 rate, 2 window, 3 quota, 4 concurrency, 5 cooldown,
--     6 reserved (the job's own slot is not due yet); rule_index is 1-based
--   remaining, reset_after, in_flight: -1 when no rule applies (local
--     scopes only)
--   slot: the job's reserved slot, 0 when none was taken
-- Errors: "ERR sluice: clock" when the time is outside the quota windows
--   given (the caller's clock estimate is off; it retries with fresh bounds).
--
-- Cost matters here: every redis.call and every number Redis has to print
-- is paid per decision, so numbers are formatted with %d (Redis would use
-- the slower %.17g) and a scope's state is read with one HMGET and written
-- with one HSET.

local call, tonumber, unpack, format = redis.call, tonumber, unpack, string.format
local floor, max, min = math.floor, math.max, math.min
local KEYS, ARGV = KEYS, ARGV
local num = tonumber

local function fmt(v)
  return format('%d', v)
end

local now
local clock = num(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = call('TIME')
  now = num(t[1]) * 1000000 + num(t[2])
end
local nops = num(ARGV[2])
local horizon, grace = num(ARGV[3]), num(ARGV[4])
local tolerance, conc_retry = num(ARGV[5]), num(ARGV[6])

-- decision rule codes
local R_RATE, R_WINDOW, R_QUOTA, R_CONC, R_COOL, R_RESV = 1, 2, 3, 4, 5, 6

local function bit(flags, b)
  return floor(flags / b) % 2 == 1
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

local function win_index(bounds, t)
  for j = 1, #bounds - 1 do
    if bounds[j] <= t and t < bounds[j + 1] then
      return j
    end
  end
  return nil
end

-- the snapshot and undo readers: n() takes the next number of the op's
-- arguments
local a = 7
local function n()
  local v = num(ARGV[a])
  a = a + 1
  return v
end

-- The rule kinds. Each kind reads its arguments (parse), names the hash
-- fields it reads (fields), reads them (load, or unsnap for a remote
-- scope), tells the earliest planned start it allows (earliest), how far
-- its started meter is ahead (started), charges a planned start (charge)
-- and a start (start), writes what changed (persist), reports what is left
-- (figures) and writes and takes back an undo record (record, undo).
-- Kinds without a part leave it out.
local KIND = {}

-- rate: a leaky bucket as a meter (GCRA); p<i> the planned meter, a<i> the
-- started one (not stored while equal to p<i>)
KIND[1] = {
  parse = function(pol, r)
    pol.nr = pol.nr + 1
    r.i, r.unit, r.off = pol.nr, n(), n()
    r.pf, r.af = 'p' .. r.i, 'a' .. r.i
    r.fields = { r.pf, r.af }
  end,
  load = function(sc, r, v, j)
    local P = num(v[j]) or 0
    local A = v[j + 1]
    if A then
      sc.astored[r.i] = true
      A = num(A)
    else
      A = P
    end
    sc.P[r.i], sc.A[r.i] = P, A
  end,
  snap = function(sc, r, out)
    out[#out + 1] = sc.P[r.i]; out[#out + 1] = sc.A[r.i]
  end,
  unsnap = function(sc, r)
    sc.P[r.i], sc.A[r.i] = n(), n()
  end,
  earliest = function(sc, r)
    return sc.P[r.i] + sc.inc[r.i] - r.off, R_RATE, r.i
  end,
  started = function(sc, r)
    local tol = min(tolerance, floor(r.unit / 4))
    return max(sc.A[r.i], now) + sc.inc[r.i] - now - r.off - tol, R_RATE, r.i
  end,
  charge = function(sc, r, t)
    sc.P[r.i] = max(sc.P[r.i], t) + sc.inc[r.i]
  end,
  start = function(sc, r)
    sc.A[r.i] = max(sc.A[r.i], now) + sc.inc[r.i]
  end,
  persist = function(sc, r, h)
    local P, A = sc.P[r.i], sc.A[r.i]
    h[#h + 1] = r.pf; h[#h + 1] = fmt(P)
    if A ~= P then
      h[#h + 1] = r.af; h[#h + 1] = fmt(A)
    elseif sc.astored[r.i] then
      sc.hdel[#sc.hdel + 1] = r.af
    end
    return max(P, A)
  end,
  figures = function(sc, r)
    local tat = max(sc.P[r.i], now)
    return max(floor((now + r.off - tat) / r.unit), 0), tat - now
  end,
  record = function(sc, r, rec)
    local b = sc.before
    rec[#rec + 1] = b.P[r.i]; rec[#rec + 1] = sc.P[r.i]
    rec[#rec + 1] = b.A[r.i]; rec[#rec + 1] = sc.A[r.i]
  end,
  -- a meter nobody charged since is put back; one charged since on top of
  -- ours has the increment taken off (the planned meter only plans: the
  -- started one decides, and is never lowered below what others need, so a
  -- started meter charged since stays charged and is counted in u)
  undo = function(sc, r, what, h)
    local Pb, Pa, Ab, Aa = n(), n(), n(), n()
    local P, A = sc.P[r.i], sc.A[r.i]
    if what % 2 == 1 then
      if P == Pa then P = Pb else P = max(P - sc.inc[r.i], Pb) end
    end
    if bit(what, 2) then
      if A == Aa then A = Ab else sc.leftover = true end
    end
    sc.P[r.i], sc.A[r.i] = P, A
    KIND[1].persist(sc, r, h)
  end,
}

-- window: an exact sliding window; n the entries' sequence
KIND[2] = {
  parse = function(pol, r)
    r.lim, r.dur = n(), n()
    r.fields = { 'n' }
    pol.window = r
  end,
  load = function(sc, r, v, j)
    sc.n = num(v[j]) or false
  end,
  -- the newest live planned entry, the entry whose leaving makes room for
  -- the job in the planned and in the started log
  query = function(sc, r)
    if sc.wtop == nil then
      local lo = fmt(now - r.dur + 1)
      local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
      local e = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', fmt(r.lim - sc.cost), '1')
      sc.wtop, sc.we = num(top[2]) or -1, num(e[2]) or -1
    end
  end,
  query_started = function(sc, r)
    if sc.wea == nil then
      local e = call('ZREVRANGEBYSCORE', sc.wa, '+inf', fmt(now - r.dur + 1), 'WITHSCORES', 'LIMIT', fmt(r.lim - sc.cost), '1')
      sc.wea = num(e[2]) or -1
    end
  end,
  snap = function(sc, r, out)
    KIND[2].query(sc, r)
    KIND[2].query_started(sc, r)
    out[#out + 1] = sc.wtop; out[#out + 1] = sc.we; out[#out + 1] = sc.wea
  end,
  unsnap = function(sc, r)
    sc.wtop, sc.we, sc.wea = n(), n(), n()
  end,
  earliest = function(sc, r)
    KIND[2].query(sc, r)
    -- first in, first out: never before the last planned entry
    local t = sc.wtop
    if sc.we >= 0 then t = max(t, sc.we + r.dur) end
    if t >= 0 then return t, R_WINDOW, 0 end
  end,
  started = function(sc, r)
    KIND[2].query_started(sc, r)
    if sc.wea >= 0 then return sc.wea + r.dur - now, R_WINDOW, 0 end
    return 0
  end,
  -- add the cost's entries at time t; members come from the scope's
  -- sequence (started at the current time, so they never meet members of
  -- an expired log)
  add = function(sc, key, t)
    local seq = sc.n or now
    local first = seq + 1
    local z = {}
    for c = 1, sc.cost do
      seq = seq + 1
      z[#z + 1] = fmt(t)
      z[#z + 1] = fmt(seq)
      if #z >= 2000 or c == sc.cost then
        call('ZADD', key, unpack(z))
        z = {}
      end
    end
    sc.n = seq
    return first, seq
  end,
  charge = function(sc, r, t)
    sc.wpf, sc.wpl = KIND[2].add(sc, sc.wp, t)
    sc.wtopw = t
  end,
  start = function(sc, r)
    sc.waf, sc.wal = KIND[2].add(sc, sc.wa, now)
    call('ZREMRANGEBYSCORE', sc.wa, '-inf', fmt(now - r.dur))
    sc.watop = now
  end,
  persist = function(sc, r, h, noexpire)
    h[#h + 1] = 'n'; h[#h + 1] = fmt(sc.n or now)
    call('ZREMRANGEBYSCORE', sc.wp, '-inf', fmt(now - r.dur))
    if not noexpire then
      if sc.wtopw then extend_to(sc.wp, sc.wtopw + r.dur) end
      if sc.watop then extend_to(sc.wa, sc.watop + r.dur) end
    end
    return max(sc.wtopw or 0, sc.watop or 0) + r.dur
  end,
  figures = function(sc, r)
    local lo = fmt(now - r.dur + 1)
    local left = max(r.lim - call('ZCOUNT', sc.wp, lo, '+inf'), 0)
    local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
    if top[2] then return left, num(top[2]) + r.dur - now end
    return left, 0
  end,
  record = function(sc, r, rec)
    rec[#rec + 1] = sc.wpf or 0; rec[#rec + 1] = sc.wpl or -1
    rec[#rec + 1] = sc.waf or 0; rec[#rec + 1] = sc.wal or -1
  end,
  undo = function(sc, r, what, h)
    for _, key in ipairs({ sc.wp, sc.wa }) do
      local from, to = n(), n()
      local m = {}
      for seq = from, to do m[#m + 1] = fmt(seq) end
      if #m > 0 then call('ZREM', key, unpack(m)) end
    end
  end,
}

-- quota: a count per calendar window; qa/qc and qb/qd two window starts
-- and their counts (the current window and the next are all it needs)
local function used(sc, start)
  if sc.qa == start then return sc.qc end
  if sc.qb == start then return sc.qd end
  return 0
end

local function add_used(sc, start, k)
  if sc.qa == start then sc.qc = sc.qc + k return end
  if sc.qb == start then sc.qd = sc.qd + k return end
  -- take the slot holding the older (ended) window, or an empty one
  if sc.qa == 0 or (sc.qb ~= 0 and sc.qa < sc.qb) then
    sc.qa, sc.qc = start, k
  else
    sc.qb, sc.qd = start, k
  end
end

KIND[3] = {
  parse = function(pol, r)
    r.lim = n()
    local b = {}
    for j = 1, n() do b[j] = n() end
    r.bounds = b
    r.cur = win_index(b, now)
    if not r.cur then
      return redis.error_reply('ERR sluice: clock')
    end
    r.fields = { 'qa', 'qc', 'qb', 'qd' }
    pol.quota = r
  end,
  load = function(sc, r, v, j)
    sc.qa, sc.qc = num(v[j]) or 0, num(v[j + 1]) or 0
    sc.qb, sc.qd = num(v[j + 2]) or 0, num(v[j + 3]) or 0
  end,
  snap = function(sc, r, out)
    out[#out + 1] = sc.qa; out[#out + 1] = sc.qc; out[#out + 1] = sc.qb; out[#out + 1] = sc.qd
  end,
  unsnap = function(sc, r)
    sc.qa, sc.qc, sc.qb, sc.qd = n(), n(), n(), n()
  end,
  charge = function(sc, r, t)
    sc.qstart = r.bounds[win_index(r.bounds, t)]
    add_used(sc, sc.qstart, sc.cost)
  end,
  persist = function(sc, r, h)
    h[#h + 1] = 'qa'; h[#h + 1] = fmt(sc.qa)
    h[#h + 1] = 'qc'; h[#h + 1] = fmt(sc.qc)
    h[#h + 1] = 'qb'; h[#h + 1] = fmt(sc.qb)
    h[#h + 1] = 'qd'; h[#h + 1] = fmt(sc.qd)
    local b, need = r.bounds, 0
    for j = 1, #b - 1 do
      if (b[j] == sc.qa and sc.qc > 0) or (b[j] == sc.qb and sc.qd > 0) then
        need = max(need, b[j + 1])
      end
    end
    return need
  end,
  figures = function(sc, r)
    local b = r.bounds
    local left = max(r.lim - used(sc, b[r.cur]), 0)
    local last = 0
    for w = r.cur, min(r.cur + 1, #b - 1) do
      if used(sc, b[w]) > 0 then last = b[w + 1] end
    end
    return left, max(last - now, 0)
  end,
  record = function(sc, r, rec)
    rec[#rec + 1] = sc.qstart or 0
  end,
  undo = function(sc, r, what, h)
    local start = n()
    if what % 2 == 1 and start > 0 then
      if sc.qa == start then sc.qc = max(sc.qc - sc.cost, 0) end
      if sc.qb == start then sc.qd = max(sc.qd - sc.cost, 0) end
    end
    KIND[3].persist(sc, r, h)
  end,
}

-- concurrency: running jobs hold slots; h:<job> a slot's lease end and
-- c:<job> the claim token of the admission holding it, hc how many slots
-- are recorded, hm a lower bound of their earliest lease end (while hm is
-- in the future every recorded slot is live and hc counts them exactly)
local function scan(sc)
  local live, soonest, stale = 0, false, {}
  local cursor = '0'
  repeat
    local res = call('HSCAN', sc.st, cursor, 'MATCH', 'h:*', 'COUNT', '1000')
    cursor = res[1]
    local kv = res[2]
    for i = 1, #kv, 2 do
      local e = num(kv[i + 1])
      if e > now then
        live = live + 1
        if not soonest or e < soonest then soonest = e end
      elseif kv[i] ~= sc.hkey then
        stale[#stale + 1] = kv[i]
        stale[#stale + 1] = 'c:' .. kv[i]:sub(3)
      end
    end
  until cursor == '0'
  return live, soonest, stale
end

KIND[4] = {
  parse = function(pol, r)
    r.lim, r.lease = n(), n()
    r.fields = { 'hc', 'hm', 'y' }
    pol.conc = r
  end,
  load = function(sc, r, v, j)
    sc.hc, sc.hm, sc.y = num(v[j]) or 0, num(v[j + 1]) or 0, num(v[j + 2]) or 0
  end,
  -- count the live slots (sc.live, sc.mine); the slots are listed only
  -- when one may have run out (or, with need_soonest, to know which ends
  -- first)
  count = function(sc, need_soonest)
    if sc.live then
      if need_soonest and not sc.soonest and sc.st then
        local _, soonest = scan(sc)
        sc.soonest = soonest
      end
      return
    end
    if sc.hc == 0 then
      sc.live, sc.mine = 0, false
    elseif sc.hm > now and not need_soonest then
      sc.live, sc.mine = sc.hc, sc.hend ~= nil
    else
      sc.live, sc.soonest, sc.stale = scan(sc)
      sc.mine = sc.hend ~= nil and sc.hend > now
    end
  end,
  full = function(sc, r)
    KIND[4].count(sc, false)
    if not sc.mine and sc.live >= r.lim then
      KIND[4].count(sc, true)
      return true
    end
    return false
  end,
  snap = function(sc, r, out)
    local full = KIND[4].full(sc, r)
    out[#out + 1] = sc.live; out[#out + 1] = sc.mine and 1 or 0
    out[#out + 1] = (full and sc.soonest) or -1
  end,
  unsnap = function(sc, r)
    sc.live, sc.mine, sc.soonest = n(), n() == 1, n()
    if sc.soonest < 0 then sc.soonest = false end
  end,
  -- take the job's slot: after a listing the stale slots go and hc counts
  -- the live; hm stays a lower bound of the earliest lease end
  hold = function(sc, r, token)
    local e = now + r.lease
    local hc = sc.stale and sc.live or sc.hc
    if sc.mine then
      sc.kept = true
    else
      hc = hc + 1
      sc.took = true
    end
    if sc.stale then
      sc.hm = min(sc.soonest or e, e)
    elseif sc.hc == 0 then
      sc.hm = e
    else
      sc.hm = min(sc.hm, e)
    end
    sc.hc, sc.live, sc.hold, sc.token = hc, sc.live + (sc.mine and 0 or 1), e, token
  end,
  persist = function(sc, r, h)
    if sc.hold then
      h[#h + 1] = sc.hkey; h[#h + 1] = fmt(sc.hold)
      h[#h + 1] = sc.ckey; h[#h + 1] = fmt(sc.token)
      h[#h + 1] = 'hc'; h[#h + 1] = fmt(sc.hc)
      h[#h + 1] = 'hm'; h[#h + 1] = fmt(sc.hm)
      if sc.stale then
        for _, f in ipairs(sc.stale) do sc.hdel[#sc.hdel + 1] = f end
      end
      return sc.hold, true
    end
    return 0, true
  end,
  figures = function(sc, r)
    KIND[4].count(sc, false)
    return max(r.lim - sc.live, 0), nil, sc.live
  end,
  record = function(sc, r, rec)
    rec[#rec + 1] = sc.hend or -1; rec[#rec + 1] = sc.htok or -1
  end,
  -- a slot this op took is given back, a slot it kept gets back its lease
  -- and claim, as long as the op's claim still holds it
  undo = function(sc, r, what, h)
    local hend, htok = n(), n()
    if sc.htok ~= sc.token then return end
    if bit(what, 4) then
      sc.hdel[#sc.hdel + 1] = sc.hkey
      sc.hdel[#sc.hdel + 1] = sc.ckey
      h[#h + 1] = 'hc'; h[#h + 1] = fmt(max(sc.hc - 1, 0))
    elseif bit(what, 8) then
      h[#h + 1] = sc.hkey; h[#h + 1] = fmt(hend)
      h[#h + 1] = sc.ckey; h[#h + 1] = fmt(htok)
    end
  end,
}

-- the policies of this call, read once. A scope's state is read with one
-- HMGET: the fields every scope has, the job's own fields (its reservation,
-- and with a concurrency rule its slot and claim), then each rule's fields.
local COMMON = { 'cd', 's', 'x', 'rn', 'rc', 'u' }
local POL = {}
for p = 1, n() do
  local pol = { rules = {}, nr = 0, unit = {}, fields = {} }
  for i = 1, n() do
    local r = { kind = n() }
    r.k = KIND[r.kind]
    local err = r.k.parse(pol, r)
    if err then return err end
    pol.rules[i] = r
  end
  -- where each rule's fields come in the HMGET reply
  local at = #COMMON + 2
  if pol.conc then at = at + 2 end
  for _, r in ipairs(pol.rules) do
    r.at = at
    for _, f in ipairs(r.fields) do
      pol.fields[#pol.fields + 1] = f
      at = at + 1
    end
    if r.kind == 1 then pol.unit[r.i] = r.unit end
  end
  pol.reservable = pol.nr > 0 or pol.window ~= nil or pol.quota ~= nil
  POL[p] = pol
end

-- forget, a few at a time, reservations of jobs that never came back
local function sweep(sc)
  local res = call('HSCAN', sc.st, fmt(sc.rc), 'MATCH', 'r:*', 'COUNT', '64')
  sc.rc = num(res[1])
  local stale = {}
  local kv = res[2]
  for i = 1, #kv, 2 do
    if num(kv[i + 1]) + grace <= now and kv[i] ~= sc.rkey then
      stale[#stale + 1] = kv[i]
    end
  end
  if #stale > 0 then
    sc.rn = max(sc.rn - call('HDEL', sc.st, unpack(stale)), 0)
  end
end

-- a scope of an op: its policy and the increments of the job's cost, from
-- the op's arguments; then its state, from its keys (local, read_state) or
-- from its snapshot (remote)
local function new_scope(op, ref)
  local pol = POL[math.abs(ref)]
  local sc = { pol = pol, cost = op.cost, rkey = op.rkey, hkey = op.hkey, ckey = op.ckey, inc = pol.unit }
  if op.cost ~= 1 then
    sc.inc = {}
    for i = 1, pol.nr do sc.inc[i] = n() end
  end
  sc.P, sc.A, sc.astored, sc.hdel = {}, {}, {}, {}
  if ref < 0 then
    sc.cd, sc.R = n(), n()
    if sc.R < 0 then sc.R = false end
    for _, r in ipairs(pol.rules) do r.k.unsnap(sc, r) end
  end
  return sc
end

local function read_state(sc, k)
  local pol = sc.pol
  sc.st, sc.wp, sc.wa = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local v
  if pol.conc then
    v = call('HMGET', sc.st, 'cd', 's', 'x', 'rn', 'rc', 'u', sc.rkey, sc.hkey, sc.ckey, unpack(pol.fields))
  else
    v = call('HMGET', sc.st, 'cd', 's', 'x', 'rn', 'rc', 'u', sc.rkey, unpack(pol.fields))
  end
  sc.cd = num(v[1]) or 0
  sc.starts = num(v[2]) or 0
  sc.x = num(v[3]) or 0
  sc.rn = num(v[4]) or 0
  sc.rc = num(v[5]) or 0
  sc.u = num(v[6]) or 0
  local r = num(v[7])
  if pol.conc then sc.hend, sc.htok = num(v[8]), num(v[9]) end
  for _, rule in ipairs(pol.rules) do rule.k.load(sc, rule, v, rule.at) end
  -- the job's own reservation, if it is still good
  sc.hadR, sc.Rraw = r ~= nil, r
  if r then
    local q = pol.quota
    if r + grace <= now then
      r = false -- expired: the job is treated as new
    elseif sc.cd > now and r < sc.cd then
      r = false -- a cooldown began before the slot: take a new one after it
    elseif q and r <= now and win_index(q.bounds, r) ~= q.cur then
      r = false -- the slot's quota window is over
    end
  end
  sc.R = r or false
end

-- a local scope read afresh (after an undo changed its state)
local function reread(sc)
  local fresh = { pol = sc.pol, cost = sc.cost, rkey = sc.rkey, hkey = sc.hkey, ckey = sc.ckey, inc = sc.inc,
    P = {}, A = {}, astored = {}, hdel = {} }
  read_state(fresh, sc.k)
  fresh.k = sc.k
  return fresh
end

local function snapshot(sc)
  local out = { sc.cd, sc.R or -1 }
  for _, r in ipairs(sc.pol.rules) do
    if r.k.snap then r.k.snap(sc, r, out) end
  end
  return out
end

-- the decision over every scope of the op, without writing anything
local function decide(op, scopes)
  -- S: the earliest time every scope allows the job; rule, ridx and rscope
  -- name what pushed it furthest
  local S = max(now, op.not_before)
  local rule, ridx, rscope = 0, 0, 0
  for s, sc in ipairs(scopes) do
    if sc.cd > now and sc.cd > S then
      S, rule, ridx, rscope = sc.cd, R_COOL, 0, s
    end
    if sc.R then
      if sc.R > S then
        S, rule, ridx, rscope = sc.R, R_RESV, 0, s
      end
    else
      for _, r in ipairs(sc.pol.rules) do
        local f = r.k.earliest
        if f then
          local t, code, idx = f(sc, r)
          if t and t > S then
            S, rule, ridx, rscope = t, code, idx, s
          end
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
    for s, sc in ipairs(scopes) do
      local q = sc.pol.quota
      if q and not sc.R then
        local b = q.bounds
        local w = win_index(b, S)
        while true do
          if w == nil or w > q.cur + 1 then
            beyond = true
            break
          end
          if used(sc, b[w]) + op.cost <= q.lim then break end
          w = w + 1
          if w > #b then
            beyond = true
            break
          end
          if b[w] > S then
            S, rule, ridx, rscope = b[w], R_QUOTA, 0, s
            changed = true
          end
        end
      end
    end
  end

  local d = { allowed = false, retry = 0, slot = 0 }
  if S > now then
    d.retry = S - now
    if op.reserve and not beyond and d.retry <= horizon then
      d.slot, d.write = S, 'reserve'
    elseif d.retry > horizon then
      d.retry = horizon
    end
  elseif op.plan then
    -- the slot is due now; take it without starting (shaping at enqueue)
    d.allowed, d.slot, d.write = true, now, 'reserve'
    rule, ridx, rscope = 0, 0, 0
  else
    -- due now: concurrency, then the started meters
    local cwait = false
    if op.hold then
      for s, sc in ipairs(scopes) do
        local c = sc.pol.conc
        if c and KIND[4].full(sc, c) then
          local w = min(sc.soonest - now, conc_retry)
          if not cwait or w > cwait then
            cwait, rule, ridx, rscope = w, R_CONC, 0, s
          end
        end
      end
    end
    if cwait then
      d.retry = cwait
    else
      local w = 0
      rule, ridx, rscope = 0, 0, 0
      for s, sc in ipairs(scopes) do
        for _, r in ipairs(sc.pol.rules) do
          local f = r.k.started
          if f then
            local over, code, idx = f(sc, r)
            if over > w then
              w, rule, ridx, rscope = over, code, idx, s
            end
          end
        end
      end
      if w > 0 then
        -- a few moments early for the started meter: keep the place in line
        d.retry = w
        if op.reserve and not op.dry then
          d.slot, d.write = now, 'reserve'
        end
      else
        d.allowed, d.write = true, 'start'
      end
    end
  end
  d.rule = rule * 65536 + ridx * 256 + rscope
  return d
end

-- a copy of what undo records compare against
local function remember(sc)
  local b = { P = {}, A = {} }
  for i = 1, sc.pol.nr do b.P[i], b.A[i] = sc.P[i], sc.A[i] end
  b.R = sc.hadR and sc.Rraw or -1
  sc.before = b
end

-- charge the planned rules of every local scope without a reservation at t
local function charge(scopes, t)
  for _, sc in ipairs(scopes) do
    if sc.st and not sc.R then
      for _, r in ipairs(sc.pol.rules) do
        if r.k.charge then r.k.charge(sc, r, t) end
      end
      sc.dirty, sc.planned = true, true
    end
  end
end

local function reserve_at(scopes, t)
  for _, sc in ipairs(scopes) do
    if sc.st and sc.pol.reservable then
      if not sc.hadR then sc.rn = sc.rn + 1 end
      sc.hadR = true
      sc.rtop = t
      sc.dirty = true
    end
  end
end

local function start(op, scopes)
  for _, sc in ipairs(scopes) do
    if sc.st then
      local pol = sc.pol
      if pol.reservable or pol.conc then
        sc.starts = sc.starts + 1
        sc.counted = true
      end
      for _, r in ipairs(pol.rules) do
        if r.k.start then r.k.start(sc, r) end
      end
      if sc.hadR then sc.dropR = true end
      if op.hold and pol.conc then KIND[4].hold(sc, pol.conc, op.claim) end
      sc.dirty, sc.started = true, true
    end
  end
end

-- write what changed; expiry only ever grows and only reclaims memory, but
-- for y, the expiry the state needs once no job runs (release.lua uses it)
local function persist(scopes, noexpire)
  for _, sc in ipairs(scopes) do
    if sc.st and sc.dirty then
      if sc.rn > 0 and sc.counted and sc.starts % 64 == 0 then
        sweep(sc)
      end
      local h = {}
      local need = now
      if sc.rtop then
        h[1] = sc.rkey; h[2] = fmt(sc.rtop)
        need = sc.rtop + grace
      elseif sc.dropR then
        sc.hdel[#sc.hdel + 1] = sc.rkey
        sc.rn = max(sc.rn - 1, 0)
      end
      if sc.rn > 0 or sc.dropR then
        h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
        h[#h + 1] = 'rc'; h[#h + 1] = fmt(sc.rc)
      end
      if sc.counted then
        -- counted for sluice top; kept a few seconds past recovery
        h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts)
        need = max(need, now + 5000000)
      end
      local held, conc = 0, false
      for _, r in ipairs(sc.pol.rules) do
        if r.kind == 4 then
          held, conc = r.k.persist(sc, r, h)
        else
          need = max(need, r.k.persist(sc, r, h, noexpire))
        end
      end
      if conc then
        sc.y = max(sc.y or 0, need + 1000000)
        h[#h + 1] = 'y'; h[#h + 1] = fmt(sc.y)
      end
      if #sc.hdel > 0 then
        call('HDEL', sc.st, unpack(sc.hdel))
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

-- the undo record of a local scope: what the op wrote, and what it found
local function record(op, sc)
  local what = 0
  if sc.planned then what = what + 1 end
  if sc.started then what = what + 2 end
  if sc.took then what = what + 4 end
  if sc.kept then what = what + 8 end
  local rec = { what, op.claim, sc.before.R, sc.rtop or (sc.dropR and -1) or sc.before.R }
  for _, r in ipairs(sc.pol.rules) do r.k.record(sc, r, rec) end
  return rec
end

-- take back what an earlier op wrote to a local scope (its undo record):
-- exactly, as long as nothing else changed the same fields since
local function undo(op, sc)
  local what, token, Rb, Ra = n(), n(), n(), n()
  sc.token = token
  local h = {}
  for _, r in ipairs(sc.pol.rules) do r.k.undo(sc, r, what, h) end
  if bit(what, 2) and sc.starts > 0 then
    h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts - 1)
    sc.starts = sc.starts - 1
  end
  local r = sc.hadR and sc.Rraw or -1
  if r == Ra and Ra ~= Rb then
    if Rb >= 0 then
      h[#h + 1] = sc.rkey; h[#h + 1] = fmt(Rb)
      if Ra < 0 then sc.rn = sc.rn + 1 end
    else
      sc.hdel[#sc.hdel + 1] = sc.rkey
      sc.rn = max(sc.rn - 1, 0)
    end
    h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
    -- a reservation put back keeps the hash alive through its grace
    if Rb >= 0 and not op.noexpire then extend_to(sc.st, Rb + grace) end
  end
  if sc.leftover then
    sc.u = sc.u + 1
    h[#h + 1] = 'u'; h[#h + 1] = fmt(sc.u)
  end
  if #sc.hdel > 0 then call('HDEL', sc.st, unpack(sc.hdel)) end
  if #h > 0 and call('EXISTS', sc.st) == 1 then call('HSET', sc.st, unpack(h)) end
end

local out = {}
local k = 0
for o = 1, nops do
  local op = { id = ARGV[a] }
  op.cost, op.flags, op.not_before, op.claim = num(ARGV[a + 1]), num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
  local nscopes = num(ARGV[a + 5])
  a = a + 6
  local flags = op.flags
  op.reserve, op.hold, op.plan = bit(flags, 1), bit(flags, 2), bit(flags, 8)
  op.dry = bit(flags, 4)
  op.noexpire = bit(flags, 16)
  local dry, noexpire, probe, twostep = op.dry, op.noexpire, bit(flags, 32), bit(flags, 64)
  local undo_first, expect, undo_only = bit(flags, 128), bit(flags, 256), bit(flags, 512)
  op.rkey, op.hkey, op.ckey = 'r:' .. op.id, 'h:' .. op.id, 'c:' .. op.id

  local scopes = {}
  for s = 1, nscopes do
    local ref = n()
    local sc = new_scope(op, ref)
    if ref > 0 then
      sc.k = k
      read_state(sc, k)
      k = k + 3
    end
    scopes[s] = sc
  end

  if undo_first or undo_only then
    for s, sc in ipairs(scopes) do
      if sc.st then
        undo(op, sc)
        if not undo_only then scopes[s] = reread(sc) end
      end
    end
    if undo_only then
      out[o] = { 0, 0, 0, -1, -1, -1, 0 }
    end
  end

  if not undo_only then
    local d = decide(op, scopes)
    local conflict = false
    if expect then
      local want_allowed, want_slot = n() == 1, n()
      conflict = d.allowed ~= want_allowed or d.slot ~= want_slot
    end
    local snaps, recs
    if twostep then
      snaps = {}
      for _, sc in ipairs(scopes) do
        if sc.st then
          snaps[#snaps + 1] = snapshot(sc)
          remember(sc)
        end
      end
    end
    local wrote = false
    if d.write and not dry and not conflict and not (probe and d.write ~= 'start') then
      if d.write == 'reserve' then
        charge(scopes, d.slot)
        reserve_at(scopes, d.slot)
      else
        charge(scopes, now)
        start(op, scopes)
      end
      persist(scopes, noexpire)
      wrote = true
    end
    if twostep then
      recs = {}
      for _, sc in ipairs(scopes) do
        if sc.st then
          if wrote then recs[#recs + 1] = record(op, sc) else recs[#recs + 1] = {} end
        end
      end
    end

    -- what is left after this decision, in the local scopes
    local remaining, reset, inflight = -1, -1, -1
    for _, sc in ipairs(scopes) do
      if sc.st then
        for _, r in ipairs(sc.pol.rules) do
          local f = r.k.figures
          if f then
            local left, rst, live = f(sc, r)
            if remaining < 0 or left < remaining then remaining = left end
            if rst then reset = max(reset, rst) end
            if live and inflight < 0 then inflight = live end
          end
        end
      end
    end
    local verdict = 0
    if d.allowed then verdict = 1 end
    if wrote then verdict = verdict + 2 end
    if conflict then verdict = verdict + 4 end
    out[o] = { verdict, d.retry, d.rule, remaining, reset, inflight, d.slot }
    if twostep then
      out[o][8] = snaps
      out[o][9] = recs
    end
  end
end

out[nops + 1] = now
return out
