-- refund.lua: undoes what admit.lua charged one job in one scope. On Redis
-- Cluster a tenant and @global live in different slots, so a job is admitted
-- in two steps; when the second step denies it, the first is refunded here.
--
-- KEYS[1] -> state hash, KEYS[2] -> planned window zset, KEYS[3] -> started
--   window zset
-- ARGV[1] -> job id
-- ARGV[2] -> the time the job was charged at (µs)
-- ARGV[3] -> what admit.lua charged: 1 planned meters, 2 started meters,
--   4 a new concurrency slot
-- ARGV[4] -> cost
-- ARGV[5] -> quota window start the job was counted in (0: none)
-- ARGV[6] -> number of rates, then ARGV[7..] -> the increment of each rate
-- Returns: 1

local id = ARGV[1]
local t = tonumber(ARGV[2])
local charged = tonumber(ARGV[3])
local planned = charged % 2 == 1
local started = math.floor(charged / 2) % 2 == 1
local holder = math.floor(charged / 4) % 2 == 1
local cost = tonumber(ARGV[4])
local qstart = tonumber(ARGV[5])
local nr = tonumber(ARGV[6])
local function fmt(v) return string.format('%d', v) end

local h = {}
for i = 1, nr do
  local inc = tonumber(ARGV[6 + i])
  if planned then
    local p = tonumber(redis.call('HGET', KEYS[1], 'p' .. i))
    if p then h[#h + 1] = 'p' .. i; h[#h + 1] = fmt(p - inc) end
  end
  if started then
    local a = tonumber(redis.call('HGET', KEYS[1], 'a' .. i))
    if a then h[#h + 1] = 'a' .. i; h[#h + 1] = fmt(a - inc) end
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
if #h > 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], unpack(h))
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
if redis.call('HDEL', KEYS[1], 'r:' .. id) == 1 then
  local rn = tonumber(redis.call('HGET', KEYS[1], 'rn')) or 1
  redis.call('HSET', KEYS[1], 'rn', math.max(rn - 1, 0))
end
return 1
