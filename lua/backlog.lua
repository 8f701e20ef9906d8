-- backlog.lua: counts a tenant's queued and deferred jobs against its cap
-- (backlog=K). A job is counted from enqueue until it finishes for good.
--
-- KEYS[1] -> the tenant's backlog zset (member = job id, score = time added, ms)
-- ARGV[1] -> cap: the most jobs the backlog may hold (0: count without a cap)
-- ARGV[2..] -> job ids, in order
-- Returns: {accepted, count}: the ids are taken in order until the cap is
--   reached, so the first `accepted` of them are counted now (an id already
--   counted is accepted again without counting twice); count is the size of
--   the backlog afterwards.

local cap = tonumber(ARGV[1])
local t = redis.call('TIME')
local ms = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local count = redis.call('ZCARD', KEYS[1])
local accepted = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if not redis.call('ZSCORE', KEYS[1], id) then
    if cap > 0 and count >= cap then break end
    redis.call('ZADD', KEYS[1], ms, id)
    count = count + 1
  end
  accepted = accepted + 1
end
return { accepted, count }
