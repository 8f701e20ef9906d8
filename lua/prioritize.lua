-- prioritize.lua: moves a waiting job to another priority level of its
-- tenant's line, to the end of that level's jobs.
--
-- KEYS[1] -> the list of the line that holds the job now
-- KEYS[2] -> the list of the level it moves to
-- ARGV[1] -> the job's line entry, as read from KEYS[1]
-- Returns: 1 when the job moved, 0 when the entry was not in KEYS[1] any
--   more (it left the line meanwhile: nothing changed)

if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
