-- admit_fast.lua: admit.lua for the common case, at a fraction of its cost:
-- every op has one scope (a tenant without @global rules, or @global alone)
-- whose policy has only rate rules and perhaps a concurrency rule (no
-- window, no quota). Its decisions are exactly admit.lua's (the randomised
-- model test holds both to the same reference); it only avoids the tables
-- and loops the general script needs for several scopes and rule kinds.
--
-- KEYS, ARGV and Returns: as admit.lua, with 3 keys per op (the window keys
-- are passed but not used) and policies of features 0 or 4 only.

local call, tonumber, unpack, format = redis.call, tonumber, unpack, string.format
local floor, max, min = math.floor, math.max, math.min
local KEYS, ARGV = KEYS, ARGV

local RATE, CONC, COOL, RESV = 1, 4, 5, 6
local PF = { 'p1', 'p2', 'p3', 'p4', 'p5', 'p6', 'p7', 'p8', 'p9', 'p10', 'p11', 'p12' }
local AF = { 'a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7', 'a8', 'a9', 'a10', 'a11', 'a12' }

local function fmt(v)
  return format('%d', v)
end

local now
local clock = tonumber(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nops = tonumber(ARGV[2])
local horizon, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local tolerance, conc_retry = tonumber(ARGV[5]), tonumber(ARGV[6])

local function extend_to(key, t)
  local ms = fmt(floor((t - now) / 1000) + 2)
  if call('PEXPIRE', key, ms, 'GT') == 0 then
    call('PEXPIRE', key, ms, 'NX')
  end
end

-- the running jobs: how many are live, the earliest live lease end, and the
-- fields of slots whose lease ran out (other than the job's own)
local function scan(st, hkey)
  local live, soonest, stale = 0, false, {}
  local cursor = '0'
  repeat
    local res = call('HSCAN', st, cursor, 'MATCH', 'h:*', 'COUNT', '1000')
    cursor = res[1]
    local kv = res[2]
    for i = 1, #kv, 2 do
      local e = tonumber(kv[i + 1])
      if e > now then
        live = live + 1
        if not soonest or e < soonest then soonest = e end
      elseif kv[i] ~= hkey then
        stale[#stale + 1] = kv[i]
      end
    end
  until cursor == '0'
  return live, soonest, stale
end

-- the policies of this call: {rates, unit[], off[], concurrency limit, lease}
local POL = {}
local a = 8
for p = 1, tonumber(ARGV[7]) do
  local features, nr = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local unit, off = {}, {}
  for i = 1, nr do
    unit[i], off[i] = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
  end
  local clim, lease = 0, 0
  if features == 4 then
    clim, lease = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
  end
  POL[p] = { nr, unit, off, clim, lease }
end

local out = {}
for op = 1, nops do
  local id = ARGV[a]
  local cost = tonumber(ARGV[a + 1])
  local flags = tonumber(ARGV[a + 2])
  local not_before = tonumber(ARGV[a + 3])
  local pol = POL[tonumber(ARGV[a + 5])]
  a = a + 6
  local nr, unit, off, clim, lease = pol[1], pol[2], pol[3], pol[4], pol[5]
  local inc = unit
  if cost ~= 1 then
    inc = {}
    for i = 1, nr do
      inc[i] = tonumber(ARGV[a]); a = a + 1
    end
  end
  local reserve = flags % 2 == 1
  local hold = floor(flags / 2) % 2 == 1
  local dry = floor(flags / 4) % 2 == 1
  local plan = floor(flags / 8) % 2 == 1
  local noexpire = floor(flags / 16) % 2 == 1
  local st = KEYS[3 * op - 2]
  local rkey, hkey = 'r:' .. id, 'h:' .. id

  local v
  if nr == 1 then
    if clim > 0 then
      v = call('HMGET', st, 'cd', 's', 'x', 'rn', 'rc', rkey, hkey, 'hc', 'hm', 'p1', 'a1')
    else
      v = call('HMGET', st, 'cd', 's', 'x', 'rn', 'rc', rkey, 'p1', 'a1')
    end
  else
    local fields = { 'cd', 's', 'x', 'rn', 'rc', rkey }
    if clim > 0 then
      fields[7], fields[8], fields[9] = hkey, 'hc', 'hm'
    end
    for i = 1, nr do
      fields[#fields + 1] = PF[i]
      fields[#fields + 1] = AF[i]
    end
    v = call('HMGET', st, unpack(fields))
  end
  local cd = tonumber(v[1]) or 0
  local starts = tonumber(v[2]) or 0
  local x = tonumber(v[3]) or 0
  local rn = tonumber(v[4]) or 0
  local rc = tonumber(v[5]) or 0
  local r = tonumber(v[6])
  local hend, hc, hm = nil, 0, 0
  local j = 7
  if clim > 0 then
    hend, hc, hm = tonumber(v[7]), tonumber(v[8]) or 0, tonumber(v[9]) or 0
    j = 10
  end
  local P, A, astored = {}, {}, false
  for i = 1, nr do
    P[i] = tonumber(v[j]) or 0
    local s = v[j + 1]
    if s then
      A[i] = tonumber(s)
      astored = astored or {}
      astored[i] = true
    else
      A[i] = P[i]
    end
    j = j + 2
  end
  local reservable = nr > 0

  -- the job's own reservation, if it is still good
  local hadR = r ~= nil
  if r and (r + grace <= now or (cd > now and r < cd)) then
    r = nil
  end

  local S = max(now, not_before)
  local rule, ridx, rscope = 0, 0, 0
  if cd > now and cd > S then
    S, rule, ridx, rscope = cd, COOL, 0, 1
  end
  if r then
    if r > S then
      S, rule, ridx, rscope = r, RESV, 0, 1
    end
  else
    for i = 1, nr do
      local t = P[i] + inc[i] - off[i]
      if t > S then
        S, rule, ridx, rscope = t, RATE, i, 1
      end
    end
  end

  local charged, dirty, counted = 0, false, false
  local rtop, dropR, holdEnd, stale = nil, false, nil, nil
  local live, mine, soonest = nil, false, nil

  local function charge(t)
    if not r then
      for i = 1, nr do
        P[i] = max(P[i], t) + inc[i]
      end
      dirty = true
      charged = 1
    end
  end
  local function reserve_at(t)
    if reservable then
      if not hadR then rn = rn + 1 end
      hadR = true
      rtop = t
      dirty = true
    end
  end
  local function count_holders(need_soonest)
    if live then
      if need_soonest and not soonest then
        local _, s = scan(st, hkey)
        soonest = s
      end
      return
    end
    if hc == 0 then
      live, mine = 0, false
    elseif hm > now and not need_soonest then
      live, mine = hc, hend ~= nil
    else
      live, soonest, stale = scan(st, hkey)
      mine = hend ~= nil and hend > now
    end
  end

  local allowed, retry, slot = 0, 0, 0
  local wrote = false
  if S > now then
    retry = S - now
    if reserve and retry <= horizon then
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
    allowed, slot = 1, now
    rule, ridx, rscope = 0, 0, 0
    if not dry then
      charge(now)
      reserve_at(now)
      wrote = true
    end
  else
    local cwait = false
    if hold and clim > 0 then
      count_holders(false)
      if not mine and live >= clim then
        count_holders(true)
        cwait, rule, ridx, rscope = min(soonest - now, conc_retry), CONC, 0, 1
      end
    end
    if cwait then
      retry = cwait
    else
      local w = 0
      rule, ridx, rscope = 0, 0, 0
      for i = 1, nr do
        local tol = min(tolerance, floor(unit[i] / 4))
        local over = max(A[i], now) + inc[i] - now - off[i] - tol
        if over > w then
          w, rule, ridx, rscope = over, RATE, i, 1
        end
      end
      if w > 0 then
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
          charged = charged + 2
          wrote = true
          if reservable or clim > 0 then
            starts = starts + 1
            counted = true
            dirty = true
          end
          for i = 1, nr do
            A[i] = max(A[i], now) + inc[i]
          end
          if hadR then
            dropR = true
            dirty = true
          end
          if hold and clim > 0 then
            local e = now + lease
            local n = stale and live or hc
            if not mine then
              n = n + 1
              charged = charged + 4
            end
            if stale then
              hm = min(soonest or e, e)
            elseif hc == 0 then
              hm = e
            else
              hm = min(hm, e)
            end
            hc, live, holdEnd = n, live + (mine and 0 or 1), e
          end
        end
      end
    end
  end

  if wrote and dirty then
    -- the reservation sweep and the writes of admit.lua's persist
    if rn > 0 and counted and starts % 64 == 0 then
      local res = call('HSCAN', st, fmt(rc), 'MATCH', 'r:*', 'COUNT', '64')
      rc = tonumber(res[1])
      local old = {}
      local kv = res[2]
      for i = 1, #kv, 2 do
        if tonumber(kv[i + 1]) + grace <= now and kv[i] ~= rkey then
          old[#old + 1] = kv[i]
        end
      end
      if #old > 0 then
        rn = max(rn - call('HDEL', st, unpack(old)), 0)
      end
    end
    local h = {}
    local until_ = now
    if rtop then
      h[1] = rkey; h[2] = fmt(rtop)
      until_ = rtop + grace
    elseif dropR then
      call('HDEL', st, rkey)
      rn = max(rn - 1, 0)
    end
    if rn > 0 or dropR then
      h[#h + 1] = 'rn'; h[#h + 1] = fmt(rn)
      h[#h + 1] = 'rc'; h[#h + 1] = fmt(rc)
    end
    local adel
    for i = 1, nr do
      h[#h + 1] = PF[i]; h[#h + 1] = fmt(P[i])
      if A[i] ~= P[i] then
        h[#h + 1] = AF[i]; h[#h + 1] = fmt(A[i])
      elseif astored and astored[i] then
        adel = adel or {}
        adel[#adel + 1] = AF[i]
      end
      until_ = max(until_, P[i], A[i])
    end
    if adel then
      call('HDEL', st, unpack(adel))
    end
    if counted then
      h[#h + 1] = 's'; h[#h + 1] = fmt(starts)
      until_ = max(until_, now + 5000000)
    end
    if holdEnd then
      h[#h + 1] = hkey; h[#h + 1] = fmt(holdEnd)
      h[#h + 1] = 'hc'; h[#h + 1] = fmt(hc)
      h[#h + 1] = 'hm'; h[#h + 1] = fmt(hm)
      until_ = max(until_, holdEnd)
      if stale and #stale > 0 then
        call('HDEL', st, unpack(stale))
      end
    end
    if until_ > x and not noexpire then
      h[#h + 1] = 'x'; h[#h + 1] = fmt(until_ + 1000000)
      call('HSET', st, unpack(h))
      extend_to(st, until_ + 1000000)
    elseif #h > 0 then
      call('HSET', st, unpack(h))
    end
  end

  -- what is left after this decision
  local remaining, reset, inflight = -1, -1, -1
  for i = 1, nr do
    local tat = max(P[i], now)
    local n = max(floor((now + off[i] - tat) / unit[i]), 0)
    if remaining < 0 or n < remaining then remaining = n end
    reset = max(reset, tat - now)
  end
  if clim > 0 then
    count_holders(false)
    local n = max(clim - live, 0)
    if remaining < 0 or n < remaining then remaining = n end
    inflight = live
  end

  out[op] = { allowed + 2 * charged, retry, rule * 65536 + ridx * 256 + rscope, remaining, reset, inflight, slot }
end

out[nops + 1] = now
return out
