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
-- Several jobs may be decided in one call (ops); each op reads its keys from
-- KEYS in order. All times are integers in microseconds.
--
-- KEYS, 3 per scope, for every scope of every op in order:
--   [1] state hash: p<i>/a<i> planned/started meter of rate i; qa/qc and
--     qb/qd quota window starts and counts; cd cooldown end; n window entry
--     sequence; s jobs started; x the expiry last given to the hash;
--     r:<job> a job's reserved slot, rn how many, rc a cursor sweeping stale
--     ones; h:<job> a running job's lease end, hc how many, hm a lower
--     bound of their earliest lease end (while hm is in the future every
--     recorded slot is live and hc counts them exactly)
--   [2] planned window zset, [3] started window zset (score: start time)
-- ARGV:
--   [1] clock: current time to use, or -1 for Redis TIME (tests only)
--   [2] number of ops
--   [3] horizon, [4] reservation grace, [5] started-meter tolerance,
--   [6] longest retry-after of a concurrency denial
--   [7] number of policies, then per policy: features (1 window, 2 quota,
--     4 concurrency), number of rates, {increment for cost 1, burst offset}
--     per rate, then if window: limit, length; if quota: limit, number of
--     window starts, the starts; if concurrency: limit, lease
--   per op: job id, cost, flags, not_before, number of scopes, then per
--     scope: its policy's number in the list above, and when the cost is not
--     1, the increment for the cost of each of the policy's rates
--   flags: 1 reserve on denial, 2 hold a concurrency slot, 4 dry run (write
--     nothing), 8 plan only (take the slot, do not start), 16 set no expiry
-- Returns: per op {allowed + 2 * charged, retry_after,
--   rule * 65536 + rule_index * 256 + scope, remaining, reset_after,
--   in_flight, slot}, then the time of the decisions
--   rule: 0 none, 1 rate, 2 window, 3 quota, 4 concurrency, 5 cooldown,
--     6 reserved (the job's own slot is not due yet); rule_index is 1-based
--   remaining, reset_after, in_flight: -1 when no rule applies
--   slot: the job's reserved slot, 0 when none was taken
--   charged: what was written, 1 planned meters, 2 started meters,
--     4 a new concurrency slot (a job that already held one keeps it)
-- Errors: "ERR sluice: clock" when the time is outside the quota windows
--   given (the caller's clock estimate is off; it retries with fresh bounds).
--
-- Cost matters here: every redis.call and every number Redis has to print
-- is paid per decision, so numbers are formatted with %d (Redis would use
-- the slower %.17g), field names are built once, and a scope's state is read
-- with one HMGET and written with one HSET.

local call, tonumber, unpack, format = redis.call, tonumber, unpack, string.format
local floor, max, min = math.floor, math.max, math.min
local KEYS, ARGV = KEYS, ARGV

local RATE, WINDOW, QUOTA, CONC, COOL, RESV = 1, 2, 3, 4, 5, 6

local function fmt(v)
  return format('%d', v)
end

-- field names of the rate meters (a policy has at most 12 rates)
local PF = { 'p1', 'p2', 'p3', 'p4', 'p5', 'p6', 'p7', 'p8', 'p9', 'p10', 'p11', 'p12' }
local AF = { 'a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7', 'a8', 'a9', 'a10', 'a11', 'a12' }
local num = tonumber

local now
local clock = tonumber(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nops = num(ARGV[2])
local horizon, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local tolerance, conc_retry = tonumber(ARGV[5]), tonumber(ARGV[6])

local function win_index(bounds, t)
  for j = 1, #bounds - 1 do
    if bounds[j] <= t and t < bounds[j + 1] then
      return j
    end
  end
  return nil
end

local function used(sc, start)
  if sc.qa == start then return sc.qc end
  if sc.qb == start then return sc.qd end
  return 0
end

local function add_used(sc, start, n)
  if sc.qa == start then sc.qc = sc.qc + n return end
  if sc.qb == start then sc.qd = sc.qd + n return end
  -- take the slot holding the older (ended) window, or an empty one
  if sc.qa == 0 or (sc.qb ~= 0 and sc.qa < sc.qb) then
    sc.qa, sc.qc = start, n
  else
    sc.qb, sc.qd = start, n
  end
end

-- make key live at least until time t, never shortening its life: GT
-- extends a key that has a TTL, NX gives one to a key that has none
local function extend_to(key, t)
  local ms = fmt(floor((t - now) / 1000) + 2)
  if call('PEXPIRE', key, ms, 'GT') == 0 then
    call('PEXPIRE', key, ms, 'NX')
  end
end

-- add n window entries at time t; members come from the scope's sequence
-- (started at the current time, so they never meet members of an expired log)
local function add_entries(sc, key, t, n)
  local seq = sc.n or now
  local z = {}
  for c = 1, n do
    seq = seq + 1
    z[#z + 1] = fmt(t)
    z[#z + 1] = fmt(seq)
    if #z >= 2000 or c == n then
      call('ZADD', key, unpack(z))
      z = {}
    end
  end
  sc.n = seq
end

-- the running jobs of a scope: how many are live, the earliest live lease
-- end, and the fields of slots whose lease ran out (other than the job's own)
local function scan(sc)
  local live, soonest, stale = 0, false, {}
  local cursor = '0'
  repeat
    local res = call('HSCAN', sc.st, cursor, 'MATCH', 'h:*', 'COUNT', '1000')
    cursor = res[1]
    local kv = res[2]
    for i = 1, #kv, 2 do
      local e = tonumber(kv[i + 1])
      if e > now then
        live = live + 1
        if not soonest or e < soonest then soonest = e end
      elseif kv[i] ~= sc.hkey then
        stale[#stale + 1] = kv[i]
      end
    end
  until cursor == '0'
  return live, soonest, stale
end

-- count the scope's live slots (sc.live, sc.mine); the slots are listed only
-- when one may have run out (or, with need_soonest, to know which ends first)
local function count_holders(sc, need_soonest)
  if sc.live then
    if need_soonest and not sc.soonest then
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
end

-- forget, a few at a time, reservations of jobs that never came back
local function sweep(sc)
  local res = call('HSCAN', sc.st, fmt(sc.rc), 'MATCH', 'r:*', 'COUNT', '64')
  sc.rc = tonumber(res[1])
  local stale = {}
  local kv = res[2]
  for i = 1, #kv, 2 do
    if tonumber(kv[i + 1]) + grace <= now and kv[i] ~= sc.rkey then
      stale[#stale + 1] = kv[i]
    end
  end
  if #stale > 0 then
    sc.rn = max(sc.rn - call('HDEL', sc.st, unpack(stale)), 0)
  end
end

-- charge the planned meters of every scope without a reservation at time t
local function charge(scopes, t, cost)
  local charged = 0
  for _, sc in ipairs(scopes) do
    if not sc.R then
      local rt = sc.rt
      for b = 1, 3 * sc.nr, 3 do
        rt[b + 1] = max(rt[b + 1], t) + rt[b]
      end
      if sc.wlim > 0 then
        add_entries(sc, sc.wp, t, cost)
        sc.wtop = t
      end
      if sc.qlim > 0 then
        add_used(sc, sc.bounds[win_index(sc.bounds, t)], cost)
      end
      sc.dirty = true
      charged = 1
    end
  end
  return charged
end

local function reserve_at(scopes, t)
  for _, sc in ipairs(scopes) do
    if sc.reservable then
      if not sc.hadR then sc.rn = sc.rn + 1 end
      sc.hadR = true
      sc.rtop = t
      sc.dirty = true
    end
  end
end

-- write what changed; expiry only ever grows and only reclaims memory
local function persist(scopes, noexpire)
  for _, sc in ipairs(scopes) do
    if sc.dirty then
      if sc.rn > 0 and sc.counted and sc.starts % 64 == 0 then
        sweep(sc)
      end
      local h = {}
      local until_ = now
      if sc.rtop then
        h[1] = sc.rkey; h[2] = fmt(sc.rtop)
        until_ = sc.rtop + grace
      elseif sc.dropR then
        call('HDEL', sc.st, sc.rkey)
        sc.rn = max(sc.rn - 1, 0)
      end
      if sc.rn > 0 or sc.dropR then
        h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
        h[#h + 1] = 'rc'; h[#h + 1] = fmt(sc.rc)
      end
      -- a started meter equal to its planned one is not stored
      local rt = sc.rt
      for i = 1, sc.nr do
        local b = 3 * i - 2
        h[#h + 1] = PF[i]; h[#h + 1] = fmt(rt[b + 1])
        if rt[b + 2] ~= rt[b + 1] then
          h[#h + 1] = AF[i]; h[#h + 1] = fmt(rt[b + 2])
        elseif sc.astored[i] then
          sc.adel = sc.adel or {}
          sc.adel[#sc.adel + 1] = AF[i]
        end
        until_ = max(until_, rt[b + 1], rt[b + 2])
      end
      if sc.adel then
        call('HDEL', sc.st, unpack(sc.adel))
      end
      if sc.qlim > 0 then
        h[#h + 1] = 'qa'; h[#h + 1] = fmt(sc.qa)
        h[#h + 1] = 'qc'; h[#h + 1] = fmt(sc.qc)
        h[#h + 1] = 'qb'; h[#h + 1] = fmt(sc.qb)
        h[#h + 1] = 'qd'; h[#h + 1] = fmt(sc.qd)
        local b = sc.bounds
        for j = 1, #b - 1 do
          if (b[j] == sc.qa and sc.qc > 0) or (b[j] == sc.qb and sc.qd > 0) then
            until_ = max(until_, b[j + 1])
          end
        end
      end
      if sc.counted then
        -- counted for sluice top; kept a few seconds past recovery
        h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts)
        until_ = max(until_, now + 5000000)
      end
      if sc.hold then
        h[#h + 1] = sc.hkey; h[#h + 1] = fmt(sc.hold)
        h[#h + 1] = 'hc'; h[#h + 1] = fmt(sc.hc)
        h[#h + 1] = 'hm'; h[#h + 1] = fmt(sc.hm)
        until_ = max(until_, sc.hold)
        if sc.stale and #sc.stale > 0 then
          call('HDEL', sc.st, unpack(sc.stale))
        end
      end
      if sc.wlim > 0 then
        h[#h + 1] = 'n'; h[#h + 1] = fmt(sc.n)
        until_ = max(until_, (sc.wtop or 0) + sc.wdur, (sc.watop or 0) + sc.wdur)
        call('ZREMRANGEBYSCORE', sc.wp, '-inf', fmt(now - sc.wdur))
        if sc.wtop and not noexpire then extend_to(sc.wp, sc.wtop + sc.wdur) end
        if sc.watop and not noexpire then extend_to(sc.wa, sc.watop + sc.wdur) end
      end
      -- the hash's expiry is moved a second past what is needed, so that a
      -- busy scope calls PEXPIRE about once a second, not every time
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

-- the policies of this call, read once
local POL = {}
local a = 8
for p = 1, num(ARGV[7]) do
  local features, nr = num(ARGV[a]), num(ARGV[a + 1])
  a = a + 2
  local pol = { nr = nr, unit = {}, off = {}, wlim = 0, wdur = 0, qlim = 0, clim = 0, lease = 0 }
  for i = 1, nr do
    pol.unit[i], pol.off[i] = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
  end
  local fields = {}
  if features % 2 == 1 then
    pol.wlim, pol.wdur = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
    fields[#fields + 1] = 'n'
  end
  if floor(features / 2) % 2 == 1 then
    pol.qlim = tonumber(ARGV[a])
    local nb = num(ARGV[a + 1])
    a = a + 2
    local b = {}
    for j = 1, nb do
      b[j] = tonumber(ARGV[a]); a = a + 1
    end
    pol.bounds = b
    pol.cur = win_index(b, now)
    if not pol.cur then
      return redis.error_reply('ERR sluice: clock')
    end
    fields[#fields + 1] = 'qa'; fields[#fields + 1] = 'qc'
    fields[#fields + 1] = 'qb'; fields[#fields + 1] = 'qd'
  end
  if floor(features / 4) % 2 == 1 then
    pol.clim, pol.lease = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
    fields[#fields + 1] = 'hc'; fields[#fields + 1] = 'hm'
  end
  for i = 1, nr do
    fields[#fields + 1] = PF[i]
    fields[#fields + 1] = AF[i]
  end
  pol.fields = fields
  pol.reservable = nr > 0 or pol.wlim > 0 or pol.qlim > 0
  POL[p] = pol
end

local out = {}
local k = 0
for op = 1, nops do
  local id = ARGV[a]
  local cost = num(ARGV[a + 1])
  local flags = num(ARGV[a + 2])
  local not_before = num(ARGV[a + 3])
  local nscopes = num(ARGV[a + 4])
  a = a + 5
  local reserve = flags % 2 == 1
  local hold = floor(flags / 2) % 2 == 1
  local dry = floor(flags / 4) % 2 == 1
  local plan = floor(flags / 8) % 2 == 1
  local noexpire = floor(flags / 16) % 2 == 1
  local rkey, hkey = 'r:' .. id, 'h:' .. id

  local scopes = {}
  for s = 1, nscopes do
    local pol = POL[num(ARGV[a])]
    a = a + 1
    local nr = pol.nr
    -- rt holds, per rate: increment for the cost, planned meter, started meter
    local rt = {}
    for i = 1, nr do
      if cost == 1 then
        rt[3 * i - 2] = pol.unit[i]
      else
        rt[3 * i - 2] = tonumber(ARGV[a]); a = a + 1
      end
    end
    local sc = {
      st = KEYS[k + 1], wp = KEYS[k + 2], wa = KEYS[k + 3], rkey = rkey, hkey = hkey,
      pol = pol, nr = nr, rt = rt, wlim = pol.wlim, wdur = pol.wdur, qlim = pol.qlim,
      clim = pol.clim, lease = pol.lease, bounds = pol.bounds, cur = pol.cur,
      reservable = pol.reservable, astored = {},
    }
    k = k + 3

    -- the scope's state in one call, only the fields its rules use
    local v
    if sc.clim > 0 then
      v = call('HMGET', sc.st, 'cd', 's', 'x', 'rn', 'rc', rkey, hkey, unpack(pol.fields))
    else
      v = call('HMGET', sc.st, 'cd', 's', 'x', 'rn', 'rc', rkey, unpack(pol.fields))
    end
    sc.cd = tonumber(v[1]) or 0
    sc.starts = tonumber(v[2]) or 0
    sc.x = tonumber(v[3]) or 0
    sc.rn = tonumber(v[4]) or 0
    sc.rc = tonumber(v[5]) or 0
    sc.hc, sc.hm = 0, 0
    local r = tonumber(v[6])
    local j = 7
    if sc.clim > 0 then
      sc.hend = tonumber(v[7])
      j = 8
    end
    if sc.wlim > 0 then
      sc.n = tonumber(v[j]) or false
      j = j + 1
    end
    if sc.qlim > 0 then
      sc.qa, sc.qc = tonumber(v[j]) or 0, tonumber(v[j + 1]) or 0
      sc.qb, sc.qd = tonumber(v[j + 2]) or 0, tonumber(v[j + 3]) or 0
      j = j + 4
    end
    if sc.clim > 0 then
      sc.hc = tonumber(v[j]) or 0
      sc.hm = tonumber(v[j + 1]) or 0
      j = j + 2
    end
    for i = 1, nr do
      local P = tonumber(v[j]) or 0
      local A = v[j + 1]
      if A then
        sc.astored[i] = true
        A = tonumber(A)
      else
        A = P
      end
      rt[3 * i - 1], rt[3 * i] = P, A
      j = j + 2
    end

    -- the job's own reservation, if it is still good
    if r then
      sc.hadR = true
      if r + grace <= now then
        r = false -- expired: the job is treated as new
      elseif sc.cd > now and r < sc.cd then
        r = false -- a cooldown began before the slot: take a new one after it
      elseif sc.qlim > 0 and r <= now and win_index(sc.bounds, r) ~= sc.cur then
        r = false -- the slot's quota window is over
      end
      sc.R = r
    end
    scopes[s] = sc
  end

  -- S: the earliest time every scope allows the job; rule, ridx and rscope
  -- name what pushed it furthest
  local S = max(now, not_before)
  local rule, ridx, rscope = 0, 0, 0
  for s, sc in ipairs(scopes) do
    if sc.cd > now and sc.cd > S then
      S, rule, ridx, rscope = sc.cd, COOL, 0, s
    end
    if sc.R then
      if sc.R > S then
        S, rule, ridx, rscope = sc.R, RESV, 0, s
      end
    else
      local rt = sc.rt
      for i = 1, sc.nr do
        local b = 3 * i - 2
        local t = rt[b + 1] + rt[b] - sc.pol.off[i]
        if t > S then
          S, rule, ridx, rscope = t, RATE, i, s
        end
      end
      if sc.wlim > 0 then
        local lo = fmt(now - sc.wdur + 1)
        -- first in, first out: never before the last planned entry
        local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
        if top[2] and tonumber(top[2]) > S then
          S, rule, ridx, rscope = tonumber(top[2]), WINDOW, 0, s
        end
        local e = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', fmt(sc.wlim - cost), '1')
        if e[2] and tonumber(e[2]) + sc.wdur > S then
          S, rule, ridx, rscope = tonumber(e[2]) + sc.wdur, WINDOW, 0, s
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
      if sc.qlim > 0 and not sc.R then
        local b = sc.bounds
        local w = win_index(b, S)
        while true do
          if w == nil or w > sc.cur + 1 then
            beyond = true
            break
          end
          if used(sc, b[w]) + cost <= sc.qlim then break end
          w = w + 1
          if w > #b then
            beyond = true
            break
          end
          if b[w] > S then
            S, rule, ridx, rscope = b[w], QUOTA, 0, s
            changed = true
          end
        end
      end
    end
  end

  local allowed, retry, slot, charged = 0, 0, 0, 0
  local wrote = false
  if S > now then
    retry = S - now
    if reserve and not beyond and retry <= horizon then
      slot = S
      if not dry then
        charged = charge(scopes, S, cost)
        reserve_at(scopes, S)
        wrote = true
      end
    elseif retry > horizon then
      retry = horizon
    end
  elseif plan then
    -- the slot is due now; take it without starting (shaping at enqueue)
    allowed, slot = 1, now
    rule, ridx, rscope = 0, 0, 0
    if not dry then
      charged = charge(scopes, now, cost)
      reserve_at(scopes, now)
      wrote = true
    end
  else
    -- due now: concurrency, then the started meters
    local cwait = false
    if hold then
      for s, sc in ipairs(scopes) do
        if sc.clim > 0 then
          count_holders(sc, false)
          if not sc.mine and sc.live >= sc.clim then
            count_holders(sc, true)
            local w = min(sc.soonest - now, conc_retry)
            if not cwait or w > cwait then
              cwait, rule, ridx, rscope = w, CONC, 0, s
            end
          end
        end
      end
    end
    if cwait then
      retry = cwait
    else
      local w = 0
      rule, ridx, rscope = 0, 0, 0
      for s, sc in ipairs(scopes) do
        local rt = sc.rt
        for i = 1, sc.nr do
          local b = 3 * i - 2
          local tol = min(tolerance, floor(sc.pol.unit[i] / 4))
          local over = max(rt[b + 2], now) + rt[b] - now - sc.pol.off[i] - tol
          if over > w then
            w, rule, ridx, rscope = over, RATE, i, s
          end
        end
        if sc.wlim > 0 then
          local e = call('ZREVRANGEBYSCORE', sc.wa, '+inf', fmt(now - sc.wdur + 1), 'WITHSCORES', 'LIMIT', fmt(sc.wlim - cost), '1')
          if e[2] then
            local over = tonumber(e[2]) + sc.wdur - now
            if over > w then
              w, rule, ridx, rscope = over, WINDOW, 0, s
            end
          end
        end
      end
      if w > 0 then
        -- a few moments early for the started meter: keep the place in line
        retry = w
        if reserve and not dry then
          slot = now
          charged = charge(scopes, now, cost)
          reserve_at(scopes, now)
          wrote = true
        end
      else
        allowed = 1
        if not dry then
          charged = charge(scopes, now, cost) + 2
          wrote = true
          for _, sc in ipairs(scopes) do
            if sc.reservable or sc.clim > 0 then
              sc.starts = sc.starts + 1
              sc.counted = true
              sc.dirty = true
            end
            local rt = sc.rt
            for i = 1, sc.nr do
              local b = 3 * i - 2
              rt[b + 2] = max(rt[b + 2], now) + rt[b]
            end
            if sc.wlim > 0 then
              add_entries(sc, sc.wa, now, cost)
              call('ZREMRANGEBYSCORE', sc.wa, '-inf', fmt(now - sc.wdur))
              sc.watop = now
            end
            if sc.hadR then
              sc.dropR = true
            end
            if hold and sc.clim > 0 then
              -- after a listing the stale slots go and hc counts the live;
              -- hm stays a lower bound of the earliest lease end
              local e = now + sc.lease
              local hc = sc.stale and sc.live or sc.hc
              if not sc.mine then
                hc = hc + 1
                charged = charged + 4
              end
              if sc.stale then
                sc.hm = min(sc.soonest or e, e)
              elseif sc.hc == 0 then
                sc.hm = e
              else
                sc.hm = min(sc.hm, e)
              end
              sc.hc, sc.live, sc.hold = hc, sc.live + (sc.mine and 0 or 1), e
            end
          end
        end
      end
    end
  end

  if wrote then
    persist(scopes, noexpire)
  end

  -- what is left after this decision
  local remaining, reset, inflight = -1, -1, -1
  for _, sc in ipairs(scopes) do
    local rt = sc.rt
    for i = 1, sc.nr do
      local tat = max(rt[3 * i - 1], now)
      local n = max(floor((now + sc.pol.off[i] - tat) / sc.pol.unit[i]), 0)
      if remaining < 0 or n < remaining then remaining = n end
      reset = max(reset, tat - now)
    end
    if sc.wlim > 0 then
      local lo = fmt(now - sc.wdur + 1)
      local n = max(sc.wlim - call('ZCOUNT', sc.wp, lo, '+inf'), 0)
      if remaining < 0 or n < remaining then remaining = n end
      local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
      if top[2] then
        reset = max(reset, tonumber(top[2]) + sc.wdur - now)
      else
        reset = max(reset, 0)
      end
    end
    if sc.qlim > 0 then
      local b = sc.bounds
      local n = max(sc.qlim - used(sc, b[sc.cur]), 0)
      if remaining < 0 or n < remaining then remaining = n end
      local last = 0
      for w = sc.cur, min(sc.cur + 1, #b - 1) do
        if used(sc, b[w]) > 0 then last = b[w + 1] end
      end
      reset = max(reset, last - now, 0)
    end
    if sc.clim > 0 then
      count_holders(sc, false)
      local n = max(sc.clim - sc.live, 0)
      if remaining < 0 or n < remaining then remaining = n end
      if inflight < 0 then inflight = sc.live end
    end
  end

  out[op] = { allowed + 2 * charged, retry, rule * 65536 + ridx * 256 + rscope, remaining, reset, inflight, slot }
end

out[nops + 1] = now
return out
