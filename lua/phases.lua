-- phases.lua: the phases of admit.lua's decision over an op's scopes:
-- read_state reads a scope, decide finds the earliest time every rule of
-- every scope allows the job (writing nothing), apply charges it. Each
-- phase has a branch per rule kind rather than a function per kind: Redis
-- makes every function of a script anew on every call, and a decision
-- pays for each. The rate kind lives here whole (it is a few lines in
-- each phase); window.lua, quota.lua and concurrency.lua hold the
-- functions of the other kinds.
--
-- The rate rule kind: ARGV kind 1, then the increment of cost 1, the
-- burst offset, period, limit. State: p<i>/a<i> the planned and started
-- meter of the policy's i-th rate (a<i> not stored while equal to p<i>),
-- i<i> the interval (increment of cost 1) they were charged at: read
-- under another interval, the time they hold ahead of now is scaled to
-- it. Snapshot: p, a. Undo: p before, p after, a before, a after.

-- @begin phases

-- a local scope's state, from its keys (its claim token only for the steps
-- of a two-scope admission: their undo records give it back), or from v,
-- the quick path's read of the same fields; k is the position of its keys
-- in KEYS, or their names (a key scope a turn of a line builds: {state,
-- planned, started})
local function read_state(sc, k, claims, v)
  local pol = sc.pol
  if type(k) == 'table' then
    sc.k, sc.st = false, k[1]
    if pol.wlim > 0 then sc.wp, sc.wa = k[2], k[3] end
  else
    sc.k, sc.st = k, KEYS[k + 1]
    if pol.wlim > 0 then sc.wp, sc.wa = KEYS[k + 2], KEYS[k + 3] end
  end
  local j
  -- a decision made once reads the first started meter's ticket charge
  -- (om, oz: decide) with the rest, when it reads the state itself
  local once = not v and E.once and pol.nr > 0
  if pol.clim > 0 then
    if once then
      v = call('HMGET', sc.st, 'cd', 's', 'x', 'rn', E.rkey, E.hkey, 'om', 'oz', unpack(pol.fields))
    else
      v = v or call('HMGET', sc.st, 'cd', 's', 'x', 'rn', E.rkey, E.hkey, unpack(pol.fields))
    end
    local slot = v[6]
    sc.hend, j = slot and slot_lease(slot) or false, 7
    if claims then sc.htok = slot and slot_claim(slot) end
  elseif once then
    v = call('HMGET', sc.st, 'cd', 's', 'x', 'rn', E.rkey, 'om', 'oz', unpack(pol.fields))
    j = 6
  else
    v = v or call('HMGET', sc.st, 'cd', 's', 'x', 'rn', E.rkey, unpack(pol.fields))
    j = 6
  end
  if once then
    sc.om, sc.oz = num(v[j]) or false, num(v[j + 1]) or 0
    j = j + 2
  end
  sc.cd, sc.starts, sc.x = num(v[1]) or 0, num(v[2]) or 0, num(v[3]) or 0
  sc.rn = num(v[4]) or 0
  local m = sc
  for i = 1, pol.nr do
    local P = num(v[j]) or 0
    local A = v[j + 1]
    if A then
      sc.astored = sc.astored or {}
      sc.astored[i] = true
      A = num(A)
    else
      A = P -- a started meter equal to its planned one is not stored
    end
    -- the interval the meters were last charged at: a policy change
    -- re-times what they hold ahead of now to the new interval, so that a
    -- raised rate speeds up at once and a lowered one slows down at once;
    -- the re-timed meters are kept at once (a dry run excepted), or every
    -- read would re-time from its own now and never drain (the interval is
    -- compared as text: the same one needs no conversion)
    local I, unit = v[j + 2], pol.unit[i]
    if I ~= ARGV[pol.uarg[i]] then
      I = num(I)
      if I and I > 0 and (P > now or A > now) then
        if P > now then P = now + floor((P - now) * (unit / I)) end
        -- the started meter holds starts decided already (a job decided
        -- once starts on its decision): a raised rate does not move them
        -- closer, a lowered one spaces what follows them
        if A > now and unit > I then A = now + floor((A - now) * (unit / I)) end
        if not E.dry then
          local f = pol.fields
          call('HSET', sc.st, f[3 * i - 2], fmt(P), f[3 * i - 1], fmt(A), f[3 * i], ARGV[pol.uarg[i]])
          sc.astored = sc.astored or {}
          sc.astored[i] = true
        end
      end
      if E.dry or not (I and I > 0 and (P > now or A > now)) then
        sc.inew = sc.inew or {}
        sc.inew[i] = true
      end
    end
    if E.ticket then
      -- the job's own charges, decided once for its slot E.ticket (the
      -- started meter's E.tslack after it), are taken back where they are
      -- the last; a planned one others follow stands (tkept counts them)
      local inc = m[3 * i - 2]
      if P == E.ticket + inc then
        P = E.ticket
      elseif P > E.ticket + inc and I == ARGV[pol.uarg[i]] then
        sc.tkept = (sc.tkept or 0) + 1
      end
      if A == E.ticket + E.tslack + inc then A = E.ticket + E.tslack end
      sc.astored = sc.astored or {}
      sc.astored[i] = true
    end
    m[3 * i - 1], m[3 * i] = P, A
    j = j + 3
  end
  if pol.wlim > 0 then
    sc.n = num(v[j]) or false
    j = j + 1
  end
  if pol.qlim > 0 then
    sc.qa, sc.qc = num(v[j]) or 0, num(v[j + 1]) or 0
    sc.qb, sc.qd = num(v[j + 2]) or 0, num(v[j + 3]) or 0
    j = j + 4
  end
  if pol.clim > 0 then
    sc.hc, sc.hm, sc.y = num(v[j]) or 0, num(v[j + 1]) or 0, num(v[j + 2]) or 0
  end
  -- the job's own reservation, if it is still good
  local r = num(v[5])
  sc.Rraw = r or false
  if r then
    grace = grace or num(ARGV[4])
    if r + grace <= now then
      r = false -- expired: the job is treated as new
    elseif sc.cd > now and r < sc.cd then
      r = false -- a cooldown began before the slot: take a new one after it
    elseif pol.qlim > 0 and r <= now and win_index(pol.bounds, r) ~= pol.cur then
      r = false -- the slot's quota window is over
    end
  end
  sc.R = r or false
  if E.ticket and not r and pol.nr > 0 and sc.tkept == pol.nr and pol.wlim + pol.qlim == 0 then
    -- late for its ticket, its planned charges followed by others': it
    -- starts on them as on a reservation (the started meters say when),
    -- not behind every job planned after it: a late wake costs the jobs
    -- after it a few ms, not a slot of a strict rate
    sc.R = E.ticket
  end
end

-- The decision over every scope of the op, without writing anything:
-- allowed, retry-after, slot, what to write ('reserve', 'start' or false)
-- and the rule.
local function decide(scopes)
  -- S: the earliest time every scope allows the job; rule, ridx and rscope
  -- name what pushed it furthest
  local S = max(now, E.not_before)
  local rule, ridx, rscope = 0, 0, 0
  for s = 1, #scopes do
    local sc = scopes[s]
    local pol = sc.pol
    if sc.cd > now and sc.cd > S then
      S, rule, ridx, rscope = sc.cd, 64, 0, s
    end
    if sc.R then
      if sc.R > S then
        S, rule, ridx, rscope = sc.R, 65, 0, s
      end
    else
      local m = sc
      for i = 1, pol.nr do
        local t = m[3 * i - 1] + m[3 * i - 2] - pol.off[i]
        if E.once then
          -- decided once: the job starts at its slot on both meters. The
          -- started meters' charges are never before a start, so their
          -- tolerance would hold as for a start decided now; but only the
          -- part of it a ticket's charge put past its slot (its wake's
          -- leeway, no start: om, oz, written by apply) is left out, so
          -- that a slot follows the starts themselves as they came, late
          -- ones included, and keeps the tolerance for the way to the
          -- downstream
          if sc.om == nil then
            sc.om, sc.oz = false, 0
            if sc.st then
              local o = call('HMGET', sc.st, 'om', 'oz')
              sc.om, sc.oz = num(o[1]) or false, num(o[2]) or 0
            end
          end
          local z = 0
          if sc.om and sc.om == m[3] then
            tolerance = tolerance or num(ARGV[5])
            z = min(sc.oz, tolerance, floor(pol.unit[i] / 4))
          end
          t = max(t, m[3 * i] + m[3 * i - 2] - pol.off[i] - z)
        end
        if t > S then
          S, rule, ridx, rscope = t, 1, i, s
        end
      end
      if pol.wlim > 0 then
        if sc.st then window_entries(sc, E.once) end
        -- first in, first out: never before the last planned entry
        local t = sc.wtop
        if sc.we >= 0 then t = max(t, sc.we + pol.wdur) end
        if E.once and sc.wea >= 0 then t = max(t, sc.wea + pol.wdur) end
        if t > S then
          S, rule, ridx, rscope = t, 2, 0, s
        end
      end
    end
  end
  -- quota: move S to the first window with room; only the current and the
  -- next window are kept, so a slot further out is not reservable
  local beyond = false
  local changed = true
  while changed do
    changed = false
    for s = 1, #scopes do
      local sc = scopes[s]
      local pol = sc.pol
      if pol.qlim > 0 and not sc.R then
        local b = pol.bounds
        local w = win_index(b, S)
        while true do
          if w == nil or w > pol.cur + 1 then
            beyond = true
            break
          end
          if used(sc, b[w]) + E.cost <= pol.qlim then break end
          w = w + 1
          if w > #b then
            beyond = true
            break
          end
          if b[w] > S then
            S, rule, ridx, rscope = b[w], 3, 0, s
            changed = true
          end
        end
      end
    end
  end

  local allowed, retry, slot, write = false, 0, 0, false
  if E.promote then
    -- may the job leave its line? Its slot must be due within the lead and
    -- a concurrency slot free; it takes both, and the gate starts it on
    -- them. retry is when to look again.
    if beyond then
      -- past the quota windows this call knows: look again in a while
      horizon = horizon or num(ARGV[3])
      return false, horizon, 0, false, rule * 65536 + ridx * 256 + rscope
    end
    if S > now + E.lead then
      return false, S - E.lead - now, 0, false, rule * 65536 + ridx * 256 + rscope
    end
    local cwait, crule = false, 0
    if has[4] then cwait, crule = conc_wait(scopes, false) end
    if cwait then
      return false, cwait, 0, false, crule
    end
    if E.once then
      -- how late the job may start: its started meters are charged that
      -- much after its slot, from the burst left (so that the starts that
      -- follow are not held back), plus the started meters' tolerance
      local slack, tol = ONCE_SLACK_MAX, false
      tolerance = tolerance or num(ARGV[5])
      for s = 1, #scopes do
        local sc = scopes[s]
        local pol = sc.pol
        for i = 1, pol.nr do
          -- the burst left after the job, less two starts' worth: a small
          -- burst gets no slack (its starts that follow at once would wait)
          local inc = sc[3 * i - 2]
          local room = S + pol.off[i] - inc - max(sc[3 * i], S) - 2 * inc
          slack = min(slack, max(0, floor(room / 2)))
          local t = min(tolerance, floor(pol.unit[i] / 4))
          tol = tol and min(tol, t) or t
        end
      end
      if not tol then
        E.slack, E.late = 0, -1
      elseif slack >= SLACK_MIN then
        -- charged as if it started as late as it may: a start before
        -- its charge is within the meters, one after it would not be
        E.slack, E.late = slack + tol, slack + tol
      else
        -- near its limits: no slack to charge. A job promoted from its
        -- line (up to the lead before its slot, so that its worker holds
        -- it there) whose started meters let it start at its slot is
        -- decided there still: its started meters are charged the
        -- tolerance after it, and it may start up to then, or as far as
        -- the meters have counted it past the slot (wait_late).
        -- Otherwise (and for a job that arrives, which
        -- reaches a worker after its slot) the gate decides when it
        -- starts, on the reservation it takes here.
        if E.arriving then
          E.slack, E.late = 0, -2
          return true, 0, S, 'promote', 0
        end
        for s = 1, #scopes do
          local sc = scopes[s]
          local pol = sc.pol
          for i = 1, pol.nr do
            local t = min(tolerance, floor(pol.unit[i] / 4))
            if max(sc[3 * i], S) + sc[3 * i - 2] - S - pol.off[i] - t > 0 then
              E.slack, E.late = 0, -2
              return true, 0, S, 'promote', 0
            end
          end
        end
        E.slack = tol
        E.late = max(tol, wait_late(scopes, S))
      end
      return true, 0, S, 'startat', 0
    end
    -- a reservation: the gate decides at its slot
    E.slack, E.late = 0, -2
    return true, 0, S, 'promote', 0
  end
  if S > now and E.once and E.wait and S - now <= E.wait and rule == 1 and not beyond and not has[4]
      and rates_only(scopes) then
    -- a job decided once that came late for its slot (TICKET), decided
    -- anew by a caller that waits (ONCE, WAIT): as a promotion decides it,
    -- at the slot its planned and started meters give, the started ones
    -- charged the tolerance after it. It starts there on the ticket, in
    -- step with the jobs promoted ahead of their slots; a reservation would
    -- charge its started meters only when it starts, after theirs, and be
    -- passed by them.
    local tol = started_tol(scopes)
    E.slack, E.wlate = tol, max(tol, wait_late(scopes, S))
    return true, 0, S, 'startat', 0
  end
  if S > now then
    retry = S - now
    horizon = horizon or num(ARGV[3])
    if E.reserve and not beyond and retry <= horizon then
      slot, write = S, 'reserve'
    elseif retry > horizon then
      retry = horizon
    end
  elseif E.plan then
    -- the slot is due now; take it without starting (shaping at enqueue)
    allowed, slot, write = true, now, 'reserve'
    rule, ridx, rscope = 0, 0, 0
  else
    -- due now: concurrency, then the started meters
    local cwait, crule = false, 0
    if E.hold and has[4] then
      conc_retry = conc_retry or num(ARGV[6])
      cwait, crule = conc_wait(scopes, conc_retry)
    end
    if cwait then
      retry = cwait
      rule, ridx, rscope = floor(crule / 65536), floor(crule / 256) % 256, crule % 256
    else
      local w = 0
      rule, ridx, rscope = 0, 0, 0
      for s = 1, #scopes do
        local sc = scopes[s]
        local pol = sc.pol
        local m = sc
        for i = 1, pol.nr do
          tolerance = tolerance or num(ARGV[5])
          local tol = min(tolerance, floor(pol.unit[i] / 4))
          local over = max(m[3 * i], now) + m[3 * i - 2] - now - pol.off[i] - tol
          if over > w then
            w, rule, ridx, rscope = over, 1, i, s
          end
        end
        if pol.wlim > 0 then
          if sc.st then window_entries(sc, true) end
          if sc.wea >= 0 and sc.wea + pol.wdur - now > w then
            w, rule, ridx, rscope = sc.wea + pol.wdur - now, 2, 0, s
          end
        end
      end
      if w > 0 and E.wait and rule == 1 and w <= E.wait then
        -- a few moments early for a rate's started meter, and the caller
        -- waits: allowed at its time, charged the started meters'
        -- tolerance after it (its wake may be that late), and it may
        -- start up to then or as far as the meters counted it (WAIT)
        local tol = started_tol(scopes)
        allowed, write, slot, E.slack = true, 'startat', now + w, tol
        E.wlate = max(tol, wait_late(scopes, slot))
        rule, ridx, rscope = 0, 0, 0
      elseif w > 0 then
        -- a few moments early for the started meter: keep the place in line
        retry = w
        if E.reserve and not E.dry then
          slot, write = now, 'reserve'
        end
      else
        allowed, write = true, 'start'
      end
    end
  end
  return allowed, retry, slot, write, rule * 65536 + ridx * 256 + rscope
end

-- the meters and counts of a local scope into h (fields to HSET), and the
-- time its state needs to live without running jobs
local function meters_state(sc, h)
  local pol, m, need = sc.pol, sc, now
  for i = 1, pol.nr do
    local P, A = m[3 * i - 1], m[3 * i]
    local f = pol.fields
    h[#h + 1] = f[3 * i - 2]; h[#h + 1] = fmt(P)
    if A ~= P then
      h[#h + 1] = f[3 * i - 1]; h[#h + 1] = fmt(A)
    elseif sc.astored and sc.astored[i] then
      sc.hdel = sc.hdel or {}
      sc.hdel[#sc.hdel + 1] = f[3 * i - 1]
    end
    if sc.inew and sc.inew[i] then
      h[#h + 1] = f[3 * i]; h[#h + 1] = ARGV[pol.uarg[i]]
    end
    need = max(need, P, A)
  end
  if pol.qlim > 0 then
    h[#h + 1] = 'qa'; h[#h + 1] = fmt(sc.qa)
    h[#h + 1] = 'qc'; h[#h + 1] = fmt(sc.qc)
    h[#h + 1] = 'qb'; h[#h + 1] = fmt(sc.qb)
    h[#h + 1] = 'qd'; h[#h + 1] = fmt(sc.qd)
    local b = pol.bounds
    for j = 1, #b - 1 do
      if (b[j] == sc.qa and sc.qc > 0) or (b[j] == sc.qb and sc.qd > 0) then
        need = max(need, b[j + 1])
      end
    end
  end
  return need
end

-- Write the decision into every local scope: at t the planned meters of a
-- scope without a reservation, and the job's reservation ('reserve',
-- 'promote') or the start (the started meters: now for 'start', at t for
-- 'startat', a job decided once that starts at its slot t); the job's
-- concurrency slot ('start', 'startat', 'promote'); then persist.
-- Expiry only ever grows and only reclaims memory, but for y, the expiry
-- the state needs once no job runs (release.lua shortens the hash's life to
-- it when the last slot goes).
local function apply(scopes, write, t, noexpire)
  for s = 1, #scopes do
    local sc = scopes[s]
    if sc.st then
      local pol, m = sc.pol, sc
      -- the fields to write, built at the size most writes need
      local h = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
        nil, nil, nil, nil, nil, nil, nil, nil }
      local need = now
      if not sc.R then
        for i = 1, pol.nr do
          m[3 * i - 1] = max(m[3 * i - 1], t) + m[3 * i - 2]
        end
        if pol.wlim > 0 then
          sc.wpf, sc.wpl = add_entries(sc, sc.wp, t)
          need = t + pol.wdur
          if not noexpire then extend_to(sc.wp, t + pol.wdur) end
        end
        if pol.qlim > 0 then
          local start = pol.bounds[win_index(pol.bounds, t)]
          sc.qstart = start
          if sc.qa == start then sc.qc = sc.qc + E.cost
          elseif sc.qb == start then sc.qd = sc.qd + E.cost
          -- take the slot holding the older (ended) window, or an empty one
          elseif sc.qa == 0 or (sc.qb ~= 0 and sc.qa < sc.qb) then sc.qa, sc.qc = start, E.cost
          else sc.qb, sc.qd = start, E.cost end
        end
        sc.planned = true
      end
      if write == 'reserve' or write == 'promote' then
        if pol.reservable then
          if not sc.Rraw then sc.rn = sc.rn + 1 end
          sc.rtop = t
          h[1] = E.rkey; h[2] = fmt(t)
          grace = grace or num(ARGV[4])
          need = max(need, t + grace)
        end
      else
        local at = write == 'startat' and t + E.slack or now
        if pol.reservable or pol.clim > 0 then
          -- counted for sluice top (once: a job decided anew, TICKET, was
          -- counted by its first decision); kept a few seconds past
          -- recovery
          if not E.ticket then sc.starts = sc.starts + 1 end
          h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts)
          need = max(need, now + 5000000)
        end
        local a1 = m[3]
        for i = 1, pol.nr do
          m[3 * i] = max(m[3 * i], at) + m[3 * i - 2]
        end
        if write == 'startat' and E.once and pol.nr > 0 then
          -- what the charge put past the slot on the first started meter
          -- where no start was (a ticket's leeway): the next job decided
          -- once is placed without it while that meter stays as it is
          -- here (decide)
          -- (less the leeway of the ticket before, still on the meter)
          local real = (sc.om and sc.om == a1) and a1 - sc.oz or a1
          local z = max(a1, at) - max(real, t)
          if z > 0 then
            sc.om, sc.oz = m[3], z
            h[#h + 1] = 'om'; h[#h + 1] = fmt(m[3])
            h[#h + 1] = 'oz'; h[#h + 1] = fmt(z)
          end
        end
        if pol.wlim > 0 then
          sc.waf, sc.wal = add_entries(sc, sc.wa, at)
          call('ZREMRANGEBYSCORE', sc.wa, '-inf', fmt(now - pol.wdur))
          need = max(need, at + pol.wdur)
          if not noexpire then extend_to(sc.wa, at + pol.wdur) end
        end
        if sc.Rraw then
          sc.dropR = true
          sc.hdel = sc.hdel or {}
          sc.hdel[#sc.hdel + 1] = E.rkey
          sc.rn = max(sc.rn - 1, 0)
        end
        sc.started = true
      end
      if sc.rn > 0 or sc.dropR then
        if sc.starts % 64 == 0 and sc.rn > 0 and write == 'start' then
          -- forget, a few at a time, reservations of jobs that never came back
          -- (rc, the sweep's cursor, is read only here)
          local res = call('HSCAN', sc.st, call('HGET', sc.st, 'rc') or '0', 'MATCH', 'r:*', 'COUNT', '64')
          h[#h + 1] = 'rc'; h[#h + 1] = res[1]
          local stale = {}
          local kv = res[2]
          for i = 1, #kv, 2 do
            grace = grace or num(ARGV[4])
            if num(kv[i + 1]) + grace <= now and kv[i] ~= E.rkey then
              stale[#stale + 1] = kv[i]
            end
          end
          if #stale > 0 then
            sc.rn = max(sc.rn - call('HDEL', sc.st, unpack(stale)), 0)
          end
        end
        h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
      end
      need = max(need, meters_state(sc, h))
      if pol.wlim > 0 then
        h[#h + 1] = 'n'; h[#h + 1] = fmt(sc.n or now)
        call('ZREMRANGEBYSCORE', sc.wp, '-inf', fmt(now - pol.wdur))
      end
      local held = 0
      if pol.clim > 0 then
        if write ~= 'reserve' and E.hold then
          -- take the job's slot: after a listing the stale slots go and hc
          -- counts the live; hm stays a lower bound of the earliest lease end
          local e = now + pol.lease
          local hc = sc.stale and sc.live or sc.hc
          if sc.mine then sc.kept = true else hc = hc + 1; sc.took = true end
          local hm
          if sc.stale then
            hm = min(sc.soonest or e, e)
          elseif sc.hc == 0 then
            hm = e
          else
            hm = min(sc.hm, e)
          end
          local es = fmt(e)
          h[#h + 1] = E.hkey; h[#h + 1] = slot_text(es, E.claim)
          -- a slot kept changes neither the count (unless a listing
          -- recounted it) nor, most often, the bound
          if sc.took or sc.stale then
            h[#h + 1] = 'hc'; h[#h + 1] = fmt(hc)
          end
          if hm ~= sc.hm or sc.stale then
            h[#h + 1] = 'hm'; h[#h + 1] = hm == e and es or fmt(hm)
          end
          if sc.stale and #sc.stale > 0 then
            sc.hdel = sc.hdel or {}
            for i = 1, #sc.stale do sc.hdel[#sc.hdel + 1] = sc.stale[i] end
          end
          sc.hc, sc.hm, sc.live, held = hc, hm, sc.live + (sc.mine and 0 or 1), e
        end
        if need + 1000000 > sc.y then
          -- like x below, moved a second further than needed: a busy scope
          -- writes it about once a second
          sc.y = need + 2000000
          h[#h + 1] = 'y'; h[#h + 1] = fmt(sc.y)
        end
      end
      if sc.hdel and #sc.hdel > 0 then
        for i = 1, #sc.hdel, 1000 do call('HDEL', sc.st, unpack(sc.hdel, i, min(i + 999, #sc.hdel))) end
      end
      -- the hash's expiry is moved a second past what is needed, so that a
      -- busy scope calls PEXPIRE about once a second, not every time
      local until_ = max(need, held)
      if until_ > sc.x and not noexpire then
        h[#h + 1] = 'x'; h[#h + 1] = fmt(until_ + 1000000)
        call('HSET', sc.st, unpack(h))
        extend_to(sc.st, until_ + 1000000)
      elseif #h > 0 then
        call('HSET', sc.st, unpack(h))
      end
    end
  end
end
-- @end phases
