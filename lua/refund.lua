-- refund.lua: undoes what admit.lua charged one job in one scope. On Redis
-- Cluster a tenant and @global live in different slots, so a job is admitted
-- in two steps; when the second step denies it, the first is refunded here.
--
-- KEYS[1] -> state hash, KEYS[2] -> planned window zset, KEYS[3] -> started
--   window zset
-- ARGV[1] -> job id
-- ARGV[2] -> the time the job was charged at (µs)
-- ARGV[3] -> what admit.lua charged: 1 planned meters, 2 started meters
--   (a start's window entries are removed; its rate meters stay charged),
--   4 a new concurrency slot; and what the caller knows it did besides:
--   8 counted a start (field s), 16 started the job on its reservation
--   (which admit.lua then deleted: it is put back at ARGV[2])
-- ARGV[4] -> cost
-- ARGV[5] -> quota window start the job was counted in (0: none)
-- ARGV[6] -> number of rates, then ARGV[7..] -> the increment of each rate
-- ARGV[7 + number of rates] -> reservation grace (µs): a reservation put
--   back keeps the hash alive that long (never shortening its life)
-- Returns: 1

local id = ARGV[1]
local t = tonumber(ARGV[2])
local charged = tonumber(ARGV[3])
local planned = charged % 2 == 1
local started = math.floor(charged / 2) % 2 == 1
local holder = math.floor(charged / 4) % 2 == 1
local counted = math.floor(charged / 8) % 2 == 1
local restore = math.floor(charged / 16) % 2 == 1
local cost = tonumber(ARGV[4])
local qstart = tonumber(ARGV[5])
local nr = tonumber(ARGV[6])
local grace = tonumber(ARGV[7 + nr])
local function fmt(v) return string.format('%d', v) end

local h, del = {}, {}
for i = 1, nr do
  local inc = tonumber(ARGV[6 + i])
  local v = redis.call('HMGET', KEYS[1], 'p' .. i, 'a' .. i)
  local p, a = tonumber(v[1]), tonumber(v[2])
  if p then
    -- a started meter equal to its planned one is not stored
    a = a or p
    if planned then p = p - inc end
    -- the started meter is not refunded: other jobs may have started
    -- against it since, and lowering it would let the next start come too
    -- soon after theirs; it stays charged, the cautious side
    h[#h + 1] = 'p' .. i; h[#h + 1] = fmt(p)
    if a ~= p then
      h[#h + 1] = 'a' .. i; h[#h + 1] = fmt(a)
    elseif v[2] then
      del[#del + 1] = 'a' .. i
    end
  end
end
if qstart > 0 and planned then
  local v = redis.call('HMGET', KEYS[1], 'qa', 'qc', 'qb', 'qd')
  if tonumber(v[1]) == qstart and tonumber(v[2]) then
    h[#h + 1] = 'qc'; h[#h + 1] = fmt(math.max(0, tonumber(v[2]) - cost))
  elseif tonumber(v[3]) == qstart and tonumber(v[4]) then
    h[#h + 1] = 'qd'; h[#h + 1] = fmt(math.max(0, tonumber(v[4]) - cost))
  end
end
if counted then
  local s = tonumber(redis.call('HGET', KEYS[1], 's'))
  if s and s > 0 then h[#h + 1] = 's'; h[#h + 1] = fmt(s - 1) end
end
if #h > 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], unpack(h))
end
if #del > 0 then
  redis.call('HDEL', KEYS[1], unpack(del))
end
local function drop(key)
  local m = redis.call('ZRANGEBYSCORE', key, fmt(t), fmt(t), 'LIMIT', 0, cost)
  if #m > 0 then redis.call('ZREM', key, unpack(m)) end
end
if planned then drop(KEYS[2]) end
if started then drop(KEYS[3]) end
if holder and redis.call('HDEL', KEYS[1], 'h:' .. id) == 1 then
  redis.call('HINCRBY', KEYS[1], 'hc', '-1')
end
if restore then
  if redis.call('HSET', KEYS[1], 'r:' .. id, fmt(t)) == 1 then
    local rn = tonumber(redis.call('HGET', KEYS[1], 'rn')) or 0
    redis.call('HSET', KEYS[1], 'rn', rn + 1)
  end
  -- GT never gives a TTL to a key that has none
  redis.call('PEXPIRE', KEYS[1], fmt(math.floor(grace / 1000) + 2), 'GT')
elseif redis.call('HDEL', KEYS[1], 'r:' .. id) == 1 then
  local rn = tonumber(redis.call('HGET', KEYS[1], 'rn')) or 1
  redis.call('HSET', KEYS[1], 'rn', math.max(rn - 1, 0))
end
return 1
