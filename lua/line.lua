-- line.lua: jobs join their tenant's line in the waiting room, after their
-- asynq tasks exist (parked in asynq's schedule), first in, first out.
--
-- KEYS[1] -> the tenant's line of the jobs' queue (list)
-- KEYS[2] -> the set of the queues the tenant has a line in
-- ARGV[1] -> clock: the current time in µs, or -1 for Redis TIME
-- ARGV[2] -> cap: the most jobs the line may hold (0: no cap)
-- ARGV[3] -> the queue
-- ARGV[4..] -> the jobs, each "COST<US>QUEUE<US>ID" (<US> is the byte 31;
--   COST empty for 1, QUEUE empty for asynq's default queue); a caller
--   sends a long batch in several calls (throttle.Room.Join: 1,000 jobs)
-- Returns: {joined, waiting, was_empty}: the jobs join in order until the
--   cap is reached, so the first `joined` of them are in the line; waiting
--   is its length afterwards; was_empty is 1 when the line was empty before
--   (the tenant must be made due in the room's index).
--   Each entry is stored as "LINED_MS<US>" followed by the job, LINED_MS the
--   Redis time it joined (ms).

local cap = tonumber(ARGV[2])
local ms
local clock = tonumber(ARGV[1])
if clock >= 0 then
  ms = string.format('%d', math.floor(clock / 1000))
else
  local t = redis.call('TIME')
  ms = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local sep = string.char(31)
local waiting = redis.call('LLEN', KEYS[1])
local before = waiting
local joined = 0
local add = {}
-- RPUSH in pieces: Lua's unpack refuses a table of about 8,000 entries
for i = 4, #ARGV do
  if cap > 0 and waiting >= cap then break end
  add[#add + 1] = ms .. sep .. ARGV[i]
  waiting = waiting + 1
  if #add == 500 then
    redis.call('RPUSH', KEYS[1], unpack(add))
    joined, add = joined + #add, {}
  end
end
if #add > 0 then
  redis.call('RPUSH', KEYS[1], unpack(add))
  joined = joined + #add
end
local was_empty = 0
if before == 0 and joined > 0 then
  redis.call('SADD', KEYS[2], ARGV[3])
  was_empty = 1
end
return { joined, waiting, was_empty }
