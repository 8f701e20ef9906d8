-- expire.lua: how a script gives its keys a life, put by lua.go into the
-- scripts that write state outside admit.lua (it is not a script of its
-- own). The script defines now (µs) and noexpire (tests: set no TTL)
-- before it.

-- @begin expire
-- a number as Redis takes it (%d: Redis would print %.17g, slower)
local function fmt(v)
  return string.format('%d', v)
end

-- make key live at least until time t, never shortening its life: GT
-- extends a key that has a TTL, NX gives one to a key that has none
local function extend_to(key, t)
  if noexpire or t <= now then return end
  local ms = fmt(math.floor((t - now) / 1000) + 2)
  if redis.call('PEXPIRE', key, ms, 'GT') == 0 then
    redis.call('PEXPIRE', key, ms, 'NX')
  end
end
-- @end expire
