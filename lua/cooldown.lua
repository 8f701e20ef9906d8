-- cooldown.lua: pauses a scope: no job of it starts before the cooldown ends.
-- A longer cooldown already in place is kept.
--
-- KEYS[1] -> the scope's state hash
-- ARGV[1] -> clock: current time in µs, or -1 for Redis TIME (tests only)
-- ARGV[2] -> cooldown length in µs
-- Returns: {cooldown end (µs), now (µs)}

local now
local clock = tonumber(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local until_ = now + tonumber(ARGV[2])
local cd = tonumber(redis.call('HGET', KEYS[1], 'cd')) or 0
if cd > until_ then
  until_ = cd
else
  redis.call('HSET', KEYS[1], 'cd', string.format('%d', until_))
end
local want = math.floor((until_ - now) / 1000) + 2
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 or (ttl >= 0 and ttl < want) then
  redis.call('PEXPIRE', KEYS[1], want)
end
return { until_, now }
