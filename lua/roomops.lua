-- roomops.lua: the waiting room's ops of admit.lua (arrive, promote,
-- release; docs/architecture.md). A job its tenant cannot start now waits
-- in the tenant's line of its queue, charged nothing, and is promoted (its
-- slot taken, its concurrency slot held) when it may start; a release
-- hands its slot to the line's head.

-- @begin roomops
-- The waiting room's ops (arrive, promote, release), made only when an op
-- asks for them. bases are the op's local scopes, the tenant's first: each
-- {pol, k}.
local function room_functions(ts)
  if E.room then return E.room end
  E.room = {}
  -- @include release_slot (the release of one scope's slot, from release.lua)
  -- a local scope read afresh for a job of cost c
  local function scope_at(base, c)
    local pol = base.pol
    local sc = scope(pol, c)
    read_state(sc, base.k, true)
    return sc
  end
  -- a line entry: LINED_MS, COST (empty: 1; "/KEY" after it for a job
  -- with a key below its tenant), QUEUE (empty: default), ID, separated by
  -- the byte 31
  local SEP = string.char(31)
  local function parse(m)
    local a1 = m:find(SEP, 1, true)
    local a2 = m:find(SEP, a1 + 1, true)
    local a3 = m:find(SEP, a2 + 1, true)
    local c, key = m:sub(a1 + 1, a2 - 1), false
    local sl = c:find('/', 1, true)
    if sl then c, key = c:sub(1, sl - 1), c:sub(sl + 1) end
    return num(m:sub(1, a1 - 1)), num(c) or 1, m:sub(a3 + 1), key
  end

  -- the scope of a job's key, read afresh (false when its policy has no
  -- rules): keyed holds the policies of the tenant's keys and their keys'
  -- base (the key's own policy, else the one of keys without their own)
  local function key_scope(keyed, key, c)
    local pol = keyed.own[key] or keyed.def
    if not pol or pol.nr + pol.wlim + pol.qlim + pol.clim == 0 then return false end
    local b = keyed.base .. key .. ':'
    local sc = scope(pol, c)
    read_state(sc, { b .. 's', b .. 'w', b .. 'a' }, true)
    return sc
  end

  -- The hand-over in the turn's run (where the queue engine's keys and the
  -- room's share a server): the engine's keys of the queue, read from the
  -- op's last arguments: its key prefix ("": none, the caller hands the
  -- jobs over with handover.lua), the decision's header name, the
  -- policies' fingerprint and the lease (µs). A job's task is looked up before the job is
  -- decided: a task gone (deleted, ended, archived or in a group) takes
  -- its job out of the line charged nothing; a parked or deferred one
  -- moves to the pending list with its decision, as handover.lua moves it.
  E.room.engine = function()
    local prefix = ARGV[E.a]
    E.a = E.a + 1
    if prefix == '' then return false end
    local h = { prefix = prefix, pending = prefix .. 'pending', since = fmt(now) .. '000',
      header = ARGV[E.a], fp = ARGV[E.a + 1], lease = num(ARGV[E.a + 2]), state = false }
    E.a = E.a + 3
    return h
  end
  local char = string.char
  -- @include varint
  -- @include move_task
  -- the task's state (handover.lua's task_state), kept for over(): 0 it
  -- is gone, 1 to move, 2 pending or running already
  local function hand_state(eng, jid)
    local st, set = task_state(eng.prefix .. 't:' .. jid)
    if st == 3 then st = 0 end
    eng.state, eng.set = st, set
    return st
  end
  -- the task of job jid, decided for slot (late, slack: the decision's,
  -- claim its concurrency slots'), moves to the pending list; a decision
  -- made once travels as its ticket (throttle/ticket.go: version, slot,
  -- late, slack, lease end, claim, fingerprint), a reservation too (late
  -- -2: the gate decides at its slot)
  local function over(eng, jid, slot, late, slack, claim)
    if eng.state ~= 1 then return eng.state end
    local t = ''
    if E.once or late == -2 then
      local lend = 0
      if late == -2 or eng.lease <= 0 or claim == 0 then
        claim = 0
      else
        lend = now + eng.lease
      end
      t = '1:' .. fmt(slot) .. ':' .. fmt(late) .. ':' .. fmt(slack) .. ':' .. fmt(lend) .. ':' .. fmt(claim) .. ':' .. eng.fp
    end
    move_task(eng.prefix .. 't:' .. jid, eng.prefix, eng.set, eng.pending, jid, eng.since, eng.header, t)
    return 1
  end

  -- does the job hold a live concurrency slot in one of the scopes (it is
  -- running, or handed to asynq already)?
  local function running(scopes)
    for s = 1, #scopes do
      local sc = scopes[s]
      if sc.pol.clim > 0 and sc.hend and sc.hend > now then return true end
    end
    return false
  end

  -- Promote from the line's head while the job may start (its slot due
  -- within the lead, a concurrency slot free), the tenant's deficit covers
  -- its cost and the budget lasts: each takes its slot and its concurrency
  -- slot and moves to the handing set. A job that holds a live slot
  -- already (it runs, brought by asynq's fallback) leaves the line and is
  -- counted, whatever it costs. The deficit (deficit round robin) counts
  -- cost where a rule of the tenant's scopes counts it (rate, window,
  -- quota: a job's cost is bounded by them), and each job as one where
  -- none does (concurrency only, or no rule: a cost is unbounded there);
  -- it carries over while the head's cost exceeds it, so a costly head is
  -- served within cost / quantum turns, and a head its rules hold back
  -- keeps what it is owed (up to its cost). Returns the promoted jobs,
  -- the handovers to retry, when the tenant is next due (-1: never), how
  -- many wait, when the head was lined (ms; -1: none) and how many
  -- entries were skipped. lines are the line's lists, highest priority
  -- first: the head is the first entry of the first list that has one,
  -- so a turn takes its tenant's jobs of high priority first.
  --
  -- A job with a key below its tenant is decided in its key's scope too
  -- (keyed: the policies of the tenant's keys; false when none has one).
  -- A job its key holds back while its tenant would let it start does not
  -- hold back the tenant's other keys: it goes to the end of its level's
  -- list, and so do the jobs of the same key after it this turn (a key's
  -- jobs keep their order), at most MAX_ROTATE per turn; a line whose
  -- jobs left all wait for their keys is due when the first key allows.
  local MAX_ROTATE = 100
  E.room.promote = function(bases, lines, handing, qset, queue, budget, quantum, repair, noexpire, base_claim, keyed, eng)
    local st = KEYS[bases[1].k + 1]
    local out, retries = {}, {}
    -- handovers not confirmed in time are handed over again (and held a
    -- while, so that one pump does it)
    local stale = call('ZRANGEBYSCORE', handing, '-inf', fmt(now - repair), 'LIMIT', '0', '100')
    for i = 1, #stale do
      retries[i] = stale[i]
      call('ZADD', handing, 'XX', fmt(now), stale[i])
    end
    -- a tenant whose scopes (and keys) have no rules is charged nothing:
    -- its jobs leave the line in turn, unless it cools down
    local plain, costed = not keyed, false
    for s = 1, #bases do
      local pol = bases[s].pol
      if pol.nr + pol.wlim + pol.qlim + pol.clim > 0 then plain = false end
      if pol.nr + pol.wlim + pol.qlim > 0 then costed = true end
    end
    local dfield = 'd:' .. queue
    local v = call('HMGET', st, dfield, 'cd')
    -- a negative deficit is a turn the budget (the fleet's room) cut
    -- short: it goes on with what is left, without a new quantum
    local dq0 = num(v[1]) or 0
    local resumed = dq0 < 0
    if resumed then dq0 = -dq0 end
    local dq = resumed and dq0 or dq0 + quantum
    local midturn = false
    local due, head = -1, -1
    local np, skipped, gone = 0, 0, 0
    local cd = plain and num(v[2]) or 0
    if cd > now + E.lead then
      budget = 0
      due = cd - E.lead
    end
    -- The line's head is read a few entries at a time (buf, of level
    -- blv, its next at bi; want the size of the next read), the entries
    -- taken from it are popped together (popped) and the promoted ones
    -- join the handing set together (hand): a job costs its state's read
    -- and write, not five commands more. Pops are flushed before anything
    -- else reads or changes the list.
    local buf, bi, blv, popped, hand, want = false, 1, 0, 0, {}, 1
    local function flush()
      if popped > 0 then
        call('LPOP', lines[blv], popped)
        popped = 0
      end
    end
    -- (a read takes one entry, then twice as many as the last, at most
    -- what the budget leaves: a turn its rules cut short after a job or
    -- two reads no more than it did one entry at a time)
    local function head_of(l)
      if not buf or blv ~= l or bi > #buf then
        flush()
        local n = max(min(want, budget - np + 1, 32), 1)
        buf, bi, blv, want = call('LRANGE', lines[l], '0', fmt(n - 1)), 1, l, 2 * n
      end
      return buf[bi] or false
    end
    local function pop()
      bi, popped = bi + 1, popped + 1
    end
    local function handed(m)
      hand[#hand + 1] = fmt(now)
      hand[#hand + 1] = m
      if #hand >= 512 then
        call('ZADD', handing, unpack(hand))
        hand = {}
      end
    end
    -- the jobs sent to the end of their lists this turn, per level, and
    -- their keys (the first allows one at kwait at the soonest)
    local rot, nrot, waits, kwait = {}, 0, {}, false
    local function rotate(line, m, lv, key, at)
      flush()
      buf = false
      call('LPOP', line)
      call('RPUSH', line, m)
      rot[lv] = (rot[lv] or 0) + 1
      nrot = nrot + 1
      waits[key] = true
      if at and (not kwait or at < kwait) then kwait = at end
      return nrot >= MAX_ROTATE
    end
    local lv = 1
    while true do
      local m = false
      while lv <= #lines do
        -- a level whose jobs left were all sent to its end is done
        if rot[lv] then flush() end
        if not (rot[lv] and rot[lv] >= call('LLEN', lines[lv])) then
          m = head_of(lv)
          if m then break end
        end
        lv = lv + 1
      end
      local line = lines[lv]
      if not m then
        if nrot > 0 then
          -- the jobs left wait for their keys
          if kwait and (due < 0 or kwait < due) then due = kwait end
          if due < 0 then due = now end
          dq = min(dq, quantum)
        else
          dq = 0
          call('SREM', qset, queue)
        end
        break
      end
      local lined, c, jid, key = parse(m)
      local rc = costed and c or 1
      head = lined
      local scopes, run, ksc = false, false, false
      local behind = key and keyed and waits[key]
      if not behind and np < budget and not plain then
        E.id, E.cost, E.claim = jid, c, fmt(base_claim + np)
        E.rkey, E.hkey = 'r:' .. jid, 'h:' .. jid
        E.reserve, E.hold, E.dry, E.plan, E.not_before, E.promote = true, true, false, false, 0, true
        scopes = {}
        for s = 1, #bases do scopes[s] = scope_at(bases[s], c) end
        ksc = key and keyed and key_scope(keyed, key, c)
        if ksc then scopes[#scopes + 1] = ksc end
        run = running(scopes)
      end
      if behind then
        -- its key held back a job of it before it this turn: it stays
        -- behind that job
        if rotate(line, m, lv, key, false) then
          if due < 0 then due = now end
          break
        end
      elseif not run and (np >= budget or rc > dq) then
        -- the deficit carries over only what a costly head is owed, or
        -- the rest of a turn the budget cut short
        if np >= budget and rc <= dq and not run then
          midturn = true
        elseif np >= budget then
          dq = min(dq, quantum)
        end
        if due < 0 then due = now end
        break
      elseif not run and eng and hand_state(eng, jid) == 0 then
        -- its task is gone: it leaves the line, charged nothing
        pop()
        gone = gone + 1
        head = -1
      elseif plain then
        pop()
        local h = 0
        if eng then h = over(eng, jid, now, -1, 0, 0) else handed(m) end
        dq = dq - rc
        np = np + 1
        out[np] = { m, now, 0, {}, -1, 0, h }
        head = -1
      elseif run then
        pop()
        skipped = skipped + 1
        head = -1
      else
        local ok, wait, slot, write, rule = decide(scopes)
        local by_key = false
        if not ok and ksc and rule % 256 == #scopes then
          -- held back by its key: would its tenant let it start?
          local bs = {}
          for s = 1, #bases do bs[s] = scope_at(bases[s], c) end
          by_key = decide(bs)
        end
        if by_key then
          if rotate(line, m, lv, key, now + wait) then
            if due < 0 then due = now end
            break
          end
        elseif not ok then
          -- held back by its own limits: it keeps what it is owed
          due, dq = now + wait, min(dq, rc)
          break
        else
          -- (a job handed over in this run is never taken back: no undo
          -- records)
          if not eng then
            for s = 1, #scopes do ts.remember(scopes[s]) end
          end
          apply(scopes, write, slot, noexpire)
          local recs = {}
          if not eng then
            for s = 1, #scopes do recs[s] = ts.record(scopes[s]) end
          end
          pop()
          local h = 0
          if eng then h = over(eng, jid, slot, E.late, E.slack, num(E.claim)) else handed(m) end
          dq = dq - rc
          np = np + 1
          out[np] = { m, slot, num(E.claim), recs, E.late, E.slack, h }
          head = -1
        end
      end
    end
    E.promote = false
    flush()
    if #hand > 0 then call('ZADD', handing, unpack(hand)) end
    -- a handover not confirmed yet keeps the tenant due for its retry
    local first = call('ZRANGE', handing, '0', '0', 'WITHSCORES')
    if first[2] then
      local r = num(first[2]) + repair
      if due < 0 or r < due then due = r end
    end
    if dq > 0 then
      call('HSET', st, dfield, fmt(midturn and -dq or dq))
    elseif dq0 > 0 then
      call('HDEL', st, dfield)
    end
    -- jobs left waiting for their keys: a job that joins the line makes
    -- the tenant due at once (line.lua), rather than when a key allows
    if nrot > 0 then
      call('HSET', st, 'kw:' .. queue, '1')
      -- a hash this made (a tenant without state of its own) does not
      -- outlive its line for long
      if not noexpire then call('PEXPIRE', st, '3600000', 'NX') end
    elseif keyed then
      call('HDEL', st, 'kw:' .. queue)
    end
    local waiting = 0
    for i = 1, #lines do waiting = waiting + call('LLEN', lines[i]) end
    return out, retries, due, waiting, head, skipped, midturn and 1 or 0, gone
  end

  -- A new job, not yet in asynq: may it go straight to asynq's pending
  -- list? Only when the tenant's line is empty, the fleet has room
  -- (may_go) and the job may start within the lead; then it takes its slot
  -- and its concurrency slot now (lines are the line's lists, one per
  -- priority level: it is empty when all are). Returns the verdict (1 straight, 0 it
  -- waits, -1 the line is at its cap), the slot, how many wait and, for a
  -- job sent straight, its undo records.
  E.room.arrive = function(scopes, lines, may_go, cap)
    local waiting = 0
    for i = 1, #lines do waiting = waiting + call('LLEN', lines[i]) end
    if cap > 0 and waiting >= cap then
      return -1, 0, waiting, {}, -1, 0
    end
    if waiting > 0 or not may_go then
      return 0, 0, waiting, {}, -1, 0
    end
    E.promote = true
    local ok, _, slot, write = decide(scopes)
    E.promote = false
    if not ok then
      return 0, 0, waiting, {}, -1, 0
    end
    if running(scopes) then
      -- the same job admitted already: it is not sent again
      return 0, 0, waiting, {}, -1, 0
    end
    local plain = true
    for s = 1, #scopes do
      local pol = scopes[s].pol
      if pol.nr + pol.wlim + pol.qlim + pol.clim > 0 then plain = false end
    end
    if plain then
      return 1, now, 0, {}, -1, 0
    end
    for s = 1, #scopes do ts.remember(scopes[s]) end
    apply(scopes, write, slot, false)
    local recs = {}
    for s = 1, #scopes do recs[s] = ts.record(scopes[s]) end
    return 1, slot, 0, recs, E.late, E.slack
  end

  -- Give back the job's concurrency slots under its claim (0: whichever
  -- admission holds them); the hash of a scope whose last slot goes lives
  -- only as long as the rest of its state needs (y).
  E.room.release = function(bases, noexpire)
    local released, lost = 0, 0
    for s = 1, #bases do
      if bases[s].pol.clim > 0 then
        local r = release_slot(KEYS[bases[s].k + 1], E.hkey, E.claim, noexpire)
        if r > 0 then released = released + 1 elseif r < 0 then lost = lost + 1 end
      end
    end
    return released, lost
  end
  return E.room
end
-- @end roomops
