-- slot.lua: how a concurrency slot is kept, put into every script that
-- reads slots by lua.go (it is not a script of its own).

-- @begin slot
-- A running job's slot is one field of its scope's hash, h:<job>, holding
-- its lease end (µs) and the claim token of the admission holding it as
-- LEASE.CLAIM: one field, not two, because every field of the hash costs
-- every read and write of it; and a number's text, so that a sluice from
-- before claims shared the field still reads the lease end from it. A
-- slot such a sluice wrote holds the lease end alone (its claim in a field
-- c:<job> beside it): it counts until its lease ends, and no claim holds it.
local function slot_lease(v)
  local i = v:find('.', 1, true)
  return tonumber(i and v:sub(1, i - 1) or v)
end

-- the claim token holding slot v, as a number (false: none)
local function slot_claim(v)
  local i = v:find('.', 1, true)
  return i and tonumber(v:sub(i + 1)) or false
end

-- a slot's text from its lease end and claim token, both as text (claim
-- false: none, as an older sluice's slot)
local function slot_text(lease, claim)
  return claim and lease .. '.' .. claim or lease
end

-- is slot v held under claim (its token as text)? Compared as text, as
-- the scripts write tokens.
local function held_by(v, claim)
  return v:sub(-#claim - 1) == '.' .. claim
end
-- @end slot
