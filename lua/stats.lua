-- stats.lua: a consistent snapshot of one scope's state, for sluice stats.
--
-- KEYS[1] -> state hash, KEYS[2] -> planned window zset, KEYS[3] -> started
--   window zset, KEYS[4] -> reservations zset, KEYS[5] -> holders zset,
--   KEYS[6] -> backlog zset
-- ARGV[1] -> clock: current time in µs, or -1 for Redis TIME (tests only)
-- ARGV[2] -> window length in µs (0: no window rule)
-- ARGV[3] -> reservation grace in µs
-- Returns: {now, state hash as a flat field/value list, planned entries in
--   the window, started entries in the window, live reservations, first
--   reservation slot (0: none), last reservation slot (0: none), live holders,
--   backlog, holder ids (up to 100) as a flat id/lease-end list}

local now
local clock = tonumber(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(v) return string.format('%d', v) end

local wdur = tonumber(ARGV[2])
local grace = tonumber(ARGV[3])
local planned, started = 0, 0
if wdur > 0 then
  planned = redis.call('ZCOUNT', KEYS[2], '(' .. fmt(now - wdur), '+inf')
  started = redis.call('ZCOUNT', KEYS[3], '(' .. fmt(now - wdur), '+inf')
end
local live_from = '(' .. fmt(now - grace)
local reservations = redis.call('ZCOUNT', KEYS[4], live_from, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[4], live_from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local last = redis.call('ZREVRANGEBYSCORE', KEYS[4], '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
local holders = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. fmt(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 100)
return {
  now,
  redis.call('HGETALL', KEYS[1]),
  planned,
  started,
  reservations,
  tonumber(first[2]) or 0,
  tonumber(last[2]) or 0,
  redis.call('ZCOUNT', KEYS[5], '(' .. fmt(now), '+inf'),
  redis.call('ZCARD', KEYS[6]),
  holders,
}
