-- adapt.lua: one step of a tenant's adaptive limit (AIMD), decided for the
-- whole fleet from one worker's report of what its downstream answered
-- since its last report. At most one increase and one decrease per
-- interval, however many workers report: additive increase while the
-- answers are good and the limit is used, multiplicative decrease on
-- throttled answers (429/503) or too many slow ones, never outside
-- floor..ceiling. A report's throttled answers sent under a limit older
-- than the last decrease are old news (the decrease answered them), as
-- TCP cuts its window once per round trip.
--
-- KEYS[1] -> the tenant's adaptive state, a hash:
--              v   the current limit (per the rule's period)
--              c   the policy it follows: "start:period:floor:ceiling"
--              n   its sequence number, bumped on every change (from 1)
--              tc  when it last changed (µs)
--              dn  n right after the last decrease; td when that was (µs)
--              tb  when a fresh throttled report last came (µs)
--              k   answers reported since tk, the start of the window
--                  that tells whether the limit is used
--              ni, nd  increases and decreases so far
--              h   the last changes, one line each "ms from to reason",
--                  oldest first; hn how many lines
-- ARGV[1]  -> clock: current time in µs, or -1 for Redis TIME (tests only)
-- ARGV[2]  -> start: the policy's rate limit (where the limit starts)
-- ARGV[3]  -> the rule's period (µs)
-- ARGV[4]  -> floor
-- ARGV[5]  -> ceiling
-- ARGV[6]  -> step: the additive increase
-- ARGV[7]  -> interval (µs): the least time between two increases, and
--             between two decreases
-- ARGV[8]  -> good answers in the report
-- ARGV[9]  -> throttled answers (429/503) in the report
-- ARGV[10] -> slow answers (above the latency target; counted in neither
--             of the above)
-- ARGV[11] -> the sequence number the report's throttled and slow answers
--             were sent under; 0 when unknown (taken as fresh)
-- ARGV[12] -> how long the state lives after the last report (ms)
-- ARGV[13] -> how many changes the history keeps
-- ARGV[14] -> the decrease factor, in thousandths (750: ×0.75)
-- Returns: {limit, sequence number, change (0 none, 1 increase,
--           2 decrease, 3 start or policy change), now (µs), limit before,
--           reason}
-- reason is "", "start", "policy", "increase", "throttled" or "latency".

-- @include clock
local now = now_us()

local key = KEYS[1]
local start, period = tonumber(ARGV[2]), tonumber(ARGV[3])
local floor_, ceil_ = tonumber(ARGV[4]), tonumber(ARGV[5])
local step, every = tonumber(ARGV[6]), tonumber(ARGV[7])
local ok, throttled, slow = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local seen = tonumber(ARGV[11])
local ttl, keep, cut = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local fmt = function(x) return string.format('%d', x) end

local cfg = fmt(start) .. ':' .. fmt(period) .. ':' .. fmt(floor_) .. ':' .. fmt(ceil_)
local st = redis.call('HMGET', key, 'v', 'c', 'n', 'tc', 'dn', 'td', 'tb', 'k', 'tk')
local v = tonumber(st[1])
local n, tc = tonumber(st[3]) or 0, tonumber(st[4]) or 0
local dn, td, tb = tonumber(st[5]) or 0, tonumber(st[6]) or 0, tonumber(st[7]) or 0
local k, tk = tonumber(st[8]) or 0, tonumber(st[9]) or now
local before = v or start
local change, reason = 0, ''

if not v then
  v, change, reason, tc = start, 3, 'start', now
elseif st[2] ~= cfg then
  -- the policy changed: a new start (or period) starts again from it; a
  -- new floor or ceiling only clamps what was learned
  local ostart, operiod = string.match(st[2] or '', '^(%-?%d+):(%-?%d+):')
  if tonumber(ostart) ~= start or tonumber(operiod) ~= period then
    v = start
  else
    v = math.min(math.max(v, floor_), ceil_)
  end
  change, reason, tc = 3, 'policy', now
end

-- slow answers count against the limit when they are more than a tenth
local bad = throttled > 0 or (slow > 0 and slow * 10 > ok + slow)
if bad then
  if seen == 0 or seen >= dn then
    tb = now
    if now - td >= every and v > floor_ then
      v = math.max(floor_, math.floor(v * cut / 1000))
      change, tc, td = 2, now, now
      if throttled > 0 then reason = 'throttled' else reason = 'latency' end
    end
  end
elseif change == 0 then
  k = k + ok + slow
  if now - tk >= every then
    -- a limit is raised only while the tenant uses at least half of it (a
    -- tenant that sends less learns nothing about the downstream's limit),
    -- measured over windows of at least an interval
    local used = k * 2 * period >= v * (now - tk)
    if ok > 0 and used and now - tb >= every and v < ceil_ then
      v = math.min(ceil_, v + step)
      change, reason, tc = 1, 'increase', now
    end
    tk, k = now, 0
  end
end
if change ~= 0 then
  tk, k = now, 0
end

if change ~= 0 then
  n = n + 1
  if change == 2 then dn = n end
  local h = redis.call('HGET', key, 'h') or ''
  local hn = tonumber(redis.call('HGET', key, 'hn')) or 0
  h = h .. fmt(math.floor(now / 1000)) .. ' ' .. fmt(before) .. ' ' .. fmt(v) .. ' ' .. reason .. '\n'
  hn = hn + 1
  while hn > keep do
    h = string.sub(h, string.find(h, '\n', 1, true) + 1)
    hn = hn - 1
  end
  local ni = redis.call('HGET', key, 'ni') or '0'
  local nd = redis.call('HGET', key, 'nd') or '0'
  if change == 1 then ni = fmt(tonumber(ni) + 1) end
  if change == 2 then nd = fmt(tonumber(nd) + 1) end
  redis.call('HSET', key, 'v', fmt(v), 'c', cfg, 'n', fmt(n), 'tc', fmt(tc), 'dn', fmt(dn),
    'td', fmt(td), 'tb', fmt(tb), 'k', fmt(k), 'tk', fmt(tk), 'h', h, 'hn', fmt(hn), 'ni', ni, 'nd', nd)
else
  redis.call('HSET', key, 'tb', fmt(tb), 'k', fmt(k), 'tk', fmt(tk))
end
redis.call('PEXPIRE', key, ttl)
return { v, n, change, now, before, reason }
