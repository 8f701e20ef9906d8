-- forward.lua: moves one queue's due tasks from asynq's schedule and retry
-- set to its pending list (or, for a task of a group, to the group's set),
-- as asynq's own forwarder does. It writes asynq's keys (v0.26 layout,
-- pinned by internal/asynqroom's layout probe and TestForwardPinsAsynqLayout).
-- One process of a fleet, the holder of the fleet's lock, runs it often, so
-- that deferred jobs come back before their slots while every worker's own
-- asynq forwarder polls at asynq's default.
--
-- KEYS[1] -> asynq:{QUEUE}:scheduled
-- KEYS[2] -> asynq:{QUEUE}:retry
-- KEYS[3] -> asynq:{QUEUE}:pending
-- ARGV[1] -> the time, in s since the epoch (asynq scores its sets in s)
-- ARGV[2] -> asynq:{QUEUE}:t: (the prefix of the task hashes)
-- ARGV[3] -> the time, in ns since the epoch (the task's pending_since)
-- ARGV[4] -> asynq:{QUEUE}:g: (the prefix of the group sets)
-- ARGV[5] -> the most tasks to move
-- Returns: how many tasks moved

local call = redis.call
local limit = tonumber(ARGV[5])
local moved = 0
for k = 1, 2 do
  local ids = call('ZRANGEBYSCORE', KEYS[k], '-inf', ARGV[1], 'LIMIT', 0, limit - moved)
  for _, id in ipairs(ids) do
    local task = ARGV[2] .. id
    local group = call('HGET', task, 'group')
    call('ZREM', KEYS[k], id)
    if group and group ~= '' then
      call('ZADD', ARGV[4] .. group, ARGV[1], id)
      call('HSET', task, 'state', 'aggregating')
    else
      call('LPUSH', KEYS[3], id)
      call('HSET', task, 'state', 'pending', 'pending_since', ARGV[3])
    end
  end
  moved = moved + #ids
  if moved >= limit then break end
end
return moved
