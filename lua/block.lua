-- block.lua: blocks of starts and concurrency slots for a tenant far from
-- its limits (internal/blocks). A worker process takes a block in one call
-- and starts jobs from it without asking Redis again, then gives back what
-- it did not use; the charges are made so that any way of spending the
-- block inside its window conforms to the tenant's rules exactly, and the
-- tenant keeps at least half its burst and half its concurrency for the
-- jobs decided one by one.
--
-- Only a tenant whose policy has rate and concurrency rules alone is
-- served from blocks (the caller checks): its state is the hash admit.lua
-- keeps (phases.lua: p<i>, a<i>, i<i>; concurrency.lua: hc, hm, y and a
-- slot per field h:<holder>), read and written here in the same layout.
--
-- A block of n starts granted at now with window V is charged on both
-- meters of every rate as if all n started at now + V, and granted only
-- while all n would conform even at now: for a meter m (its planned or its
-- started TAT), max(m, now + V) + n * unit - off <= now, with room left for
-- half the burst: <= now - off / 2. The window is a quarter of the
-- smallest burst's span, at most the caller's longest and at least 25 ms. Any start inside [now, now + V] then
-- conforms, whatever the decisions after the grant (they see the meter the
-- block left). A slot of the block is a slot field h:b<ID>:<j> under the
-- block's claim, with a lease the holder renews: a crashed process's slots
-- free themselves with their lease.
--
-- KEYS: [1] the tenant's state hash
-- ARGV:
--   [1] clock: the time to decide at, or -1 for Redis TIME
--   [2] op: 1 grant, 2 renew, 3 return; plus 16 to set no expiry (tests)
--   grant: [3] block id, [4] claim token, [5] starts wanted (cost units),
--     [6] slots wanted, [7] the longest window (µs), [8] number of rates,
--     then per rate its unit (the increment of cost 1, µs, as admit.lua
--     takes it) and burst offset, then the concurrency limit (0: no rule)
--     and lease (µs)
--   renew: [3] block id, [4] claim, [5] slots, [6] lease (µs)
--   return: [3] block id, [4] claim, [5] slots, [6] starts not used, [7]
--     starts granted, [8] the time of the last start (µs; no start was
--     later), [9] number of rates, then per rate its unit and the
--     planned and started meters before the grant and after it (the
--     grant's reply)
-- Returns:
--   grant: {starts, window (µs), slots, now, {per rate the planned and
--     started meters before the grant, then after it}}
--     or {0, reason}: reason 1 a cooldown, 2 a rate re-timed (its meters
--     were charged at another interval: admit.lua re-times them first), 3
--     too near a rate's limit, 4 too near the concurrency limit, 5 no
--     window (a burst too small to span one)
--   renew: how many of the block's slots were renewed (one whose lease
--     ran out is not: the holder stops using the block)
--   return: how many slots were freed, and 1 when every rate's unused
--     starts were given back (0: a charge came after the block's, which
--     keeps them)

local call, tonumber, unpack = redis.call, tonumber, unpack
local floor, max, min = math.floor, math.max, math.min
local num = tonumber

-- @include clock
-- @include slot

-- the shortest window a block is granted for (µs)
local MIN_WINDOW = 25000

local now = now_us()
local st = KEYS[1]
local opn = tonumber(ARGV[2])
local op, noexpire = tostring(opn % 16), opn >= 16
local id, claim = ARGV[3], ARGV[4]

-- @include expire

local function field(j)
  return 'h:b' .. id .. ':' .. j
end

if op == '1' then
  local want, kwant, vmax, nr = num(ARGV[5]), num(ARGV[6]), num(ARGV[7]), num(ARGV[8])
  local a = 9
  local fields = { 'cd', 'x', 'hc', 'hm', 'y', 's' }
  for i = 1, nr do
    fields[#fields + 1] = 'p' .. i
    fields[#fields + 1] = 'a' .. i
    fields[#fields + 1] = 'i' .. i
  end
  local v = call('HMGET', st, unpack(fields))
  if (num(v[1]) or 0) > now then return { 0, 1 } end
  -- the window: a quarter of the smallest burst, at most vmax
  local V = vmax
  for i = 1, nr do
    V = min(V, floor(num(ARGV[a + 2 * i - 1]) / 4))
  end
  -- a burst spanning less than 100 ms gets no block: a cautious choice
  -- (docs/operations.md), the few ms by which a start reaches the
  -- downstream weighing more against so short a window
  if V < MIN_WINDOW then return { 0, 5 } end
  local n = want
  local meters = {}
  for i = 1, nr do
    local unit, off = num(ARGV[a + 2 * i - 2]), num(ARGV[a + 2 * i - 1])
    local P, A, I = num(v[4 + 3 * i]) or 0, v[5 + 3 * i], v[6 + 3 * i]
    A = A and num(A) or P
    if I and I ~= ARGV[a + 2 * i - 2] and (P > now or A > now) then return { 0, 2 } end
    local top = now + floor(off / 2)
    for _, m in ipairs({ P, A }) do
      n = min(n, floor((top - max(m, now + V)) / unit))
    end
    meters[i] = { unit, P, A }
  end
  -- a block of one start would cost two calls (its grant and its
  -- return) for what one decision does
  if n < 2 then return { 0, 3 } end
  a = a + 2 * nr
  local clim, lease = num(ARGV[a]), num(ARGV[a + 1])
  local k = 0
  local hc, hm = num(v[3]) or 0, num(v[4]) or 0
  if clim > 0 and kwant > 0 then
    -- the live slots: all recorded ones while the earliest lease end is
    -- ahead, or counted
    local live = hc
    if hc > 0 and hm <= now then
      live = 0
      local cursor = '0'
      repeat
        local res = call('HSCAN', st, cursor, 'MATCH', 'h:*', 'COUNT', '1000')
        cursor = res[1]
        local kv = res[2]
        for j = 2, #kv, 2 do
          if slot_lease(kv[j]) > now then live = live + 1 end
        end
      until cursor == '0'
    end
    k = min(kwant, floor(clim / 2) - live, floor((clim - live) / 4))
    if k < 1 then return { 0, 4 } end
  end
  -- charge: every meter as if the n starts were at now + V
  local h = { 's', fmt((num(v[6]) or 0) + n) }
  local need, out = now, {}
  for i = 1, nr do
    local m = meters[i]
    local P = max(m[2], now + V) + n * m[1]
    local A = max(m[3], now + V) + n * m[1]
    h[#h + 1] = 'p' .. i; h[#h + 1] = fmt(P)
    h[#h + 1] = 'a' .. i; h[#h + 1] = fmt(A)
    h[#h + 1] = 'i' .. i; h[#h + 1] = ARGV[9 + 2 * i - 2]
    need = max(need, P, A)
    out[#out + 1] = m[2]
    out[#out + 1] = m[3]
    out[#out + 1] = P
    out[#out + 1] = A
  end
  local held = 0
  if k > 0 then
    local e = now + lease
    local es = slot_text(fmt(e), claim)
    for j = 1, k do
      h[#h + 1] = field(j); h[#h + 1] = es
    end
    h[#h + 1] = 'hc'; h[#h + 1] = fmt(hc + k)
    h[#h + 1] = 'hm'; h[#h + 1] = fmt(hc == 0 and e or min(hm, e))
    held = e
  end
  if clim > 0 and need + 1000000 > (num(v[5]) or 0) then
    h[#h + 1] = 'y'; h[#h + 1] = fmt(need + 2000000)
  end
  local until_ = max(need, held)
  if until_ > (num(v[2]) or 0) and not noexpire then
    h[#h + 1] = 'x'; h[#h + 1] = fmt(until_ + 1000000)
    call('HSET', st, unpack(h))
    extend_to(st, until_ + 1000000)
  else
    call('HSET', st, unpack(h))
  end
  return { n, V, k, now, out }
end

if op == '2' then
  local k, lease = num(ARGV[5]), num(ARGV[6])
  local names = {}
  for j = 1, k do names[j] = field(j) end
  local v = call('HMGET', st, unpack(names))
  local e = now + lease
  local es = slot_text(fmt(e), claim)
  local h, renewed = {}, 0
  for j = 1, k do
    -- a slot whose lease ran out is not renewed: single decisions may
    -- have counted it free since
    if v[j] and held_by(v[j], claim) and slot_lease(v[j]) > now then
      h[#h + 1] = names[j]; h[#h + 1] = es
      renewed = renewed + 1
    end
  end
  if renewed > 0 then
    local x = num(call('HGET', st, 'x')) or 0
    if e > x and not noexpire then
      h[#h + 1] = 'x'; h[#h + 1] = fmt(e + 1000000)
      extend_to(st, e + 1000000)
    end
    call('HSET', st, unpack(h))
  end
  return renewed
end

if op == '3' then
  local k, unused, n, last, nr = num(ARGV[5]), num(ARGV[6]), num(ARGV[7]), num(ARGV[8]), num(ARGV[9])
  local used = n - unused
  local freed = 0
  if k > 0 then
    local names = {}
    for j = 1, k do names[j] = field(j) end
    local v = call('HMGET', st, unpack(names))
    local del = {}
    for j = 1, k do
      if v[j] and held_by(v[j], claim) then del[#del + 1] = names[j] end
    end
    if #del > 0 then
      freed = call('HDEL', st, unpack(del))
      local hc = num(call('HGET', st, 'hc')) or 0
      call('HSET', st, 'hc', fmt(max(hc - freed, 0)))
    end
  end
  local all = 1
  if nr > 0 then
    -- the unused starts go back on each meter where the block's charge is
    -- still the last (nothing was charged after it), as a late ticket's do
    local a = 10
    local h = {}
    for i = 1, nr do
      local unit, P1, A1, P2, A2 = ARGV[a], num(ARGV[a + 1]), num(ARGV[a + 2]), num(ARGV[a + 3]), num(ARGV[a + 4])
      a = a + 5
      local v = call('HMGET', st, 'p' .. i, 'a' .. i, 'i' .. i)
      local P, A = num(v[1]), v[2]
      A = A and num(A) or P
      if v[3] ~= unit then
        all = 0
      else
        -- the meter becomes what the used starts charge from where it was
        -- before the block, as if all came at the last of them (at most
        -- the window's end): no start was later, so every later decision
        -- stays exact; a block none of whose starts was used leaves the
        -- meter as it was
        local u = num(unit)
        if P == P2 then
          h[#h + 1] = 'p' .. i
          h[#h + 1] = fmt(used == 0 and P1 or max(P1, min(last, P2 - n * u)) + used * u)
        else
          all = 0
        end
        if A == A2 then
          h[#h + 1] = 'a' .. i
          h[#h + 1] = fmt(used == 0 and A1 or max(A1, min(last, A2 - n * u)) + used * u)
        else
          all = 0
          if P == P2 then
            -- the started meter stays: store it, as the planned one moved
            h[#h + 1] = 'a' .. i; h[#h + 1] = fmt(A)
          end
        end
      end
    end
    if #h > 0 then
      local s = num(call('HGET', st, 's')) or 0
      h[#h + 1] = 's'; h[#h + 1] = fmt(max(s - unused, 0))
      call('HSET', st, unpack(h))
    end
  end
  return { freed, all }
end

return redis.error_reply('ERR sluice: block.lua: unknown op ' .. tostring(op))
