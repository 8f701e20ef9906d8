-- cooldown.lua: pauses a scope: no job of it starts before the cooldown ends.
-- A longer cooldown already in place is kept.
--
-- KEYS[1] -> the scope's state hash
-- ARGV[1] -> clock: current time in µs, or -1 for Redis TIME (tests only)
-- ARGV[2] -> cooldown length in µs
-- ARGV[3] -> 1: set no expiry (tests keep keys alive), 0 otherwise
-- Returns: {cooldown end (µs), now (µs)}

-- @include clock
local now = now_us()

local until_ = now + tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'cd', 'x', 'y')
local cd, x, y = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3])
if cd > until_ then
  return { cd, now }
end
local fmt = function(n) return string.format('%d', n) end
-- y, when kept (concurrency rules), is how long the hash must live once no
-- job runs: the cooldown too (release.lua shortens the hash's life to it),
-- a second past it as admit.lua keeps it
if y and until_ + 1000000 > y then
  redis.call('HSET', KEYS[1], 'y', fmt(until_ + 1000000))
end
-- x records the expiry admit.lua last gave the hash; keep it true
if until_ > x and ARGV[3] ~= '1' then
  redis.call('HSET', KEYS[1], 'cd', fmt(until_), 'x', fmt(until_))
  local want = math.floor((until_ - now) / 1000) + 2
  if redis.call('PEXPIRE', KEYS[1], want, 'GT') == 0 then
    redis.call('PEXPIRE', KEYS[1], want, 'NX')
  end
else
  redis.call('HSET', KEYS[1], 'cd', fmt(until_))
end
return { until_, now }
