-- recover.lua: gives asynq tasks that nobody runs any more back to their
-- queue's pending list (worker/recover.go, internal/asynqroom): the tasks
-- of a worker process taken for dead, and tasks asynq left active after a
-- fault (a completion it could not write). As asynq v0.26's own Requeue
-- does on a graceful shutdown: out of the active list and the lease set,
-- onto the end of the pending list that asynq dequeues next (RPUSH), state
-- pending. It writes asynq's keys (v0.26 layout, checked at start by
-- internal/asynqroom's probe).
--
-- The give-back is not counted as one of the task's retries (asynq's
-- recoverer counts one): a worker's death is not the job's failure, and a
-- job at its retry limit is run again, not archived. A job that kills its
-- worker every time would so run forever: the task hash's field
-- sluice_recovered counts the give-backs, and a task given back ARGV[1]
-- times is left where it is, to asynq's own recoverer, which counts a
-- retry each time and archives it at its limit.
--
-- KEYS[1] -> asynq:{QUEUE}:active
-- KEYS[2] -> asynq:{QUEUE}:lease
-- KEYS[3] -> asynq:{QUEUE}:pending
-- KEYS[4..] -> asynq:{QUEUE}:t:<id>, the task hash of each task
-- ARGV[1] -> the most give-backs of one task
-- ARGV[2..] -> per task, in KEYS order, two arguments: its id, and the
--   score its lease must still have ("" when any: its worker is dead), so
--   that a task whose lease a live worker extended meanwhile stays put
-- Returns: per task 1 given back; 0 not active (gone, done, pending:
--   left alone); 2 given back too often already (left to asynq's
--   recoverer); 3 its lease changed (a live worker holds it: left alone).

local call, tonumber = redis.call, tonumber
local t = call('TIME')
-- asynq's pending_since is ns since the epoch; built as text, which a Lua
-- number could not hold exactly
local since = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
local most = tonumber(ARGV[1])
local out = {}
for i = 4, #KEYS do
  local k = 2 * (i - 4) + 2
  local id, lease = ARGV[k], ARGV[k + 1]
  local v = call('HMGET', KEYS[i], 'state', 'sluice_recovered')
  local state, n = v[1], tonumber(v[2]) or 0
  local score = call('ZSCORE', KEYS[2], id)
  if state ~= 'active' then
    out[#out + 1] = 0
  elseif lease ~= '' and (not score or tonumber(score) ~= tonumber(lease)) then
    out[#out + 1] = 3
  elseif n >= most then
    out[#out + 1] = 2
  elseif call('LREM', KEYS[1], 0, id) == 0 then
    out[#out + 1] = 0
  else
    call('ZREM', KEYS[2], id)
    call('RPUSH', KEYS[3], id)
    call('HSET', KEYS[i], 'state', 'pending', 'pending_since', since, 'sluice_recovered', n + 1)
    out[#out + 1] = 1
  end
end
return out
