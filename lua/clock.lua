-- clock.lua: the time every script decides by, put into each of them by
-- lua.go (it is not a script of its own).

-- @begin clock
-- ARGV[1] is the clock: the current time in µs, or -1 for Redis TIME (a
-- clock is given only by tests). now_us() is that time; Redis is asked at
-- most once a run, and only when a script needs the time.
local clock = tonumber(ARGV[1])
local clock_now
local function now_us()
  if not clock_now then
    if clock >= 0 then
      clock_now = clock
    else
      local t = redis.call('TIME')
      clock_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
  end
  return clock_now
end
-- @end clock
