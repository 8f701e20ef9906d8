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
-- A job's entry in the waiting room's handing set (the tenant's, where
-- the room keeps it until asynq has the job) may leave it in the same run,
-- where the room's keys and asynq's share a server: the room need not
-- confirm it with a round trip of its own.
--
-- KEYS[1] -> asynq:{QUEUE}:pending
-- KEYS[2..n+1] -> asynq:{QUEUE}:t:<id>, the task hash of each job
-- KEYS[n+2..] -> the handing set of each job that gives its entry, in
--   order
-- ARGV[1] -> asynq:{QUEUE}: (the prefix of the schedule and retry sets)
-- ARGV[2] -> the time, in ns since the epoch (the task's pending_since)
-- ARGV[3] -> the name of the decision's header
-- ARGV[4] -> n, the number of tasks
-- ARGV[5..] -> per task, in KEYS order: its id, its decision ("": none)
--   and its handing entry ("": none, the room confirms it)
-- Returns: per task 1 moved to pending; 0 no such task (deleted, or
--   completed and gone); 2 pending or active already; 3 in another state
--   (archived, completed, in a group): left alone; 11 and 12 are 1 and 2
--   with the entry gone from its handing set.

local call, char, floor = redis.call, string.char, math.floor

-- @include varint

-- a headers map entry, key and value, as a field of the task message
local hname = ARGV[3]
local function header(v)
  local e = '\10' .. varint(#hname) .. hname .. '\18' .. varint(#v) .. v
  return '\122' .. varint(#e) .. e
end

local out = {}
local n = tonumber(ARGV[4])
local h = n + 2
for i = 1, n do
  local a = 3 * i + 2
  local key, id, decided, entry = KEYS[i + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local v = call('HMGET', key, 'state', 'group')
  local state, group = v[1], v[2]
  local r
  if not state then
    r = 0
  elseif state == 'pending' or state == 'active' then
    r = 2
  elseif (state == 'scheduled' or state == 'retry') and (not group or group == '') then
    call('ZREM', ARGV[1] .. state, id)
    call('LPUSH', KEYS[1], id)
    if decided ~= '' then
      local msg = call('HGET', key, 'msg')
      call('HSET', key, 'state', 'pending', 'pending_since', ARGV[2], 'msg', msg .. header(decided))
    else
      call('HSET', key, 'state', 'pending', 'pending_since', ARGV[2])
    end
    r = 1
  else
    r = 3
  end
  if entry ~= '' then
    if r == 1 or r == 2 then
      call('ZREM', KEYS[h], entry)
      r = r + 10
    end
    h = h + 1
  end
  out[i] = r
end
return out
