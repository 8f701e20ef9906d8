-- room.lua: a shard of the waiting room's due index: which tenants' lines
-- may next be promoted, and when (docs/architecture.md, "The waiting
-- room"). Scores are Redis times in µs. A queue's index is split in
-- shards by tenant (throttle/keys.go); every op runs on one shard, and
-- the caller combines shards where it must (the pump's take, turn).
--
-- The pumps sleep until the earliest due time (at most a second) and wake
-- on the index's wake channel: an op that makes a tenant due sooner than
-- it was publishes there QUEUE␟SHARD (ARGV[4]), ␟ and the earliest due
-- time it set, so that an idle fleet polls little.
--
-- KEYS[1] -> the shard (zset: tenant -> when its line is next due)
-- ARGV[1] -> clock: the current time in µs, or -1 for Redis TIME
-- ARGV[2] -> the operation
-- ARGV[3] -> the wake channel ("": publish nothing)
-- ARGV[4] -> QUEUE␟SHARD: the queue's name and the shard's number
-- ARGV[5..] -> the operation's arguments:
--   take N HOLD: the due tenants, earliest first, at most N of them, are
--     held HOLD µs ahead so that one pump serves each.
--     Returns {now, held, head, tenant, due, tenant, due, ...}: held is
--     the score they got, due the one each had (settle may give it back:
--     the tenant keeps its place); head the shard's earliest due time
--     once they are held (-1: empty).
--   settle HELD [TENANT DUE]...: for each tenant still held at HELD (no one
--     marked it since), its next due time DUE: now when DUE is 0 (the
--     k-th such tenant now + k µs, so that they keep their order), out of
--     the index when it is -1. Returns {now, head}.
--   turn TENANT: is it TENANT's turn to take a freed slot, in this shard?
--     Returns {now, first, others, due, head}: first 1 when no other
--     tenant is due earlier than TENANT (a tenant held by a pump is not
--     due), others 1 when another tenant is due now, due TENANT's due time
--     when it is due now (-1: not), head the shard's earliest due time (the
--     caller compares the other shards' with due).
--   requeue TENANT: TENANT, due now or earlier (not held), is due now:
--     behind the tenants due before (its turn ended). Returns {now}.
--   mark [TENANT]...: each tenant is due now, or earlier if it was (a line
--     just began). Returns {now}.
--   nudge HOLD [TENANT]...: each tenant not held by a pump nor due within
--     HOLD µs (its due time further ahead, or none) is due now: a release
--     gave back a slot its line did not wait for, and a due time a full
--     scope left (a lease's end) no longer holds; a tenant a pump holds
--     keeps its turn (a mark would let a second pump take it meanwhile).
--     Returns {now}.
--   markat [TENANT DUE]...: each tenant is due at DUE, or earlier if it
--     was (a release freed a slot its line's head may take at DUE).
--     Returns {now}.
--   ensure [TENANT]...: each tenant not in the index is due now (lines
--     found by a sweep). Returns {now}.
--   markall: every tenant in the index is due now (a policy changed).
--     Returns {now, count}.
--   next: Returns {now, the earliest due time (-1: none)}.
--   takeall N HOLD: with several shards in KEYS (one server only), take
--     on all of them at once: the N tenants due earliest across them are
--     held HOLD µs ahead. Returns {now, held, {each shard's earliest due
--     time once they are held}, shard, tenant, due, shard, tenant, due,
--     ...}, shard the tenant's position in KEYS, earliest due first.
--   settleall HELD... [K TENANT DUE]...: with several shards in KEYS
--     (one server only), settle on each: each shard's HELD, in KEYS order,
--     then the tenants, each with its shard's position K in KEYS, in the
--     order given across the shards (those due now keep it: the k-th of
--     them now + k µs). Returns {now, {each shard's earliest due time
--     once settled}}.
--   heads: with every shard of the queue in KEYS (one server only: the
--     shards' tags are in different Cluster slots), Returns {now, the
--     earliest due time of each shard (-1: empty)...}.

local call, tonumber, format = redis.call, tonumber, string.format
local now = tonumber(ARGV[1])
if now < 0 then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nowf = format('%d', now)
local op, channel = ARGV[2], ARGV[3]
local A = 5
local out = { now }

-- ZADD of score/member pairs, in pieces: Lua's unpack refuses a table of
-- about 8,000 entries; returns how many changed (with CH)
local function zadd_to(key, z, ...)
  local changed = 0
  for i = 1, #z, 2000 do
    local args = { ... }
    for j = i, math.min(i + 1999, #z) do args[#args + 1] = z[j] end
    changed = changed + call('ZADD', key, unpack(args))
  end
  return changed
end
local function zadd(z, ...) return zadd_to(KEYS[1], z, ...) end

-- the pumps of the queue wake when a tenant became due sooner, at due
local function wake(changed, due)
  if changed > 0 and channel ~= '' then call('PUBLISH', channel, ARGV[4] .. '\31' .. due) end
end

local function first(key)
  local f = call('ZRANGE', key or KEYS[1], '0', '0', 'WITHSCORES')
  return tonumber(f[2]) or -1
end

if op == 'take' then
  local due = call('ZRANGEBYSCORE', KEYS[1], '-inf', nowf, 'WITHSCORES', 'LIMIT', '0', ARGV[A])
  local held = format('%d', now + tonumber(ARGV[A + 1]))
  out[2] = held
  out[3] = -1
  if #due > 0 then
    local z = {}
    for i = 1, #due, 2 do
      z[#z + 1] = held
      z[#z + 1] = due[i]
      out[#out + 1] = due[i]
      out[#out + 1] = due[i + 1]
    end
    zadd(z, 'XX')
  end
  out[3] = first()
elseif op == 'takeall' then
  -- take on every shard in KEYS at once (one server only): the N due
  -- tenants due earliest across them (ties by the shards' order in KEYS),
  -- each held in its shard. Each shard's due tenants come in its order;
  -- the N are merged from their heads.
  local n = tonumber(ARGV[A])
  local held = format('%d', now + tonumber(ARGV[A + 1]))
  local lists, at = {}, {}
  for k = 1, #KEYS do
    lists[k] = call('ZRANGEBYSCORE', KEYS[k], '-inf', nowf, 'WITHSCORES', 'LIMIT', '0', ARGV[A])
    at[k] = 1
  end
  out[2] = held
  local took = {}
  for _ = 1, n do
    local best, bs = false, false
    for k = 1, #KEYS do
      local d = lists[k][at[k] + 1]
      if d then
        d = tonumber(d)
        if not best or d < bs then best, bs = k, d end
      end
    end
    if not best then break end
    local l, i = lists[best], at[best]
    at[best] = i + 2
    local z = took[best] or {}
    took[best] = z
    z[#z + 1] = held
    z[#z + 1] = l[i]
    out[#out + 1] = best
    out[#out + 1] = l[i]
    out[#out + 1] = l[i + 1]
  end
  for k = 1, #KEYS do
    if took[k] then zadd_to(KEYS[k], took[k], 'XX') end
  end
  -- then each shard's earliest due time once they are held: a due tenant
  -- it keeps is its earliest
  local heads = {}
  for k = 1, #KEYS do
    local d = lists[k][at[k] + 1]
    heads[k] = d and tonumber(d) or first(KEYS[k])
  end
  table.insert(out, 3, heads)
elseif op == 'settle' or op == 'settleall' then
  -- each tenant still held at held gets its due time (settle's)
  local k = 0
  local function settle(key, held, tenant, due)
    if tonumber(call('ZSCORE', key, tenant)) == held then
      if tonumber(due) < 0 then
        call('ZREM', key, tenant)
      elseif tonumber(due) == 0 then
        call('ZADD', key, format('%d', now + k), tenant)
        k = k + 1
      else
        call('ZADD', key, due, tenant)
      end
    end
  end
  if op == 'settle' then
    local held = tonumber(ARGV[A])
    for i = A + 1, #ARGV, 2 do settle(KEYS[1], held, ARGV[i], ARGV[i + 1]) end
    out[2] = first()
  else
    local held = {}
    for s = 1, #KEYS do held[s] = tonumber(ARGV[A + s - 1]) end
    for i = A + #KEYS, #ARGV, 3 do
      local s = tonumber(ARGV[i])
      settle(KEYS[s], held[s], ARGV[i + 1], ARGV[i + 2])
    end
    local heads = {}
    for s = 1, #KEYS do heads[s] = first(KEYS[s]) end
    out[2] = heads
  end
elseif op == 'mark' or op == 'markat' then
  local z = {}
  local soonest = nowf
  if op == 'mark' then
    for i = A, #ARGV do
      z[#z + 1] = nowf
      z[#z + 1] = ARGV[i]
    end
  else
    soonest = ARGV[A + 1] or nowf
    for i = A, #ARGV, 2 do
      z[#z + 1] = ARGV[i + 1]
      z[#z + 1] = ARGV[i]
      if tonumber(ARGV[i + 1]) < tonumber(soonest) then soonest = ARGV[i + 1] end
    end
  end
  wake(zadd(z, 'LT', 'CH'), soonest)
elseif op == 'nudge' then
  local horizon = now + tonumber(ARGV[A])
  local changed = 0
  for i = A + 1, #ARGV do
    local score = tonumber(call('ZSCORE', KEYS[1], ARGV[i]))
    if not score or score > horizon then
      call('ZADD', KEYS[1], nowf, ARGV[i])
      changed = changed + 1
    end
  end
  wake(changed, nowf)
elseif op == 'ensure' then
  local changed = 0
  for i = A, #ARGV do
    changed = changed + call('ZADD', KEYS[1], 'NX', nowf, ARGV[i])
  end
  wake(changed, nowf)
elseif op == 'markall' then
  local all = call('ZRANGEBYSCORE', KEYS[1], '(' .. nowf, '+inf')
  local z = {}
  for i = 1, #all do
    z[#z + 1] = nowf
    z[#z + 1] = all[i]
  end
  zadd(z, 'XX')
  out[2] = #all
  wake(#all, nowf)
elseif op == 'turn' then
  local tenant = ARGV[A]
  local due = call('ZRANGEBYSCORE', KEYS[1], '-inf', nowf, 'LIMIT', '0', '2')
  out[2] = (due[1] == nil or due[1] == tenant) and 1 or 0
  out[3] = ((due[1] and due[1] ~= tenant) or (due[2] and due[2] ~= tenant)) and 1 or 0
  local score = tonumber(call('ZSCORE', KEYS[1], tenant))
  out[4] = (score and score <= now) and score or -1
  out[5] = first()
elseif op == 'requeue' then
  local score = tonumber(call('ZSCORE', KEYS[1], ARGV[A]))
  if score and score <= now then call('ZADD', KEYS[1], nowf, ARGV[A]) end
elseif op == 'next' then
  out[2] = first()
elseif op == 'heads' then
  -- every shard given (KEYS, on one server, where a script may read them
  -- all): the earliest due time of each
  for i = 1, #KEYS do
    local f = call('ZRANGE', KEYS[i], '0', '0', 'WITHSCORES')
    out[i + 1] = tonumber(f[2]) or -1
  end
else
  return redis.error_reply('ERR sluice: room.lua: unknown operation ' .. tostring(op))
end
return out
