-- concurrency.lua: the concurrency rule kind of admit.lua (at most limit
-- jobs running, each holding a slot under a lease). Its functions are made
-- only when a policy of the call has a concurrency rule; the phases
-- (phases.lua) call them.
--
-- ARGV: kind 4, then limit, lease (µs). State: h:<job> a running job's
-- slot, its lease end and the claim token of the admission holding it
-- (slot.lua); hc how many slots are recorded, hm a lower bound of their
-- earliest lease end (while hm is in the future every recorded slot is
-- live and hc counts them exactly). Snapshot: live slots, 1 when the job
-- holds one, the earliest lease end when full (-1 otherwise). Undo: the
-- job's lease end and claim before.

-- @begin concurrency
if has[4] then
  -- concurrency: count the live slots (sc.live, sc.mine); the slots are
  -- listed only when one may have run out (or, with need_soonest, to know
  -- which ends first); a listing also finds the stale ones (other than the
  -- job's own) to remove
  count_holders = function(sc, need_soonest)
    if sc.live and (sc.soonest or not need_soonest or not sc.st) then
      return
    end
    if not sc.live and sc.hc == 0 then
      sc.live, sc.mine = 0, false
      return
    end
    if not sc.live and sc.hm > now and not need_soonest then
      sc.live, sc.mine = sc.hc, sc.hend ~= false
      return
    end
    local live, soonest, stale = 0, false, {}
    local cursor = '0'
    repeat
      local res = call('HSCAN', sc.st, cursor, 'MATCH', 'h:*', 'COUNT', '1000')
      cursor = res[1]
      local kv = res[2]
      for i = 1, #kv, 2 do
        local e = slot_lease(kv[i + 1])
        if e > now then
          live = live + 1
          if not soonest or e < soonest then soonest = e end
        elseif kv[i] ~= E.hkey then
          stale[#stale + 1] = kv[i]
        end
      end
    until cursor == '0'
    if not sc.live then
      sc.live, sc.stale = live, stale
      sc.mine = sc.hend ~= false and sc.hend > now
    end
    sc.soonest = soonest
  end

  -- is the job denied a concurrency slot in this scope?
  full = function(sc)
    count_holders(sc, false)
    if not sc.mine and sc.live >= sc.pol.clim then
      count_holders(sc, true)
      return true
    end
    return false
  end

  -- How long until every scope has a concurrency slot for the job (false:
  -- now), at most cap when cap is given (a slot freed by a release is not
  -- announced to a job that waits in a worker), and the rule that makes it
  -- wait.
  conc_wait = function(scopes, cap)
    local cwait, rule = false, 0
    for s = 1, #scopes do
      local sc = scopes[s]
      if sc.pol.clim > 0 and full(sc) then
        local w = sc.soonest - now
        if cap then w = min(w, cap) end
        if not cwait or w > cwait then
          cwait, rule = w, 4 * 65536 + s
        end
      end
    end
    return cwait, rule
  end
end
-- @end concurrency
