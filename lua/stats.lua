-- stats.lua: a consistent snapshot of one scope's state, for sluice stats.
--
-- KEYS[1] -> state hash, KEYS[2] -> planned window zset, KEYS[3] -> started
--   window zset, KEYS[4..] -> the tenant's lines in the waiting room
-- ARGV[1] -> clock: current time in µs, or -1 for Redis TIME (tests only)
-- ARGV[2] -> window length in µs (0: no window rule)
-- ARGV[3] -> reservation grace in µs
-- Returns: {now, the state hash's scalar fields as a flat field/value list,
--   planned entries in the window, started entries in the window, live
--   reservations, first reservation slot (0: none), last reservation slot
--   (0: none), live holders, jobs waiting in the lines, holder ids (up to
--   100) as a flat id/lease-end list, when the longest waiting head joined
--   its line (ms; 0: none)}
--   Reservations and running jobs come from the hash's r:<job> and h:<job>
--   fields; past 100,000 fields the reservation count is the hash's rn
--   counter and the slots and holders are partial.

local call, tonumber = redis.call, tonumber
-- @include clock
-- @include slot
local now = now_us()

local wdur = tonumber(ARGV[2])
local grace = tonumber(ARGV[3])
local planned, started = 0, 0
if wdur > 0 then
  local lo = string.format('%d', now - wdur + 1)
  planned = call('ZCOUNT', KEYS[2], lo, '+inf')
  started = call('ZCOUNT', KEYS[3], lo, '+inf')
end

local scalars = {}
local reservations, first, last = 0, 0, 0
local live, holders = 0, {}
local cursor, scanned = '0', 0
repeat
  local res = call('HSCAN', KEYS[1], cursor, 'COUNT', 1000)
  cursor = res[1]
  local kv = res[2]
  for i = 1, #kv, 2 do
    local kind = kv[i]:sub(1, 2)
    if kind == 'r:' then
      local slot = tonumber(kv[i + 1])
      if slot + grace > now then
        reservations = reservations + 1
        if first == 0 or slot < first then first = slot end
        if slot > last then last = slot end
      end
    elseif kind == 'h:' then
      local e = slot_lease(kv[i + 1])
      if e > now then
        live = live + 1
        if #holders < 200 then
          holders[#holders + 1] = kv[i]:sub(3)
          holders[#holders + 1] = e
        end
      end
    else
      scalars[#scalars + 1] = kv[i]
      scalars[#scalars + 1] = kv[i + 1]
    end
  end
  scanned = scanned + #kv / 2
until cursor == '0' or scanned > 100000
if cursor ~= '0' then
  reservations = tonumber(call('HGET', KEYS[1], 'rn')) or reservations
end

-- the jobs waiting in the lines, and when the longest waiting head joined
-- its line: an entry's first field
local waiting, lined = 0, 0
for i = 4, #KEYS do
  waiting = waiting + call('LLEN', KEYS[i])
  local head = call('LINDEX', KEYS[i], '0')
  if head then
    local ms = tonumber(string.match(head, '^(%d+)') or '')
    if ms and (lined == 0 or ms < lined) then lined = ms end
  end
end

return {
  now,
  scalars,
  planned,
  started,
  reservations,
  first,
  last,
  live,
  waiting,
  holders,
  lined,
}
