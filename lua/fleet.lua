-- fleet.lua: the registry of a fleet's worker processes, which lets one of
-- them give the asynq tasks of a dead one back at once (worker/recover.go,
-- throttle/fleet.go). A process beats every lease/3; a process whose lease
-- ran out without a beat is taken for dead. One process at a time, the
-- holder of the recoverer's lock, looks for them. Times are Redis TIME, ms.
--
-- KEYS[1] -> PREFIX:{r}:fleet (zset: process -> the end of its lease, ms)
-- KEYS[2] -> PREFIX:{r}:recover (string: the process holding the
--   recoverer's lock)
-- KEYS[3] -> PREFIX:{r}:w:PROCESS (hash: task id -> queue, the jobs the
--   process runs) of the calling process (beat, leave) or of the lapsed
--   process (drop); not used by check
-- KEYS[4] -> PREFIX:{r}:queues (set: the queues the fleet serves), beat only
-- KEYS[5] -> PREFIX:{r}:admin (hash: process -> the HOST:PORT of its admin
--   endpoints, for sluice dashboard), beat, drop and leave
-- ARGV[1] -> the op: beat | check | drop | leave
-- ARGV[2] -> the calling process
-- beat: ARGV[3] the lease (ms), ARGV[4] the lock's life (ms), ARGV[5] how
--   long the job hash outlives the last beat (ms), ARGV[6] the address of
--   its admin endpoints ("" for none), ARGV[7..] the queues the process
--   serves. The process's lease ends a lease from now; it takes the lock if
--   nobody holds it.
--   Returns {rejoined, leader}: rejoined 1 when the process was not
--   registered (its first beat, or it had been taken for dead), leader 1
--   when it holds the lock.
-- check: ARGV[3] the lock's life (ms), ARGV[4] the most lapsed processes to
--   return. Returns {} when the caller does not hold the lock; else it
--   extends the lock and returns {1, process, ...}: the processes whose
--   lease ended, earliest first.
-- drop: ARGV[3] a lapsed process, whose job hash is KEYS[3]. Forgets it,
--   if the caller holds the lock and the process's lease is still over.
--   Returns 1 when forgotten, 0 otherwise.
-- leave: forgets the calling process (a graceful shutdown) and gives the
--   lock back if it holds it. Returns 1.

local call, tonumber = redis.call, tonumber
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, me = ARGV[1], ARGV[2]

if op == 'beat' then
  local rejoined = call('ZADD', KEYS[1], now + tonumber(ARGV[3]), me)
  call('PEXPIRE', KEYS[3], tonumber(ARGV[5]))
  if ARGV[6] ~= '' then
    call('HSET', KEYS[5], me, ARGV[6])
  else
    call('HDEL', KEYS[5], me)
  end
  for i = 7, #ARGV do
    call('SADD', KEYS[4], ARGV[i])
  end
  local leader = 0
  if call('SET', KEYS[2], me, 'NX', 'PX', tonumber(ARGV[4])) then
    leader = 1
  elseif call('GET', KEYS[2]) == me then
    leader = 1
  end
  return {rejoined, leader}
elseif op == 'check' then
  if call('GET', KEYS[2]) ~= me then
    return {}
  end
  call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  local out = {1}
  local lapsed = call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[4]))
  for i = 1, #lapsed do
    out[i + 1] = lapsed[i]
  end
  return out
elseif op == 'drop' then
  if call('GET', KEYS[2]) ~= me then
    return 0
  end
  local lease = call('ZSCORE', KEYS[1], ARGV[3])
  if lease and tonumber(lease) >= now then
    return 0
  end
  call('ZREM', KEYS[1], ARGV[3])
  call('DEL', KEYS[3])
  call('HDEL', KEYS[5], ARGV[3])
  return 1
elseif op == 'leave' then
  call('ZREM', KEYS[1], me)
  call('DEL', KEYS[3])
  call('HDEL', KEYS[5], me)
  if call('GET', KEYS[2]) == me then
    call('DEL', KEYS[2])
  end
  return 1
end
return redis.error_reply('fleet.lua: unknown op ' .. tostring(op))
