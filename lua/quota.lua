-- quota.lua: the quota rule kind of admit.lua (at most limit starts per
-- calendar window: hour, day, week, month). Its functions are made only
-- when a policy of the call has a quota rule; the phases (phases.lua) call
-- them.
--
-- ARGV: kind 3, then limit, the number of window starts, the starts (µs;
-- the caller computes them in the quota's time zone). State: qa/qc and
-- qb/qd, two window starts and their counts (the current window and the
-- next are all it needs). Snapshot: qa, qc, qb, qd. Undo: the window
-- charged.

-- @begin quota
if has[3] then
  -- quota: the window of the bounds that holds time t
  win_index = function(bounds, t)
    for j = 1, #bounds - 1 do
      if bounds[j] <= t and t < bounds[j + 1] then
        return j
      end
    end
    return nil
  end

  -- quota: the count of the window starting at start
  used = function(sc, start)
    if sc.qa == start then return sc.qc end
    if sc.qb == start then return sc.qd end
    return 0
  end
end
-- @end quota
