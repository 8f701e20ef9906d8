-- release.lua: gives back the concurrency slots jobs hold, under their
-- claims.
--
-- A slot is given back only under the claim that holds it: a job's slot
-- taken over by a later admission of the same job (a redelivery) is left
-- to that admission. Once a scope's last slot is gone its hash expires as
-- soon as the rest of its state allows (field y, kept by admit.lua and
-- cooldown.lua), not a lease later.
--
-- A release that may hand its slot on (a line key given) gives back
-- nothing while jobs wait in that line: its caller then releases with
-- admit.lua's release op, which hands the slot to the line's head in the
-- same run. So the common release, with nobody waiting, stays small.
--
-- A release that gives its slot back while jobs wait, in a crowded room
-- (throttle/room.go, crowd), also marks its tenant due in the room's due
-- index, as room.lua's mark does, when the index is on the same server:
-- one script run where it took two.
--
-- Given its scopes' concurrency limits, a release that finds jobs waiting
-- gives its slots back all the same when none of its scopes was full (the
-- line does not wait for them: its head could have taken a free slot
-- already), and then marks its tenant due, with a mark: the fleet's pumps
-- promote its line in their turns, in one run for many tenants, rather
-- than this release handing its slot on alone.
--
-- KEYS: per op, the state hash of each of its scopes, then, when the op
--   says so, the lists of the tenant's line the slot may go to (one per
--   priority level), then, with a mark, the due index's shard
-- ARGV:
--   [1] clock: current time in µs, or -1 for Redis TIME
--   [2] number of ops
--   [3] 1 to leave expiries alone (tests), else 0
--   per op: job id, claim token (0: whichever claim holds the slot), number
--     of scopes, how many line keys follow (0: none) + 256 with a mark
--     + 512 with limits; with limits, then each scope's concurrency limit
--     (0: not known, as full) and the pumps' hold (µs); with a mark, then:
--     the tenant, the wake channel ("": publish nothing) and QUEUE␟SHARD
--     (room.lua's ARGV[3] and ARGV[4]). With limits the mark is made only
--     when the slots went back while jobs wait, and as room.lua's nudge
--     does: not for a tenant a pump holds or that is due within the hold.
-- Returns: per op released + 256 * lost + 65536 * waiting + 2^40 * given
--   (one number: a reply's every element costs a conversion): given is 1
--   when the slots went back while jobs wait (limits); released is how many of its
--   scopes gave back a slot held under the claim, lost how many held none
--   under it (another claim holds the job's slot, or the slot is gone:
--   given back already, or removed by an admission once its lease had run
--   out; with claim 0 a scope without the job's slot counts in neither);
--   waiting is how many jobs wait in the first of the line's lists that
--   holds any (0: none wait; with jobs waiting and no limits nothing was
--   given back)

local call, tonumber = redis.call, tonumber
-- @include clock
-- @include slot

-- @begin release_slot (lua.go also puts this function into admit.lua)
-- Give back the slot job id holds in the scope whose state hash is st,
-- under claim (its token as text; '0': whichever claim holds it). Returns
-- 1 when it gave one back, -1 when the claim holds none (another claim
-- does, or it is gone), 0 otherwise. The slot's field (hkey) holds its
-- claim (slot.lua), so the claim alone says whose the slot is.
-- One read serves the whole release (a Redis command costs the script
-- several times what a field more does): the slot, the count and y (v,
-- when the caller read them already: HMGET st hkey hc y). The
-- last slot lets the hash expire when its other state allows (y); the
-- time is asked only then, and only with a given clock.
local function release_slot(st, hkey, claim, noexpire, v)
  v = v or call('HMGET', st, hkey, 'hc', 'y')
  if not v[1] then
    return claim == '0' and 0 or -1
  end
  if claim ~= '0' and not held_by(v[1], claim) then return -1 end
  -- (numbers are compared and cut as text: converting one costs more)
  local hc = v[2]
  if hc and hc ~= '1' and hc ~= '0' and hc:sub(1, 1) ~= '-' then
    call('HDEL', st, hkey)
    call('HINCRBY', st, 'hc', '-1')
    return 1
  end
  -- the last slot: x, the expiry admit.lua last gave the hash, goes too,
  -- so that the next admission gives it one again
  call('HDEL', st, hkey, 'hc', 'x')
  local y = v[3]
  if y and not noexpire then
    if clock < 0 then
      -- y in ms, rounded down (y is seconds past what the state needs)
      call('PEXPIREAT', st, #y > 3 and y:sub(1, -4) or '1')
    else
      local need = tonumber(y)
      -- a given clock (tests) may be far from the server's: relative
      call('PEXPIRE', st, string.format('%d', math.max(math.floor((need - now_us()) / 1000), 0) + 2))
    end
  end
  return 1
end
-- @end release_slot

local nops = tonumber(ARGV[2])
local noexpire = ARGV[3] == '1'
local a, k = 4, 0
local out = {}
for op = 1, nops do
  local id, claim = ARGV[a], ARGV[a + 1]
  local n = tonumber(ARGV[a + 2])
  local nlines = tonumber(ARGV[a + 3])
  local limits = nlines >= 512
  if limits then nlines = nlines - 512 end
  local mark = nlines >= 256
  if mark then nlines = nlines - 256 end
  -- the op's keys and arguments include the mark's whether it is made
  local nmark = mark
  local hkey = 'h:' .. id
  a = a + 4
  -- whether jobs wait: the first of the line's lists that holds any
  local waiting = 0
  for i = 1, nlines do
    waiting = call('LLEN', KEYS[k + n + i])
    if waiting > 0 then break end
  end
  local given, hold, reads = 0, false, false
  if limits then
    if waiting > 0 then
      -- a scope full before this release: the line may wait for its slot
      -- (each scope's read serves its release below)
      given, reads = 1, {}
      for s = 1, n do
        local lim = tonumber(ARGV[a + s - 1])
        local v = call('HMGET', KEYS[k + s], hkey, 'hc', 'y')
        reads[s] = v
        if lim <= 0 or (tonumber(v[2]) or 0) >= lim then
          given = 0
          break
        end
      end
    end
    hold = tonumber(ARGV[a + n])
    a = a + n + 1
    -- the mark is made only when the slots go back while jobs wait
    mark = mark and given == 1
  end
  local released, lost = 0, 0
  if waiting == 0 or given == 1 then
    for s = 1, n do
      local r = release_slot(KEYS[k + s], hkey, claim, noexpire, reads and reads[s])
      if r > 0 then released = released + 1 elseif r < 0 then lost = lost + 1 end
    end
  end
  k = k + n + nlines
  out[op] = released + 256 * lost + 65536 * waiting + 1099511627776 * given
  if mark then
    -- the tenant is due now, or earlier if it was (room.lua's mark); with
    -- limits, only when no pump holds it and it is not due within the
    -- hold (room.lua's nudge); the pumps wake when that is sooner than it
    -- was
    local t = now_us()
    local at = string.format('%d', t)
    local changed = 0
    if hold then
      local score = tonumber(call('ZSCORE', KEYS[k + 1], ARGV[a]))
      if not score or score > t + hold then
        call('ZADD', KEYS[k + 1], at, ARGV[a])
        changed = 1
      end
    else
      changed = call('ZADD', KEYS[k + 1], 'LT', 'CH', at, ARGV[a])
    end
    if changed > 0 and ARGV[a + 1] ~= '' then call('PUBLISH', ARGV[a + 1], ARGV[a + 2] .. '\31' .. at) end
  end
  if nmark then
    k = k + 1
    a = a + 3
  end
end
return out
