-- wait.lua: a new job that is to wait in its tenant's line whatever its
-- rules say (the fleet has no room for it now: admit.lua's arrive op would
-- not decide on it either), at a fraction of admit.lua's cost: the line's
-- cap is checked and the job's intent recorded, as the arrive op does for
-- a job that waits. The job is parked next, then joins its line
-- (line.lua takes the intent back).
--
-- KEYS[1..3] -> the tenant's line of the job's queue: its lists of high,
--   normal and low priority
-- KEYS[4] -> the tenant's intents of the job's priority level (zset: line
--   entries without their time -> when they arrived to wait, µs)
-- ARGV[1] -> clock: the current time in µs, or -1 for Redis TIME
-- ARGV[2] -> the line's cap (0: none)
-- ARGV[3] -> the job's line entry without its time
-- Returns: {verdict, waiting, earlier}: verdict 0 the job waits (its intent
--   recorded), -1 the line is at its cap (nothing written); waiting is how
--   many jobs wait in the line; earlier 1 when an earlier arrival of the
--   job left its intent (kept)

-- @include clock

local waiting = 0
for i = 1, 3 do waiting = waiting + redis.call('LLEN', KEYS[i]) end
local cap = tonumber(ARGV[2])
if cap > 0 and waiting >= cap then
  return { -1, waiting, 0 }
end
local earlier = 0
if redis.call('ZADD', KEYS[4], 'NX', string.format('%d', now_us()), ARGV[3]) == 0 then earlier = 1 end
return { 0, waiting, earlier }
