-- line.lua: jobs join their tenant's line in the waiting room, after their
-- asynq tasks exist (parked in asynq's schedule), first in, first out.
--
-- KEYS[1] -> the tenant's line of the jobs' queue: its list of the jobs'
--   priority level (every job of a call has the same)
-- KEYS[2] -> the set of the queues the tenant has a line in
-- KEYS[3] -> the tenant's intents of that priority level (zset:
--   "COST<US>QUEUE<US>ID" -> when the job arrived to wait, µs): jobs
--   parked, or about to be, that no line holds yet
-- KEYS[4], KEYS[5] -> the line's lists of the other two priority levels:
--   the cap and was_empty count the whole line
-- KEYS[6] -> the tenant's state hash: its field kw:QUEUE says that the
--   last turn of the line left every job in it waiting for its key
-- ARGV[1] -> clock: the current time in µs, or -1 for Redis TIME
-- ARGV[2] -> cap: the most jobs the line may hold (0: no cap)
-- ARGV[3] -> the queue
-- ARGV[4] -> which jobs join: 0 every job; 1 jobs that arrived to wait
--   (admit.lua's arrive op recorded their intents): a job whose intent is
--   gone joined already (the sweep, or a retry, took it) and counts as
--   joined; 2 only jobs whose intent is there (a retry, or the sweep,
--   joining a job whose producer died between parking and joining)
-- ARGV[5..] -> the jobs, each "COST<US>QUEUE<US>ID" (<US> is the byte 31;
--   COST empty for 1, QUEUE empty for asynq's default queue); a caller
--   sends a long batch in several calls (throttle.Room.Join: 1,000 jobs)
-- Returns: {joined, waiting, was_empty}: the jobs join in order until the
--   cap is reached, so the first `joined` of them are in the line (in mode
--   2, `joined` of them joined); a job that joins leaves the intents;
--   waiting is the line's length afterwards (every level); was_empty is 1 when the line
--   was empty before and a job joined, or when a job joined a line whose
--   jobs all waited for their keys (kw:QUEUE, which it clears): the tenant
--   must be made due in the room's index (the newcomer may start now,
--   while the tenant is due only when a key allows one of the others).
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
local mode = ARGV[4]
local sep = string.char(31)
-- the jobs of the other priority levels, always counted: they are part of
-- the line (they make it non-empty, and count towards its cap)
local others = 0
for i = 4, 5 do others = others + redis.call('LLEN', KEYS[i]) end
-- the level's length is read only to hold a cap: otherwise RPUSH tells it
local waiting = cap > 0 and redis.call('LLEN', KEYS[1]) + others or false
local before = waiting
local pushed, taken = 0, 0
local add, gone = {}, {}
-- RPUSH and ZREM in pieces: Lua's unpack refuses a table of about 8,000
-- entries
local function flush()
  if #add > 0 then
    waiting = redis.call('RPUSH', KEYS[1], unpack(add)) + others
    pushed = pushed + #add
  end
  if #gone > 0 then redis.call('ZREM', KEYS[3], unpack(gone)) end
  add, gone = {}, {}
end
for i = 5, #ARGV do
  if cap > 0 and waiting + #add >= cap then break end
  local join = true
  if mode == '0' then
    gone[#gone + 1] = ARGV[i]
  else
    join = redis.call('ZREM', KEYS[3], ARGV[i]) == 1
    if not join and mode == '1' then taken = taken + 1 end
  end
  if join then
    add[#add + 1] = ms .. sep .. ARGV[i]
    if #add == 500 then flush() end
  end
end
flush()
if not waiting then waiting = redis.call('LLEN', KEYS[1]) + others end
if not before then before = waiting - pushed end
local was_empty = 0
if before == 0 and pushed > 0 then
  redis.call('SADD', KEYS[2], ARGV[3])
  was_empty = 1
elseif pushed > 0 and redis.call('HDEL', KEYS[6], 'kw:' .. ARGV[3]) == 1 then
  was_empty = 1
end
return { pushed + taken, waiting, was_empty }
