-- capacity.lua: the fleet's capacity: how many jobs of each queue the
-- sluice workers that serve it run at once. Each worker registers what it
-- runs and renews the registration while it lives; the capacity of a queue
-- is one counter, so that producers and pumps read it with one command, not
-- the fleet's every server (asynq's server registry holds each server's
-- running tasks).
--
-- KEYS[1] -> the registrations (zset: WORKER<US>QUEUE<US>CONCURRENCY ->
--   when it lapses, ms; <US> is the byte 31)
-- KEYS[2] -> the capacity (hash: queue -> the registered workers'
--   concurrency, summed)
-- ARGV[1] -> the operation, then its arguments:
--   join LAPSE MEMBER...: register (or renew) each member for LAPSE ms.
--     Returns {}.
--   leave MEMBER...: remove each member. Returns {}.
--   read QUEUE: drop lapsed registrations (workers that died), then
--     Returns {the queue's capacity}.
-- Registrations lapse by the Redis clock.

local call, tonumber = redis.call, tonumber
local SEP = string.char(31)

local function parts(m)
  local a = m:find(SEP, 1, true)
  local b = m:find(SEP, a + 1, true)
  return m:sub(a + 1, b - 1), tonumber(m:sub(b + 1))
end

local function count(m, sign)
  local q, n = parts(m)
  if call('HINCRBY', KEYS[2], q, sign * n) <= 0 then call('HDEL', KEYS[2], q) end
end

local function now_ms()
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local op = ARGV[1]
if op == 'join' then
  local lapse = string.format('%d', now_ms() + tonumber(ARGV[2]))
  for i = 3, #ARGV do
    if call('ZADD', KEYS[1], lapse, ARGV[i]) == 1 then count(ARGV[i], 1) end
  end
  return {}
elseif op == 'leave' then
  for i = 2, #ARGV do
    if call('ZREM', KEYS[1], ARGV[i]) == 1 then count(ARGV[i], -1) end
  end
  return {}
elseif op == 'read' then
  local ms = string.format('%d', now_ms())
  local lapsed = call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ms, 'LIMIT', '0', '100')
  for i = 1, #lapsed do
    call('ZREM', KEYS[1], lapsed[i])
    count(lapsed[i], -1)
  end
  return { tonumber(call('HGET', KEYS[2], ARGV[2])) or 0 }
end
return redis.error_reply('ERR sluice: capacity.lua: unknown operation ' .. tostring(op))
