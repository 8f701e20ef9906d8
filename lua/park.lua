-- park.lua: a new job that is to wait in its tenant's line whatever its
-- rules say (the fleet has no room for it now) is parked in asynq's
-- schedule and put in its line in one run: what wait.lua, asynq's own
-- schedule script and line.lua do in three calls, with no moment at which
-- the task is parked in no line (so no intent is recorded). A job that
-- arrived and was told to wait by its rules is parked and joins its line
-- with it too, its intent taken back. Only where
-- asynq's keys and the tenant's are on one server (not on a Cluster: a
-- tenant's keys and a queue's are in different slots there). The task is
-- written as asynq v0.26's client writes a scheduled task (its message
-- encoded by internal/asynqroom, which pins the layout).
--
-- Concurrent parks share one run (on one server): each op is a job,
-- parked in order, and a later op sees what an earlier one wrote (a
-- second job of the same id is a conflict, a line grows by each).
--
-- KEYS: per op, 9 keys:
--   [1] the tenant's line of the job's queue: its list of the job's
--     priority level
--   [2], [3] the line's lists of the other two levels
--   [4] the set of the queues the tenant has a line in
--   [5] the tenant's state hash (its field kw:QUEUE, as line.lua)
--   [6] asynq:{QUEUE}:t:<id>, the task's hash
--   [7] asynq:{QUEUE}:scheduled
--   [8] asynq:queues
--   [9] the tenant's intents of the job's priority level: a job in its
--     line has none (one that arrived had its intent recorded by
--     admit.lua's arrive op; an earlier arrival of the job may have left
--     one)
-- ARGV[1] -> clock: the current time in µs, or -1 for Redis TIME
-- ARGV[2] -> the number of ops
-- per op, 10 arguments:
--   [1] the line's cap (0: none)
--   [2] the queue, as the line's keys name it
--   [3] the job's line entry without its time ("COST<US>QUEUE<US>ID")
--   [4] the task id
--   [5] the task message
--   [6] the least time the task stays parked (µs)
--   [7] the time the line needs per waiting job (µs, 0: none): the task
--     stays parked at least that times the jobs waiting with it
--   [8] the longest time a task is parked (µs)
--   [9] the queue's name, as asynq:queues lists it
--   [10] 1 to register the queue in asynq:queues (the caller's first park
--     into it; asynq's client registers a queue once per process too), 0
--     not to
-- Returns, per op: {verdict, waiting, was_empty, at}: verdict 0 the job
--   is parked and in its line, -1 the line is at its cap, -2 a task of
--   that id exists (asynq's "conflict": nothing is written either way);
--   waiting how many jobs wait in the line (with it); was_empty as
--   line.lua's (the tenant must be made due in the room's index); at when
--   the task comes out of asynq's schedule (µs) should no pump promote it
--   first.

local call, tonumber, format, floor = redis.call, tonumber, string.format, math.floor
-- @include clock

local now = false

-- one op: its keys after KEYS[k], its arguments from ARGV[a]
local function park_one(k, a)
  if call('EXISTS', KEYS[k + 6]) == 1 then
    return { -2, 0, 0, 0 }
  end
  local waiting = 0
  for i = 1, 3 do waiting = waiting + call('LLEN', KEYS[k + i]) end
  local cap = tonumber(ARGV[a])
  if cap > 0 and waiting >= cap then
    return { -1, waiting, 0, 0 }
  end
  now = now or now_us()
  local park = math.min(math.max(tonumber(ARGV[a + 5]), (waiting + 1) * tonumber(ARGV[a + 6])), tonumber(ARGV[a + 7]))
  local at = now + park
  if ARGV[a + 9] == '1' then call('SADD', KEYS[k + 8], ARGV[a + 8]) end
  call('HSET', KEYS[k + 6], 'msg', ARGV[a + 4], 'state', 'scheduled')
  call('ZADD', KEYS[k + 7], format('%d', floor(at / 1000000)), ARGV[a + 3])
  call('RPUSH', KEYS[k + 1], format('%d', floor(now / 1000)) .. string.char(31) .. ARGV[a + 2])
  call('ZREM', KEYS[k + 9], ARGV[a + 2])
  local was_empty = 0
  if waiting == 0 then
    call('SADD', KEYS[k + 4], ARGV[a + 1])
    was_empty = 1
  elseif call('HDEL', KEYS[k + 5], 'kw:' .. ARGV[a + 1]) == 1 then
    was_empty = 1
  end
  return { 0, waiting + 1, was_empty, at }
end

local out = {}
for op = 1, tonumber(ARGV[2]) do
  out[op] = park_one(9 * (op - 1), 3 + 10 * (op - 1))
end
return out
