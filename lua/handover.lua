-- handover.lua: hands jobs the waiting room promoted to asynq: each task,
-- parked in asynq's schedule (or deferred in its retry set), moves to the
-- queue's pending list, as asynq's own forwarder would move it when due.
-- It writes asynq's keys (v0.26 layout, pinned by internal/asynqroom's
-- TestHandoverPinsAsynqLayout), because asynq's Inspector.RunTask would
-- also bring back archived tasks, and takes one task per call.
--
-- The task of a job the room decided once (docs/architecture.md) gets its
-- decision as a header, which the worker's gate starts it on: a map entry
-- of the task message's headers (field 15 of asynq's TaskMessage) appended
-- to the encoded message, which protobuf reads as the last value of that
-- key.
--
-- KEYS[1] -> asynq:{QUEUE}:pending
-- KEYS[2..] -> asynq:{QUEUE}:t:<id>, the task hash of each job
-- ARGV[1] -> asynq:{QUEUE}: (the prefix of the schedule and retry sets)
-- ARGV[2] -> the time, in ns since the epoch (the task's pending_since)
-- ARGV[3] -> the name of the decision's header
-- ARGV[4..] -> per task, in KEYS order: its id and its decision ("": none)
-- Returns: per task 1 moved to pending; 0 no such task (deleted, or
--   completed and gone); 2 pending or active already; 3 in another state
--   (archived, completed, in a group): left alone.

local call, char, floor = redis.call, string.char, math.floor

-- @include varint

-- a headers map entry, key and value, as a field of the task message
local hname = ARGV[3]
local function header(v)
  local e = '\10' .. varint(#hname) .. hname .. '\18' .. varint(#v) .. v
  return '\122' .. varint(#e) .. e
end

local out = {}
for i = 2, #KEYS do
  local id, decided = ARGV[2 * i], ARGV[2 * i + 1]
  local v = call('HMGET', KEYS[i], 'state', 'group')
  local state, group = v[1], v[2]
  if not state then
    out[i - 1] = 0
  elseif state == 'pending' or state == 'active' then
    out[i - 1] = 2
  elseif (state == 'scheduled' or state == 'retry') and (not group or group == '') then
    call('ZREM', ARGV[1] .. state, id)
    call('LPUSH', KEYS[1], id)
    if decided ~= '' then
      local msg = call('HGET', KEYS[i], 'msg')
      call('HSET', KEYS[i], 'state', 'pending', 'pending_since', ARGV[2], 'msg', msg .. header(decided))
    else
      call('HSET', KEYS[i], 'state', 'pending', 'pending_since', ARGV[2])
    end
    out[i - 1] = 1
  else
    out[i - 1] = 3
  end
end
return out
