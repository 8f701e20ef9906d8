-- handover.lua: hands jobs the waiting room promoted to asynq: each task,
-- parked in asynq's schedule (or deferred in its retry set), moves to the
-- queue's pending list, as asynq's own forwarder would move it when due.
-- It writes asynq's keys (v0.26 layout, pinned by internal/asynqroom's
-- TestHandoverPinsAsynqLayout), because asynq's Inspector.RunTask would
-- also bring back archived tasks, and takes one task per call.
--
-- The task of a job the room decided once (docs/architecture.md) gets its
-- decision as a header, which the worker's gate starts it on (move_task,
-- which admit.lua's turns share where they hand their jobs over
-- themselves).
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

-- @begin move_task
-- The state of the task whose hash is key, for a hand-over: 0 no such
-- task, 1 to move (parked in asynq's schedule or deferred in its retry
-- set: the set's name is returned too), 2 pending or active already, 3 in
-- another state (archived, completed, in a group).
local function task_state(key)
  local v = call('HMGET', key, 'state', 'group')
  local state, group = v[1], v[2]
  if not state then return 0 end
  if state == 'pending' or state == 'active' then return 2 end
  if (state == 'scheduled' or state == 'retry') and (not group or group == '') then return 1, state end
  return 3
end
-- Move task id (its hash key) from the set it waits in (prefix .. set) to
-- the pending list, pending since since (ns), as asynq's forwarder moves
-- it; a decision (not "") goes with it as a header named hname: a map
-- entry of the task message's headers (field 15 of asynq's TaskMessage)
-- appended to the encoded message, which protobuf reads as the last value
-- of that key.
local function move_task(key, prefix, set, pending, id, since, hname, decided)
  call('ZREM', prefix .. set, id)
  call('LPUSH', pending, id)
  if decided ~= '' then
    local e = '\10' .. varint(#hname) .. hname .. '\18' .. varint(#decided) .. decided
    call('HSET', key, 'state', 'pending', 'pending_since', since,
      'msg', call('HGET', key, 'msg') .. '\122' .. varint(#e) .. e)
  else
    call('HSET', key, 'state', 'pending', 'pending_since', since)
  end
end
-- @end move_task

local out = {}
local n = tonumber(ARGV[4])
local h = n + 2
for i = 1, n do
  local a = 3 * i + 2
  local key, id, decided, entry = KEYS[i + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local r, set = task_state(key)
  if r == 1 then move_task(key, ARGV[1], set, KEYS[1], id, ARGV[2], ARGV[3], decided) end
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
