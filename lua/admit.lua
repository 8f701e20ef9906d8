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
-- KEYS, 5 per scope, for every scope of every op in order:
--   state hash (p<i>/a<i> rate meters, qa/qc qb/qd quota windows and counts,
--     cd cooldown end, n entry sequence, s jobs started), planned window zset, started window
--     zset, reservations zset (job id -> slot), holders zset (job id -> lease end)
-- ARGV:
--   [1] clock: current time to use, or -1 for Redis TIME (tests only)
--   [2] number of ops
--   per op: job id, cost, flags, not_before, horizon, grace, tolerance,
--     concurrency retry, number of scopes, then per scope:
--     nrates, {increment for cost, increment for 1, burst offset} per rate,
--     window limit, window length, quota limit, nbounds, quota window starts...,
--     concurrency limit, lease
--   flags: 1 reserve on denial, 2 hold a concurrency slot, 4 dry run (write
--     nothing), 8 plan only (take the slot, do not start), 16 set no expiry
-- Returns: per op {allowed, retry_after, rule, rule_index, scope, remaining,
--   reset_after, in_flight, slot, now, charged}
--   rule: 0 none, 1 rate, 2 window, 3 quota, 4 concurrency, 5 cooldown,
--     6 reserved (the job's own slot is not due yet); rule_index is 1-based
--   remaining, reset_after, in_flight: -1 when no rule applies
--   slot: the job's reserved slot, 0 when none was taken
--   charged: what was written, 1 planned meters, 2 started meters,
--     4 a new concurrency slot (a job that already held one keeps it)
-- Errors: "ERR sluice: clock" when the time is outside the quota windows
--   given (the caller's clock estimate is off; it retries with fresh bounds).

local RATE, WINDOW, QUOTA, CONC, COOL, RESV = 1, 2, 3, 4, 5, 6

local function fmt(v)
  return string.format('%d', v)
end

local now
local clock = tonumber(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local nops = tonumber(ARGV[2])
local a = 3
local k = 0
local out = {}

local function win_index(sc, t)
  local b = sc.bounds
  for j = 1, #b - 1 do
    if b[j] <= t and t < b[j + 1] then
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
      redis.call('ZADD', key, unpack(z))
      z = {}
    end
  end
  sc.n = seq
end

for op = 1, nops do
  local id = ARGV[a]
  local cost = tonumber(ARGV[a + 1])
  local flags = tonumber(ARGV[a + 2])
  local not_before = tonumber(ARGV[a + 3])
  local horizon = tonumber(ARGV[a + 4])
  local grace = tonumber(ARGV[a + 5])
  local tolerance = tonumber(ARGV[a + 6])
  local conc_retry = tonumber(ARGV[a + 7])
  local nscopes = tonumber(ARGV[a + 8])
  a = a + 9
  local reserve = flags % 2 == 1
  local hold = math.floor(flags / 2) % 2 == 1
  local dry = math.floor(flags / 4) % 2 == 1
  local plan = math.floor(flags / 8) % 2 == 1
  local noexpire = math.floor(flags / 16) % 2 == 1

  local scopes = {}
  for s = 1, nscopes do
    local sc = { st = KEYS[k + 1], wp = KEYS[k + 2], wa = KEYS[k + 3], rs = KEYS[k + 4], cc = KEYS[k + 5] }
    k = k + 5
    local nr = tonumber(ARGV[a]); a = a + 1
    sc.rates = {}
    for i = 1, nr do
      sc.rates[i] = { inc = tonumber(ARGV[a]), unit = tonumber(ARGV[a + 1]), off = tonumber(ARGV[a + 2]) }
      a = a + 3
    end
    sc.wlim, sc.wdur = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    sc.qlim = tonumber(ARGV[a + 2])
    local nb = tonumber(ARGV[a + 3])
    a = a + 4
    sc.bounds = {}
    for j = 1, nb do
      sc.bounds[j] = tonumber(ARGV[a]); a = a + 1
    end
    sc.clim, sc.lease = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
    sc.reservable = nr > 0 or sc.wlim > 0 or sc.qlim > 0

    -- read the scope's scalar state in one call
    local fields = { 'cd', 'qa', 'qc', 'qb', 'qd', 'n', 's' }
    for i = 1, nr do
      fields[#fields + 1] = 'p' .. i
      fields[#fields + 1] = 'a' .. i
    end
    local v = redis.call('HMGET', sc.st, unpack(fields))
    sc.cd = tonumber(v[1]) or 0
    sc.qa, sc.qc = tonumber(v[2]) or 0, tonumber(v[3]) or 0
    sc.qb, sc.qd = tonumber(v[4]) or 0, tonumber(v[5]) or 0
    sc.n = tonumber(v[6])
    sc.starts = tonumber(v[7]) or 0
    sc.P, sc.A = {}, {}
    for i = 1, nr do
      sc.P[i] = tonumber(v[6 + 2 * i]) or 0
      sc.A[i] = tonumber(v[7 + 2 * i]) or 0
    end
    if sc.qlim > 0 then
      sc.cur = win_index(sc, now)
      if sc.cur == nil then
        return redis.error_reply('ERR sluice: clock')
      end
    end

    -- the job's own reservation, if it is still good
    local r = redis.call('ZSCORE', sc.rs, id)
    if r then
      sc.R = tonumber(r)
      if sc.R + grace <= now then
        sc.R = nil -- expired: the job is treated as new
      elseif sc.cd > now and sc.R < sc.cd then
        sc.R = nil -- a cooldown began before the slot: take a new one after it
      elseif sc.qlim > 0 and sc.R <= now and win_index(sc, sc.R) ~= sc.cur then
        sc.R = nil -- the slot's quota window is over
      end
    end
    scopes[s] = sc
  end

  -- S: the earliest time every scope allows the job
  local S = math.max(now, not_before)
  local rule, ridx, rscope = 0, 0, 0
  local function push(t, r, i, s)
    if t > S then
      S, rule, ridx, rscope = t, r, i, s
    end
  end
  for s, sc in ipairs(scopes) do
    if sc.cd > now then push(sc.cd, COOL, 0, s) end
    if sc.R then
      push(sc.R, RESV, 0, s)
    else
      for i, r in ipairs(sc.rates) do
        push(sc.P[i] + r.inc - r.off, RATE, i, s)
      end
      if sc.wlim > 0 then
        local lo = '(' .. fmt(now - sc.wdur)
        -- first in, first out: never before the last planned entry
        local top = redis.call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', 0, 1)
        if top[2] then push(tonumber(top[2]), WINDOW, 0, s) end
        local e = redis.call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', sc.wlim - cost, 1)
        if e[2] then push(tonumber(e[2]) + sc.wdur, WINDOW, 0, s) end
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
        local j = win_index(sc, S)
        while true do
          if j == nil or j > sc.cur + 1 then
            beyond = true
            break
          end
          if used(sc, sc.bounds[j]) + cost <= sc.qlim then break end
          j = j + 1
          if j > #sc.bounds then
            beyond = true
            break
          end
          if sc.bounds[j] > S then
            push(sc.bounds[j], QUOTA, 0, s)
            changed = true
          end
        end
      end
    end
  end

  local charged = 0

  -- charge every scope that has no reservation at time t
  local function charge(t)
    for _, sc in ipairs(scopes) do
      if not sc.R then
        for i, r in ipairs(sc.rates) do
          sc.P[i] = math.max(sc.P[i], t) + r.inc
        end
        if sc.wlim > 0 then
          add_entries(sc, sc.wp, t, cost)
          sc.wtop = t
        end
        if sc.qlim > 0 then
          add_used(sc, sc.bounds[win_index(sc, t)], cost)
        end
        sc.dirty = true
        charged = 1
      end
    end
  end

  local function reserve_at(t)
    for _, sc in ipairs(scopes) do
      if sc.reservable then
        redis.call('ZADD', sc.rs, fmt(t), id)
        sc.rtop = t
      end
    end
  end

  local allowed, retry, slot = 0, 0, 0
  local wrote = false
  if S > now then
    retry = S - now
    if reserve and not beyond and retry <= horizon then
      slot = S
      if not dry then
        charge(S)
        reserve_at(S)
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
      charge(now)
      reserve_at(now)
      wrote = true
    end
  else
    -- due now: concurrency, then the started meters
    local cwait = nil
    if hold then
      for s, sc in ipairs(scopes) do
        if sc.clim > 0 then
          sc.live = redis.call('ZCOUNT', sc.cc, '(' .. fmt(now), '+inf')
          local mine = redis.call('ZSCORE', sc.cc, id)
          sc.mine = mine and tonumber(mine) > now
          if not sc.mine and sc.live >= sc.clim then
            local first = redis.call('ZRANGEBYSCORE', sc.cc, '(' .. fmt(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
            local w = tonumber(first[2]) - now
            if w > conc_retry then w = conc_retry end
            if cwait == nil or w > cwait then
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
        for i, r in ipairs(sc.rates) do
          local tol = math.min(tolerance, math.floor(r.unit / 4))
          local over = math.max(sc.A[i], now) + r.inc - now - r.off - tol
          if over > w then
            w, rule, ridx, rscope = over, RATE, i, s
          end
        end
        if sc.wlim > 0 then
          local e = redis.call('ZREVRANGEBYSCORE', sc.wa, '+inf', '(' .. fmt(now - sc.wdur), 'WITHSCORES', 'LIMIT', sc.wlim - cost, 1)
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
          charge(now)
          reserve_at(now)
          wrote = true
        end
      else
        allowed = 1
        if not dry then
          charge(now)
          wrote = true
          charged = charged + 2
          for _, sc in ipairs(scopes) do
            if sc.reservable or sc.clim > 0 then
              -- counted for sluice top; kept a few seconds past recovery
              sc.starts = sc.starts + 1
              sc.counted = true
              sc.dirty = true
            end
            for i, r in ipairs(sc.rates) do
              sc.A[i] = math.max(sc.A[i], now) + r.inc
            end
            if sc.wlim > 0 then
              add_entries(sc, sc.wa, now, cost)
              sc.dirty = true
              redis.call('ZREMRANGEBYSCORE', sc.wa, '-inf', fmt(now - sc.wdur))
              sc.watop = now
            end
            if sc.reservable then
              redis.call('ZREM', sc.rs, id)
            end
            if hold and sc.clim > 0 then
              redis.call('ZADD', sc.cc, fmt(now + sc.lease), id)
              if not sc.mine then
                sc.live = sc.live + 1
                if charged < 4 then charged = charged + 4 end
              end
              sc.ctop = now + sc.lease
            end
          end
        end
      end
    end
  end

  -- persist what changed; expiry only ever grows and only reclaims memory
  if wrote then
    local function extend(key, at)
      if noexpire then return end
      local want = math.floor((at - now) / 1000) + 2
      local ttl = redis.call('PTTL', key)
      if ttl == -1 or (ttl >= 0 and ttl < want) then
        redis.call('PEXPIRE', key, want)
      end
    end
    for _, sc in ipairs(scopes) do
      if sc.dirty then
        local h = {}
        local until_ = now
        for i = 1, #sc.rates do
          h[#h + 1] = 'p' .. i; h[#h + 1] = fmt(sc.P[i])
          h[#h + 1] = 'a' .. i; h[#h + 1] = fmt(sc.A[i])
          until_ = math.max(until_, sc.P[i], sc.A[i])
        end
        if sc.qlim > 0 then
          h[#h + 1] = 'qa'; h[#h + 1] = fmt(sc.qa)
          h[#h + 1] = 'qc'; h[#h + 1] = fmt(sc.qc)
          h[#h + 1] = 'qb'; h[#h + 1] = fmt(sc.qb)
          h[#h + 1] = 'qd'; h[#h + 1] = fmt(sc.qd)
          for j = 1, #sc.bounds - 1 do
            if (sc.bounds[j] == sc.qa and sc.qc > 0) or (sc.bounds[j] == sc.qb and sc.qd > 0) then
              until_ = math.max(until_, sc.bounds[j + 1])
            end
          end
        end
        if sc.counted then
          h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts)
          until_ = math.max(until_, now + 5000000)
        end
        if sc.wlim > 0 then
          h[#h + 1] = 'n'; h[#h + 1] = fmt(sc.n)
          until_ = math.max(until_, (sc.wtop or 0) + sc.wdur, (sc.watop or 0) + sc.wdur)
          redis.call('ZREMRANGEBYSCORE', sc.wp, '-inf', fmt(now - sc.wdur))
          if sc.wtop then extend(sc.wp, sc.wtop + sc.wdur) end
          if sc.watop then extend(sc.wa, sc.watop + sc.wdur) end
        end
        if #h > 0 then
          redis.call('HSET', sc.st, unpack(h))
          extend(sc.st, until_)
        end
      end
      if sc.reservable then
        redis.call('ZREMRANGEBYSCORE', sc.rs, '-inf', fmt(now - grace))
        if sc.rtop then extend(sc.rs, sc.rtop + grace) end
      end
      if sc.ctop then
        redis.call('ZREMRANGEBYSCORE', sc.cc, '-inf', fmt(now))
        extend(sc.cc, sc.ctop)
      end
    end
  end

  -- what is left after this decision
  local remaining, reset, inflight = -1, -1, -1
  local function low(n)
    if n < 0 then n = 0 end
    if remaining < 0 or n < remaining then remaining = n end
  end
  local function high(t)
    if t < 0 then t = 0 end
    if t > reset then reset = t end
  end
  for s, sc in ipairs(scopes) do
    for i, r in ipairs(sc.rates) do
      local tat = math.max(sc.P[i], now)
      low(math.floor((now + r.off - tat) / r.unit))
      high(tat - now)
    end
    if sc.wlim > 0 then
      local lo = '(' .. fmt(now - sc.wdur)
      low(sc.wlim - redis.call('ZCOUNT', sc.wp, lo, '+inf'))
      local top = redis.call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', 0, 1)
      if top[2] then high(tonumber(top[2]) + sc.wdur - now) else high(0) end
    end
    if sc.qlim > 0 then
      low(sc.qlim - used(sc, sc.bounds[sc.cur]))
      local last = 0
      for j = sc.cur, math.min(sc.cur + 1, #sc.bounds - 1) do
        if used(sc, sc.bounds[j]) > 0 then last = sc.bounds[j + 1] end
      end
      high(last - now)
    end
    if sc.clim > 0 then
      local live = sc.live or redis.call('ZCOUNT', sc.cc, '(' .. fmt(now), '+inf')
      low(sc.clim - live)
      if inflight < 0 then inflight = live end
    end
  end

  out[op] = { allowed, retry, rule, ridx, rscope, remaining, reset, inflight, slot, now, charged }
end

return out
