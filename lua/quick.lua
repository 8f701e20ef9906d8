-- quick.lua: admit.lua's quick path, the commonest admission decided
-- with locals (see its comment below).

-- @begin quick
-- The quick path: the commonest admission, a job of cost 1 in one local
-- scope whose policy has at most one rate and a concurrency rule, allowed
-- at once (a job decided once that comes late for its slot included: its
-- charges are taken back first, TICKET). It reads the scope as read_state does (the same fields, in the
-- same order), makes decide's checks and apply's writes with locals (the
-- general engine's tables cost the decision about a third), and answers
-- as the general engine does. Anything else (a denial, a reservation, a
-- cooldown, an interval change, slots to list, a sweep due) is left to the
-- general engine before anything is written: quick then returns its read,
-- which read_state takes instead of reading again. TestQuickPath holds the
-- two to the same decisions and the same state.
local function quick(pol, st, flags, o)
  local id, nr, clim = E.id, pol.nr, pol.clim
  local v, hkey
  if clim > 0 then
    hkey = 'h:' .. id
    v = call('HMGET', st, 'cd', 's', 'x', 'rn', 'r:' .. id, hkey, unpack(pol.fields))
  else
    v = call('HMGET', st, 'cd', 's', 'x', 'rn', 'r:' .. id, unpack(pol.fields))
  end
  -- a reservation, a cooldown or a job not to start yet: decide
  if v[5] or (v[1] and num(v[1]) > now) or E.not_before > now then return v end
  local j = clim > 0 and 7 or 6
  local P, A, inc, off, astored, inew
  if nr == 1 then
    -- the meters, charged at the policy's interval (or new)
    inew = not v[j + 2]
    if not inew and v[j + 2] ~= ARGV[pol.uarg[1]] then return v end
    inc, off = pol.unit[1], pol.off[1]
    P, astored = num(v[j]) or 0, v[j + 1]
    A = astored and num(astored) or P
    if E.ticket then
      -- a job decided once that comes late (TICKET): its own charges at
      -- its slot are taken back where they are the last, as the general
      -- engine's read_state does
      if P == E.ticket + inc then
        P = E.ticket
      elseif P > E.ticket + inc then
        -- its planned charge stands behind others: it starts on it, as
        -- on a reservation (read_state)
        return v
      end
      if A == E.ticket + E.tslack + inc then A = E.ticket + E.tslack end
    end
    if P + inc - off > now then return v end
    tolerance = tolerance or num(ARGV[5])
    if max(A, now) + inc - now - off - min(tolerance, floor(inc / 4)) > 0 then return v end
    j = j + 3
  end
  -- the live slots, known without a listing (hc 0, or hm still ahead)
  local hold = flags % 4 >= 2
  local hc, hm, live, mine = 0, 0, 0, false
  if clim > 0 then
    hc = num(v[j]) or 0
    if hc > 0 then
      hm = num(v[j + 1]) or 0
      if hm <= now then return v end
      live, mine = hc, v[6] ~= false
    end
    if hold and not mine and live >= clim then return v end
  end
  local starts, rn = num(v[2]) or 0, num(v[4]) or 0
  -- a job decided anew (TICKET) was counted by its first decision
  local counted = E.ticket and starts or starts + 1
  if rn > 0 and counted % 64 == 0 then return v end
  -- allowed: the fields apply would write, in one HSET
  local h = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    nil, nil }
  local n, need = 0, now
  if nr == 1 then
    P, A = max(P, now) + inc, max(A, now) + inc
    h[1], h[2], n = 'p1', fmt(P), 2
    if A ~= P then
      h[3], h[4], n = 'a1', fmt(A), 4
    elseif astored then
      call('HDEL', st, 'a1')
    end
    if inew then h[n + 1], h[n + 2], n = 'i1', ARGV[pol.uarg[1]], n + 2 end
    need = max(P, A)
  end
  h[n + 1], h[n + 2], n = 's', fmt(counted), n + 2
  need = max(need, now + 5000000)
  if rn > 0 then h[n + 1], h[n + 2], n = 'rn', v[4], n + 2 end
  local held = 0
  if clim > 0 then
    if hold then
      held = now + pol.lease
      local es = fmt(held)
      h[n + 1], h[n + 2], n = hkey, slot_text(es, E.claim), n + 2
      if not mine then
        h[n + 1], h[n + 2], n = 'hc', fmt(hc + 1), n + 2
        live = live + 1
      end
      if hc == 0 or held < hm then h[n + 1], h[n + 2], n = 'hm', es, n + 2 end
    end
    if need + 1000000 > (num(v[j + 2]) or 0) then
      h[n + 1], h[n + 2], n = 'y', fmt(need + 2000000), n + 2
    end
  end
  local until_ = max(need, held)
  if until_ > (num(v[3]) or 0) and floor(flags / 16) % 2 == 0 then
    h[n + 1], h[n + 2] = 'x', fmt(until_ + 1000000)
    call('HSET', st, unpack(h))
    extend_to(st, until_ + 1000000)
  else
    call('HSET', st, unpack(h))
  end
  -- what is left, as the general engine reports it
  local remaining, reset, inflight = -1, -1, -1
  if nr == 1 then
    remaining, reset = max(floor((now + off - P) / inc), 0), P - now
  end
  if clim > 0 then
    local left = max(clim - live, 0)
    if remaining < 0 or left < remaining then remaining = left end
    inflight = live
  end
  out[o] = format('%d %d %d', remaining, reset, inflight)
  return false
end
-- @end quick
