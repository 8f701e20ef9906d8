-- release.lua: gives back the concurrency slots jobs hold and, for jobs
-- that finished for good, takes them out of their tenant's backlog.
--
-- KEYS: per op, the state hash of each of its scopes, then its tenant's
--   backlog zset when the op says so
-- ARGV:
--   [1] clock (unused: part of the header every merged script shares)
--   [2] number of ops
--   per op: job id, number of scopes, 1 when a backlog key follows, else 0
-- Returns: per op, how many of its scopes had a slot for the job (one whose
--   lease ran out may count: admit.lua clears those lazily)

local call, tonumber = redis.call, tonumber
local nops = tonumber(ARGV[2])
local a, k = 3, 0
local out = {}
for op = 1, nops do
  local id = ARGV[a]
  local n = tonumber(ARGV[a + 1])
  local backlog = ARGV[a + 2] == '1'
  a = a + 3
  local released = 0
  for s = 1, n do
    k = k + 1
    if call('HDEL', KEYS[k], 'h:' .. id) == 1 then
      call('HINCRBY', KEYS[k], 'hc', '-1')
      released = released + 1
    end
  end
  if backlog then
    k = k + 1
    call('ZREM', KEYS[k], id)
  end
  out[op] = released
end
return out
