-- room.lua: the waiting room's due index: which tenants' lines may next be
-- promoted, and when (docs/architecture.md, "The waiting room"). Scores are
-- Redis times in µs.
--
-- KEYS[1] -> the due index (zset: tenant -> when its line is next due)
-- ARGV[1] -> clock: the current time in µs, or -1 for Redis TIME
-- ARGV[2] -> the operation, then its arguments:
--   take N HOLD: the due tenants, earliest first, at most N of them, are
--     held HOLD µs ahead so that one pump serves each.
--     Returns {now, held, tenant, tenant, ...}: held is the score they got.
--   settle HELD [TENANT DUE]...: for each tenant still held at HELD (no one
--     marked it since), its next due time DUE: now when DUE is 0, out of
--     the index when it is -1. Returns {now}.
--   mark [TENANT]...: each tenant is due now, or earlier if it was (a line
--     just began). Returns {now}.
--   markat [TENANT DUE]...: each tenant is due at DUE, or earlier if it
--     was (a release freed a slot its line's head may take at DUE).
--     Returns {now}.
--   ensure [TENANT]...: each tenant not in the index is due now (lines
--     found by a sweep). Returns {now}.
--   markall: every tenant in the index is due now (a policy changed).
--     Returns {now, count}.
--   next: Returns {now, the earliest due time (-1: none)}.

local call, tonumber, format = redis.call, tonumber, string.format
local now = tonumber(ARGV[1])
if now < 0 then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nowf = format('%d', now)
local op = ARGV[2]
-- ZADD of score/member pairs, in pieces: Lua's unpack refuses a table of
-- about 8,000 entries
local function zadd(flag, z)
  for i = 1, #z, 2000 do
    call('ZADD', KEYS[1], flag, unpack(z, i, math.min(i + 1999, #z)))
  end
end
local out = { now }
if op == 'take' then
  local due = call('ZRANGEBYSCORE', KEYS[1], '-inf', nowf, 'LIMIT', '0', ARGV[3])
  local held = format('%d', now + tonumber(ARGV[4]))
  out[2] = held
  if #due > 0 then
    local z = {}
    for i = 1, #due do
      z[#z + 1] = held
      z[#z + 1] = due[i]
      out[#out + 1] = due[i]
    end
    zadd('XX', z)
  end
elseif op == 'settle' then
  local held = tonumber(ARGV[3])
  for i = 4, #ARGV, 2 do
    local tenant, due = ARGV[i], ARGV[i + 1]
    if tonumber(call('ZSCORE', KEYS[1], tenant)) == held then
      if tonumber(due) < 0 then
        call('ZREM', KEYS[1], tenant)
      elseif tonumber(due) == 0 then
        call('ZADD', KEYS[1], nowf, tenant)
      else
        call('ZADD', KEYS[1], due, tenant)
      end
    end
  end
elseif op == 'mark' or op == 'markat' then
  local z = {}
  if op == 'mark' then
    for i = 3, #ARGV do
      z[#z + 1] = nowf
      z[#z + 1] = ARGV[i]
    end
  else
    for i = 3, #ARGV, 2 do
      z[#z + 1] = ARGV[i + 1]
      z[#z + 1] = ARGV[i]
    end
  end
  zadd('LT', z)
elseif op == 'ensure' then
  for i = 3, #ARGV do
    call('ZADD', KEYS[1], 'NX', nowf, ARGV[i])
  end
elseif op == 'markall' then
  local all = call('ZRANGEBYSCORE', KEYS[1], '(' .. nowf, '+inf')
  local z = {}
  for i = 1, #all do
    z[#z + 1] = nowf
    z[#z + 1] = all[i]
  end
  zadd('XX', z)
  out[2] = #all
elseif op == 'next' then
  local first = call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
  out[2] = tonumber(first[2]) or -1
else
  return redis.error_reply('ERR sluice: room.lua: unknown operation ' .. tostring(op))
end
return out
