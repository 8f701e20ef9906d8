-- rate.lua: the rate rule kind's helpers of admit.lua (a leaky bucket
-- kept as two GCRA meters per rate: planned starts and started ones). The
-- meters' state and arithmetic are the phases' own (phases.lua), since
-- every decision reads them; here is what a decision asks of the rates
-- when a job is decided for a slot ahead of it.

-- @begin rate
-- how long after its slot t a job allowed at t (WAIT, or promoted near
-- its limits) may still start on the decision: a started meter charges a
-- start at its own time when that is after t (a meter kept at its rate
-- runs ahead of the starts it allows by its burst), and every start up to
-- then keeps the actual starts behind the meter, so they conform as the
-- meter's do. The least over the job's meters, at most SLACK_MAX; 0 with
-- a window or quota rule, which count the start at t.
local function wait_late(scopes, t)
  local late = SLACK_MAX
  for s = 1, #scopes do
    local sc = scopes[s]
    local pol = sc.pol
    if pol.wlim > 0 or pol.qlim > 0 then return 0 end
    for i = 1, pol.nr do
      late = min(late, max(sc[3 * i], t) - t)
    end
  end
  return late
end

-- the started meters' tolerance over the scopes' rates: the least of the
-- tolerance and a quarter of each rate's interval
local function started_tol(scopes)
  tolerance = tolerance or num(ARGV[5])
  local tol = tolerance
  for s = 1, #scopes do
    local pol = scopes[s].pol
    for i = 1, pol.nr do tol = min(tol, floor(pol.unit[i] / 4)) end
  end
  return tol
end

-- whether the scopes have rates only (no window, quota or concurrency
-- rule) and hold no reservation of the job's
local function rates_only(scopes)
  for s = 1, #scopes do
    local sc = scopes[s]
    local pol = sc.pol
    if sc.R or pol.wlim > 0 or pol.qlim > 0 or pol.clim > 0 or pol.nr == 0 then return false end
  end
  return true
end

-- @end rate
