-- release.lua: gives back the concurrency slots jobs hold and, for jobs
-- that finished for good, takes them out of their tenant's backlog.
--
-- A slot is given back only under the claim that holds it: a job's slot
-- taken over by a later admission of the same job (a redelivery) is left
-- to that admission. Once a scope's last slot is gone its hash expires as
-- soon as the rest of its state allows (field y, kept by admit.lua), not a
-- lease later.
--
-- KEYS: per op, the state hash of each of its scopes, then its tenant's
--   backlog zset when the op says so
-- ARGV:
--   [1] clock: current time in µs, or -1 for Redis TIME
--   [2] number of ops
--   per op: job id, claim token (0: whichever claim holds the slot), number
--     of scopes, 1 when a backlog key follows, else 0
-- Returns: per op {released, lost}: how many of its scopes gave back a slot
--   held under the claim, and how many no longer held one under it (another
--   claim holds the job's slot, or the claim's lease ran out first); a
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
local a, k = 3, 0
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
    local v = call('HMGET', KEYS[k], hkey, ckey, 'hc', 'y', 'cd')
    local e, c = tonumber(v[1]), tonumber(v[2])
    if e then
      if claim == 0 or c == claim then
        call('HDEL', KEYS[k], hkey, ckey)
        local hc = math.max((tonumber(v[3]) or 1) - 1, 0)
        if hc == 0 then
          -- the last slot: the hash lives only as long as its state needs
          local need = math.max(tonumber(v[4]) or 0, tonumber(v[5]) or 0)
          if need > 0 then
            local ms = math.max(math.floor((need - clock()) / 1000), 0) + 2
            call('HSET', KEYS[k], 'hc', '0', 'x', format('%d', need))
            call('PEXPIRE', KEYS[k], format('%d', ms))
          else
            call('HSET', KEYS[k], 'hc', '0')
          end
        else
          call('HSET', KEYS[k], 'hc', format('%d', hc))
        end
        if e > clock() or claim == 0 then
          released = released + 1
        else
          lost = lost + 1
        end
      else
        lost = lost + 1
      end
    end
  end
  if backlog then
    k = k + 1
    call('ZREM', KEYS[k], id)
  end
  out[op] = { released, lost }
end
return out
