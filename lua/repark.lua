-- repark.lua: keeps the waiting room's parked tasks from reaching their
-- fallback while sluice runs (docs/architecture.md, "The waiting room").
-- A job waiting in its tenant's line is parked in asynq's schedule at its
-- fallback time; the pumps' sweep pushes the fallback of parked tasks that
-- are about to come due further out, for tasks whose tenants have lines,
-- so that a line longer than the fallback does not come out of the
-- schedule all at once. The fallback stays the safety net of a fleet where
-- no sluice process runs. Run by internal/asynqroom, the only package that
-- knows asynq's keys (v0.26's layout; scores are unix seconds).
--
-- KEYS[1] -> asynq:{QUEUE}:scheduled
-- KEYS[2..] -> asynq:{QUEUE}:t:<id>, the task hash of each candidate
-- ARGV[1] -> the operation: read or push
-- ARGV[2] -> within: seconds from now (Redis time) a task must come due
--   within to be read or pushed
-- ARGV[3] -> read: the tenant header's name; push: seconds from now to
--   push the tasks' fallback to
-- ARGV[4] -> read: the parked header's name (queue.Client parks its waiting
--   jobs with it; a job a producer scheduled itself has none)
-- ARGV[5..] -> per task, in KEYS order: its id
-- Returns: read: per task its tenant when it is scheduled, parked by the
--   room and due within ARGV[2], else "". push: how many tasks were
--   pushed (those still scheduled and due within ARGV[2]).

local call, char, floor, tonumber = redis.call, string.char, math.floor, tonumber
local t = call('TIME')
local now = tonumber(t[1])
local within = now + tonumber(ARGV[2])
local op = ARGV[1]
local first = op == 'push' and 4 or 5

-- @include varint

-- the start of a headers map entry's value for the header name: key
-- (field 1), then the value's tag (field 2)
local function entry(name)
  return '\10' .. varint(#name) .. name .. '\18'
end

-- a protobuf varint at position i of s: its value and the position after
local function readvarint(s, i)
  local n, mul = 0, 1
  while i <= #s do
    local b = s:byte(i)
    n = n + (b % 128) * mul
    i = i + 1
    if b < 128 then return n, i end
    mul = mul * 128
  end
  return nil, i
end

-- is the task in KEYS[k] scheduled and due within the bound?
local function due(k, id)
  if call('HGET', KEYS[k], 'state') ~= 'scheduled' then return false end
  local score = tonumber(call('ZSCORE', KEYS[1], id))
  return score ~= nil and score <= within
end

if op == 'read' then
  local tenantKey, parkedKey = entry(ARGV[3]), entry(ARGV[4])
  local out = {}
  for k = 2, #KEYS do
    local tenant = ''
    if due(k, ARGV[first + k - 2]) then
      local msg = call('HGET', KEYS[k], 'msg') or ''
      local at = msg:find(tenantKey, 1, true)
      if at and msg:find(parkedKey, 1, true) then
        local n, i = readvarint(msg, at + #tenantKey)
        if n then tenant = msg:sub(i, i + n - 1) end
      end
    end
    out[k - 1] = tenant
  end
  return out
elseif op == 'push' then
  local to = string.format('%d', now + tonumber(ARGV[3]))
  local pushed = 0
  for k = 2, #KEYS do
    local id = ARGV[first + k - 2]
    if due(k, id) then
      call('ZADD', KEYS[1], 'XX', to, id)
      pushed = pushed + 1
    end
  end
  return pushed
end
return redis.error_reply('ERR sluice: repark.lua: unknown operation ' .. tostring(op))
