-- renew.lua: extends the leases of running jobs' concurrency slots.
--
-- KEYS: the state hash of every scope of every op, in order
-- ARGV:
--   [1] clock: current time in µs, or -1 for Redis TIME
--   [2] number of ops
--   [3] 1: set no expiry (tests keep keys alive), 0 otherwise
--   per op: job id, claim token (0: whichever claim holds the slot), number
--     of scopes, then the lease (µs) of each scope
-- Returns: per op 1 when every slot was renewed, 0 when one was lost: its
--   lease had run out (another job may have the slot by now), it was gone,
--   or another claim holds it (a later admission of the same job). A lost
--   slot is not taken again, and another claim's slot is left alone.

local call, tonumber, format = redis.call, tonumber, string.format
-- @include clock
-- @include slot
local now = now_us()

local nops = tonumber(ARGV[2])
local noexpire = ARGV[3] == '1'
local a, k = 4, 0
local out = {}
for op = 1, nops do
  local id, claim = ARGV[a], tonumber(ARGV[a + 1])
  local n = tonumber(ARGV[a + 2])
  a = a + 3
  local held = 1
  local hkey = 'h:' .. id
  for s = 1, n do
    k = k + 1
    local lease = tonumber(ARGV[a])
    a = a + 1
    local v = call('HMGET', KEYS[k], hkey, 'x')
    local e, c = v[1] and slot_lease(v[1]), v[1] and slot_claim(v[1])
    local mine = e and (claim == 0 or c == claim)
    if mine and e > now then
      local until_ = now + lease
      -- the slot keeps its claim (as the admission wrote it)
      local slot = slot_text(format('%d', until_), c and format('%d', c))
      -- x is the expiry admit.lua last gave the hash; keep it true
      local x = tonumber(v[2]) or 0
      if until_ > x and not noexpire then
        local ms = format('%d', math.floor((until_ + 1000000 - now) / 1000) + 2)
        call('HSET', KEYS[k], hkey, slot, 'x', format('%d', until_ + 1000000))
        if call('PEXPIRE', KEYS[k], ms, 'GT') == 0 then
          call('PEXPIRE', KEYS[k], ms, 'NX')
        end
      else
        call('HSET', KEYS[k], hkey, slot)
      end
    else
      if mine then
        call('HDEL', KEYS[k], hkey)
        call('HINCRBY', KEYS[k], 'hc', '-1')
      end
      held = 0
    end
  end
  out[op] = held
end
return out
