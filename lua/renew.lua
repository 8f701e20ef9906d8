-- renew.lua: extends the leases of running jobs' concurrency slots.
--
-- KEYS: the holders zset of every scope of every op, in order
-- ARGV:
--   [1] clock: current time in µs, or -1 for Redis TIME (tests only)
--   [2] number of ops
--   per op: job id, number of scopes, then the lease (µs) of each scope
-- Returns: per op 1 when every slot was renewed, 0 when one was lost: its
--   lease had run out (another job may have the slot by now) or it was gone.
--   A lost slot is not taken again.

local now
local clock = tonumber(ARGV[1])
if clock >= 0 then
  now = clock
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local nops = tonumber(ARGV[2])
local a, k = 3, 0
local out = {}
for op = 1, nops do
  local id = ARGV[a]
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  local held = 1
  for s = 1, n do
    k = k + 1
    local lease = tonumber(ARGV[a])
    a = a + 1
    -- drop the slots of holders whose lease ran out (crashed workers)
    redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', string.format('%d', now))
    local score = redis.call('ZSCORE', KEYS[k], id)
    if score and tonumber(score) > now then
      local until_ = now + lease
      redis.call('ZADD', KEYS[k], 'XX', string.format('%d', until_), id)
      local want = math.floor(lease / 1000) + 2
      if redis.call('PEXPIRE', KEYS[k], want, 'GT') == 0 then
        redis.call('PEXPIRE', KEYS[k], want, 'NX')
      end
    else
      held = 0
    end
  end
  out[op] = held
end
return out
