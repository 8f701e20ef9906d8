-- proto.lua: what the scripts that write asynq's task messages share (they
-- are protobuf: internal/asynqroom pins the layout), put into them by
-- lua.go; it is not a script of its own.

-- @begin varint
-- a protobuf varint; the including script defines char and floor
local function varint(n)
  local out = ''
  while n >= 128 do
    out = out .. char(n % 128 + 128)
    n = floor(n / 128)
  end
  return out .. char(n)
end
-- @end varint
