-- twostep.lua: the steps of a two-scope admission in admit.lua (Redis
-- Cluster, a tenant and @global in different slots; throttle/split.go
-- drives them): a local scope's snapshot, its undo record, and the undo.

-- @begin twostep
-- The steps of a two-scope admission: a local scope's snapshot (what a
-- remote scope is made of), its undo record, and the undo. Made only when
-- an op asks for them.
local function twostep_functions()
  if E.twostep then return E.twostep end
  E.twostep = {}
  E.twostep.snapshot = function(sc)
    local pol, m = sc.pol, sc
    local out = { sc.cd, sc.R or -1 }
    for i = 1, pol.nr do
      out[#out + 1] = m[3 * i - 1]; out[#out + 1] = m[3 * i]
    end
    if pol.wlim > 0 then
      window_entries(sc, true)
      out[#out + 1] = sc.wtop; out[#out + 1] = sc.we; out[#out + 1] = sc.wea
    end
    if pol.qlim > 0 then
      out[#out + 1] = sc.qa; out[#out + 1] = sc.qc; out[#out + 1] = sc.qb; out[#out + 1] = sc.qd
    end
    if pol.clim > 0 then
      local f = full(sc)
      out[#out + 1] = sc.live; out[#out + 1] = sc.mine and 1 or 0
      out[#out + 1] = (f and sc.soonest) or -1
    end
    E.twostep.remember(sc)
    return out
  end
  -- what an undo record compares against
  E.twostep.remember = function(sc)
    local b = { R = sc.Rraw or -1 }
    for i = 1, 3 * sc.pol.nr do b[i] = sc[i] end
    sc.before = b
  end
  E.twostep.record = function(sc)
    local pol, m, b = sc.pol, sc, sc.before
    local what = 0
    if sc.planned then what = what + 1 end
    if sc.started then what = what + 2 end
    if sc.took then what = what + 4 end
    if sc.kept then what = what + 8 end
    local rec = { what, num(E.claim), b.R, sc.rtop or (sc.dropR and -1) or b.R }
    for i = 1, pol.nr do
      rec[#rec + 1] = b[3 * i - 1]; rec[#rec + 1] = m[3 * i - 1]
      rec[#rec + 1] = b[3 * i]; rec[#rec + 1] = m[3 * i]
    end
    if pol.wlim > 0 then
      rec[#rec + 1] = sc.wpf or 0; rec[#rec + 1] = sc.wpl or -1
      rec[#rec + 1] = sc.waf or 0; rec[#rec + 1] = sc.wal or -1
    end
    if pol.qlim > 0 then rec[#rec + 1] = sc.qstart or 0 end
    if pol.clim > 0 then
      rec[#rec + 1] = sc.hend or -1; rec[#rec + 1] = sc.htok or -1
    end
    return rec
  end
  -- Take back what an earlier op wrote to a local scope: exactly, as long
  -- as nothing else changed the same fields since. A meter charged since
  -- on top of ours gives back the increment on the planned meter (it only
  -- plans: the started one decides) and keeps it on the started meter, at
  -- most one interval ahead, counted in u.
  E.twostep.undo = function(sc, noexpire)
    local pol, m = sc.pol, sc
    local what, token, Rb, Ra = next_int(), next_int(), next_int(), next_int()
    local planned, started = what % 2 == 1, floor(what / 2) % 2 == 1
    local h = {}
    local leftover = false
    for i = 1, pol.nr do
      local Pb, Pa, Ab, Aa = next_int(), next_int(), next_int(), next_int()
      local P, A = m[3 * i - 1], m[3 * i]
      if planned then
        if P == Pa then P = Pb else P = max(P - m[3 * i - 2], Pb) end
      end
      if started then
        if A == Aa then A = Ab else leftover = true end
      end
      m[3 * i - 1], m[3 * i] = P, A
    end
    if pol.wlim > 0 then
      for _, key in ipairs({ sc.wp, sc.wa }) do
        local from, to = next_int(), next_int()
        -- in pieces: Lua's unpack refuses about 8,000 values
        local z = {}
        for seq = from, to do
          z[#z + 1] = fmt(seq)
          if #z == 1000 or seq == to then
            call('ZREM', key, unpack(z))
            z = {}
          end
        end
      end
    end
    if pol.qlim > 0 then
      local start = next_int()
      if planned and start > 0 then
        if sc.qa == start then sc.qc = max(sc.qc - E.cost, 0) end
        if sc.qb == start then sc.qd = max(sc.qd - E.cost, 0) end
      end
    end
    if pol.clim > 0 then
      -- a slot this op took is given back, a slot it kept gets back its
      -- lease and claim, as long as the op's claim still holds it
      local hend, htok = next_int(), next_int()
      if sc.htok == token then
        if floor(what / 4) % 2 == 1 then
          sc.hdel = sc.hdel or {}
          sc.hdel[#sc.hdel + 1] = E.hkey
          h[#h + 1] = 'hc'; h[#h + 1] = fmt(max(sc.hc - 1, 0))
        elseif floor(what / 8) % 2 == 1 then
          h[#h + 1] = E.hkey; h[#h + 1] = slot_text(fmt(hend), fmt(htok))
        end
      end
    end
    meters_state(sc, h)
    if started and sc.starts > 0 then
      h[#h + 1] = 's'; h[#h + 1] = fmt(sc.starts - 1)
    end
    local r = sc.Rraw or -1
    if r == Ra and Ra ~= Rb then
      if Rb >= 0 then
        h[#h + 1] = E.rkey; h[#h + 1] = fmt(Rb)
        if Ra < 0 then sc.rn = sc.rn + 1 end
      else
        sc.hdel = sc.hdel or {}
        sc.hdel[#sc.hdel + 1] = E.rkey
        sc.rn = max(sc.rn - 1, 0)
      end
      h[#h + 1] = 'rn'; h[#h + 1] = fmt(sc.rn)
      -- a reservation put back keeps the hash alive through its grace
      grace = grace or num(ARGV[4])
      if Rb >= 0 and not noexpire then
        extend_to(sc.st, Rb + grace)
        if pol.clim > 0 then
          h[#h + 1] = 'y'; h[#h + 1] = fmt(max(sc.y, Rb + grace + 1000000))
        end
      end
    end
    if leftover then
      h[#h + 1] = 'u'; h[#h + 1] = fmt((num(call('HGET', sc.st, 'u')) or 0) + 1)
    end
    if sc.hdel and #sc.hdel > 0 then call('HDEL', sc.st, unpack(sc.hdel)) end
    if #h > 0 and call('EXISTS', sc.st) == 1 then call('HSET', sc.st, unpack(h)) end
  end
  return E.twostep
end
-- @end twostep
