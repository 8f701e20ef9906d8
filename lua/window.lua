-- window.lua: the window rule kind of admit.lua (an exact sliding window:
-- at most limit starts in any span of its length). Its functions are made
-- only when a policy of the call has a window rule; the phases
-- (phases.lua) call them.
--
-- ARGV: kind 2, then limit, length (µs). State: the scope's zsets [2]
-- (planned) and [3] (started), score the start time, and n in the state
-- hash, the entries' sequence. Snapshot: the newest live planned entry,
-- the planned and the started entry whose leaving makes room for the job
-- (-1: none). Undo: the sequence ranges added to [2] and to [3].

-- @begin window
if has[2] then
  -- window: the newest live planned entry, and the planned and started
  -- entries whose leaving makes room for the job (-1: none), read once
  window_entries = function(sc, started)
    local lo = fmt(now - sc.pol.wdur + 1)
    local slack = fmt(sc.pol.wlim - E.cost)
    if not sc.wtop then
      local top = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', '0', '1')
      local e = call('ZREVRANGEBYSCORE', sc.wp, '+inf', lo, 'WITHSCORES', 'LIMIT', slack, '1')
      sc.wtop, sc.we = num(top[2]) or -1, num(e[2]) or -1
    end
    if started and not sc.wea then
      local e = call('ZREVRANGEBYSCORE', sc.wa, '+inf', lo, 'WITHSCORES', 'LIMIT', slack, '1')
      sc.wea = num(e[2]) or -1
    end
  end

  -- add the cost's window entries at time t; members come from the scope's
  -- sequence (started at the current time, so they never meet members of an
  -- expired log); returns the first and last member
  add_entries = function(sc, key, t)
    local seq = sc.n or now
    local first = seq + 1
    local z = {}
    for c = 1, E.cost do
      seq = seq + 1
      z[#z + 1] = fmt(t)
      z[#z + 1] = fmt(seq)
      if #z >= 2000 or c == E.cost then
        call('ZADD', key, unpack(z))
        z = {}
      end
    end
    sc.n = seq
    return first, seq
  end
end
-- @end window
