-- settle.lua: settles a job's cost once it ran. The job was admitted and
-- charged on an estimated cost; its actual cost is now known, and every
-- rate, window and quota meter of its scopes is moved as if the actual
-- cost had been charged where the estimate was: the planned meters at the
-- job's planned time (its slot: when it started, or the reservation it
-- started on), the started meters at its start. The job's place is not
-- stored in Redis: the caller carries it from the decision.
--
-- Exactness, per rule kind (docs/operations.md, "Settled costs"):
--   window: the job's entries are at known scores, and entries of one
--     score are alike: removing or adding entries there is exact.
--   quota: the count of the calendar window holding the planned time is
--     moved by the difference: exact (a window that ended is left alone).
--   rate: a meter (GCRA: a charge moves it to max(meter, t) + increment)
--     takes an extra charge exactly while no later charge found the
--     meter idle; adding the difference is then exact, and otherwise
--     never less than as-if (the cautious side). A refund is given only
--     where the job's charge is still the meter's last and found it idle
--     (the meter stands at t + increment): then it is exact; otherwise the
--     room is kept, at most the refund's increment per meter, since a
--     later charge may have taken its place already (as-if, a reservation
--     made at the meter's edge leaves the refunded room unused). A meter
--     charged at another interval than its rule's (the policy changed
--     since the job started) is not settled.
--
-- KEYS: per scope its state hash [1] and, when its policy has a window
--   rule, its planned [2] and started [3] window zsets (admit.lua's)
-- ARGV:
--   [1] clock: the time to settle at, or -1 for Redis TIME
--   [2] the estimated cost the job was charged, [3] its actual cost
--   [4] its planned time (µs), [5] its start time (µs)
--   [6] flags: 16 set no expiry
--   [7] number of scopes, then per scope its policy as admit.lua reads
--     it: the number of rules, then per rule its kind and arguments
-- Returns: {now, kept, changed}: kept, the rate meters whose refund could
--   not be given back (the cautious side); changed, the scopes written
--   (a job whose charges have all run out changes nothing).
-- Writes, besides the meters: sr and se in each changed scope's state
--   hash, the cost refunded and charged extra by settlements (sluice
--   stats), kept while the scope's state lives.

local call, unpack = redis.call, unpack
local floor, max, min = math.floor, math.max, math.min
local num = tonumber

-- @include clock

local now = now_us()
local est, act = num(ARGV[2]), num(ARGV[3])
local tp, ta = num(ARGV[4]), num(ARGV[5])
local noexpire = floor(num(ARGV[6]) / 16) % 2 == 1
local nscopes = num(ARGV[7])

-- @include expire

-- the increment of cost c on a rate of limit per period: ceil(per * c /
-- lim), exactly, as admit.lua's scope() computes it
local function inc(per, lim, c)
  local r = per % lim
  local y = floor(r * c / lim)
  if y * lim < r * c then y = y + 1 end
  return (per - r) / lim * c + y
end

-- a rate meter m that the job charged at t with increment ie, settled to
-- increment ic: its new value and whether a refund was kept
local function meter(m, t, ie, ic)
  if ic >= ie then
    -- an extra charge (possibly into debt: the next start waits)
    if max(m, t + ie) + ic - ie <= now and m <= now then return m, false end
    return max(m, t + ie) + ic - ie, false
  end
  if m <= now then return m, false end -- idle: nothing held to give back
  if m == t + ie then return t + ic, false end -- the last charge: exact
  return m, true
end

-- move the job's window entries at score t of key by the difference
local function window(key, t, wlim, wdur, n)
  if t + wdur <= now then return false, n end -- they have left the window
  if act < est then
    local ids = call('ZRANGEBYSCORE', key, fmt(t), fmt(t), 'LIMIT', '0', fmt(est - act))
    for i = 1, #ids, 1000 do
      call('ZREM', key, unpack(ids, i, min(i + 999, #ids)))
    end
    return #ids > 0, n
  end
  -- more than the limit of entries at one time holds the window as the
  -- limit does: the rest would change no decision
  local z = {}
  local seq = n or now
  for c = 1, min(act - est, wlim) do
    seq = seq + 1
    z[#z + 1] = fmt(t)
    z[#z + 1] = fmt(seq)
    if #z >= 2000 then
      call('ZADD', key, unpack(z))
      z = {}
    end
  end
  if #z > 0 then call('ZADD', key, unpack(z)) end
  extend_to(key, t + wdur)
  return true, seq
end

local kept, changed = 0, 0
local a, k = 8, 0
for s = 1, nscopes do
  local st = KEYS[k + 1]
  local nrules = num(ARGV[a])
  a = a + 1
  local rates, wlim, wdur, bounds, qlim, clim = {}, 0, 0, false, 0, 0
  for _ = 1, nrules do
    local kind = num(ARGV[a])
    if kind == 1 then
      rates[#rates + 1] = { unit = ARGV[a + 1], per = num(ARGV[a + 3]), lim = num(ARGV[a + 4]) }
      a = a + 5
    elseif kind == 2 then
      wlim, wdur = num(ARGV[a + 1]), num(ARGV[a + 2])
      a = a + 3
    elseif kind == 3 then
      qlim = num(ARGV[a + 1])
      local nb = num(ARGV[a + 2])
      bounds = {}
      for j = 1, nb do bounds[j] = num(ARGV[a + 2 + j]) end
      a = a + 3 + nb
    elseif kind == 4 then
      clim = num(ARGV[a + 1])
      a = a + 3
    else
      return redis.error_reply('ERR sluice: settle: unknown rule kind ' .. tostring(kind))
    end
  end
  local fields = { 'x', 'y', 'n', 'qa', 'qc', 'qb', 'qd', 'sr', 'se' }
  for i = 1, #rates do
    fields[#fields + 1] = 'p' .. i
    fields[#fields + 1] = 'a' .. i
    fields[#fields + 1] = 'i' .. i
  end
  local v = call('HMGET', st, unpack(fields))
  local x, y, n = num(v[1]) or 0, num(v[2]) or 0, num(v[3]) or false
  local h, hdel, need, wrote = {}, {}, now, false
  for i = 1, #rates do
    local r = rates[i]
    local ie, ic = inc(r.per, r.lim, est), inc(r.per, r.lim, act)
    local j = 7 + 3 * i
    local P = num(v[j]) or 0
    local A = v[j + 1] and num(v[j + 1]) or P
    local P2, kp, A2, ka = P, false, A, false
    -- meters charged at another interval (the policy changed since the
    -- job started, or they ran out and were forgotten) are left alone
    if v[j + 2] == r.unit then
      P2, kp = meter(P, tp, ie, ic)
      A2, ka = meter(A, ta, ie, ic)
    end
    if kp then kept = kept + 1 end
    if ka then kept = kept + 1 end
    if P2 ~= P or A2 ~= A then
      wrote = true
      h[#h + 1] = 'p' .. i; h[#h + 1] = fmt(P2)
      if A2 ~= P2 then
        h[#h + 1] = 'a' .. i; h[#h + 1] = fmt(A2)
      elseif v[j + 1] then
        hdel[#hdel + 1] = 'a' .. i
      end
      need = max(need, P2, A2)
    end
  end
  if wlim > 0 then
    local wp, wa = KEYS[k + 2], KEYS[k + 3]
    local w1, w2
    w1, n = window(wp, tp, wlim, wdur, n)
    w2, n = window(wa, ta, wlim, wdur, n)
    if w1 or w2 then
      wrote = true
      if n then h[#h + 1] = 'n'; h[#h + 1] = fmt(n) end
      need = max(need, ta + wdur, tp + wdur)
    end
    k = k + 3
  else
    k = k + 1
  end
  if qlim > 0 then
    for j = 1, #bounds - 1 do
      if bounds[j] <= tp and tp < bounds[j + 1] then
        for _, f in ipairs({ { 'qa', 'qc', 4 }, { 'qb', 'qd', 6 } }) do
          if num(v[f[3]]) == bounds[j] then
            local c = max((num(v[f[3] + 1]) or 0) + act - est, 0)
            h[#h + 1] = f[2]; h[#h + 1] = fmt(c)
            wrote = true
            if c > 0 then need = max(need, bounds[j + 1]) end
          end
        end
      end
    end
  end
  if wrote then
    changed = changed + 1
    -- counted for sluice stats; kept a few seconds past recovery, as the
    -- starts are
    need = max(need, now + 5000000)
    if act < est then
      h[#h + 1] = 'sr'; h[#h + 1] = fmt((num(v[8]) or 0) + est - act)
    else
      h[#h + 1] = 'se'; h[#h + 1] = fmt((num(v[9]) or 0) + act - est)
    end
    if clim > 0 and need + 1000000 > y then
      h[#h + 1] = 'y'; h[#h + 1] = fmt(need + 2000000)
    end
    if need > x and not noexpire then
      h[#h + 1] = 'x'; h[#h + 1] = fmt(need + 1000000)
    end
    call('HSET', st, unpack(h))
    if #hdel > 0 then call('HDEL', st, unpack(hdel)) end
    extend_to(st, need + 1000000)
  end
end
return { now, kept, changed }
