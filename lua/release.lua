-- release.lua: gives back the concurrency slots jobs hold and, for jobs
-- that finished for good, takes them out of their tenant's backlog.
--
-- A slot is given back only under the claim that holds it: a job's slot
-- taken over by a later admission of the same job (a redelivery) is left
-- to that admission. Once a scope's last slot is gone its hash expires as
-- soon as the rest of its state allows (field y, kept by admit.lua and
-- cooldown.lua), not a lease later.
--
-- KEYS: per op, the state hash of each of its scopes, then its tenant's
--   backlog zset when the op says so
-- ARGV:
--   [1] clock: current time in µs, or -1 for Redis TIME
--   [2] number of ops
--   [3] 1 to leave expiries alone (tests), else 0
--   per op: job id, claim token (0: whichever claim holds the slot), number
--     of scopes, 1 when a backlog key follows, else 0
-- Returns: per op {released, lost}: how many of its scopes gave back a slot
--   held under the claim, and how many held none under it (another claim
--   holds the job's slot, or the slot is gone: given back already, or
--   removed by an admission once its lease had run out); with claim 0 a
--   scope without the job's slot counts in neither

local call, tonumber, format = redis.call, tonumber, string.format
local now
local function clock()
  if not now then
    local c = tonumber(ARGV[1])
    if c >= 0 then
      now = c
    else
      local t = call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
  end
  return now
end

local nops = tonumber(ARGV[2])
local noexpire = ARGV[3] == '1'
local a, k = 4, 0
local out = {}
for op = 1, nops do
  local id, claim = ARGV[a], tonumber(ARGV[a + 1])
  local n = tonumber(ARGV[a + 2])
  local backlog = ARGV[a + 3] == '1'
  a = a + 4
  local released, lost = 0, 0
  local hkey, ckey = 'h:' .. id, 'c:' .. id
  for s = 1, n do
    k = k + 1
    local v = call('HMGET', KEYS[k], hkey, ckey, 'hc', 'y')
    local e, c = tonumber(v[1]), tonumber(v[2])
    if e and (claim == 0 or c == claim) then
      local hc = (tonumber(v[3]) or 1) - 1
      if hc <= 0 then
        -- the last slot: the hash lives only as long as the rest of its
        -- state needs (x, the expiry admit.lua last gave it, goes too, so
        -- that the next admission gives it one again)
        call('HDEL', KEYS[k], hkey, ckey, 'hc', 'x')
        local need = tonumber(v[4])
        if noexpire then
          need = nil
        end
        if need and tonumber(ARGV[1]) < 0 then
          call('PEXPIREAT', KEYS[k], format('%d', math.floor(need / 1000) + 2))
        elseif need then
          -- a given clock (tests) may be far from the server's: relative
          local ms = math.max(math.floor((need - clock()) / 1000), 0) + 2
          call('PEXPIRE', KEYS[k], format('%d', ms))
        end
      else
        call('HDEL', KEYS[k], hkey, ckey)
        call('HSET', KEYS[k], 'hc', format('%d', hc))
      end
      released = released + 1
    elseif e or claim ~= 0 then
      -- another claim holds the job's slot (left alone), or the claim's
      -- slot is gone: released already, or swept once its lease ran out
      if claim ~= 0 then lost = lost + 1 end
    end
  end
  if backlog then
    k = k + 1
    call('ZREM', KEYS[k], id)
  end
  out[op] = { released, lost }
end
return out
