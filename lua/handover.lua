-- handover.lua: hands jobs the waiting room promoted to asynq: each task,
-- parked in asynq's schedule (or deferred in its retry set), moves to the
-- queue's pending list, as asynq's own forwarder would move it when due.
-- It writes asynq's keys (v0.26 layout, pinned by internal/asynqroom's
-- TestHandoverPinsAsynqLayout), because asynq's Inspector.RunTask would
-- also bring back archived tasks, and takes one task per call.
--
-- KEYS[1] -> asynq:{QUEUE}:pending
-- KEYS[2..] -> asynq:{QUEUE}:t:<id>, the task hash of each job
-- ARGV[1] -> asynq:{QUEUE}: (the prefix of the schedule and retry sets)
-- ARGV[2] -> the time, in ns since the epoch (the task's pending_since)
-- ARGV[3..] -> the task ids, in KEYS order
-- Returns: per task 1 moved to pending; 0 no such task (deleted, or
--   completed and gone); 2 pending or active already; 3 in another state
--   (archived, completed, in a group): left alone.

local call = redis.call
local out = {}
for i = 2, #KEYS do
  local id = ARGV[i + 1]
  local v = call('HMGET', KEYS[i], 'state', 'group')
  local state, group = v[1], v[2]
  if not state then
    out[i - 1] = 0
  elseif state == 'pending' or state == 'active' then
    out[i - 1] = 2
  elseif (state == 'scheduled' or state == 'retry') and (not group or group == '') then
    call('ZREM', ARGV[1] .. state, id)
    call('LPUSH', KEYS[1], id)
    call('HSET', KEYS[i], 'state', 'pending', 'pending_since', ARGV[2])
    out[i - 1] = 1
  else
    out[i - 1] = 3
  end
end
return out
