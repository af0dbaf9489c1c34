-- Grant a lock, optionally with a fencing token and FIFO fairness, atomically.
-- KEYS: 1 lock, 2 fence counter, 3 fair queue (list), 4 fair queue expiries (zset),
--       5 default-mode waiters by arrival (zset; only for a default-mode wait,
--         else any key: read only with ARGV[9]), 6 the lock-state record
--         (only with ARGV[12])
-- ARGV: 1 token, 2 ttl ms, 3 fence 0|1, 4 fair 0|1, 5 enqueue-if-busy 0|1,
--       6 waiter lease ms, 7 fair queue entry ("<ttl> <fence> <grant channel> <token>"),
--       8 on a server that evicts keys: the evicted_keys count its lock-state
--         record was checked at ('' elsewhere),
--       9 default mode: the waiter's id in KEYS[5] ('' = not a waiter),
--       10 its arrival (µs, server clock) from an earlier busy reply ('' = now),
--       11 '1': a grant also returns the server's clock (the client's
--          clock-step watch refuses a grant whose time shows a step),
--       12 the lock-state record's epoch id the client checked ('' = none)
-- Returns {1, fence or -1} when granted ({1, fence or -1, server time µs} with
-- ARGV[11]), {0, pttl of the holder} when busy
-- ({0, pttl, arrival} for a default-mode waiter), {-1, evicted_keys} when
-- keys were evicted since that check or the record is not the one checked.
--#include redis/scripts/server_time.lua
--#include lock/scripts/epoch_moved.lua
if ARGV[8] and ARGV[8] ~= '' then
  -- Redis evicts before it runs a command, never inside a script: a count
  -- equal to the checked one means no lock key vanished since the check
  -- (epoch.lua), so this grant cannot join a holder whose key was evicted.
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[8]) then return {-1, ev or -1} end
end
if epoch_moved(KEYS[6], ARGV[12]) then return {-1, -1} end
local token = ARGV[1]
local fair = ARGV[4] == '1'
local entry = ARGV[7]
local waiter = (not fair and KEYS[5] and ARGV[9]) or ''

-- The server's clock, read only where it is used (the fair queue's expiries,
-- the fence's floor): each redis.call is a good part of a grant's cost.
local now_ms, now_us
if fair or ARGV[3] == '1' then now_ms, now_us = server_time() end

if fair then
  -- A fair release may already have handed the lock to us (release.lua): the
  -- grant message was missed or is still on its way. Ours from now, for a
  -- full TTL; the fence counter still holds the fence issued with the grant,
  -- as nobody can have been granted after us.
  if redis.call('GET', KEYS[1]) == token then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('LREM', KEYS[3], 0, entry)
    redis.call('ZREM', KEYS[4], entry)
    local fence = -1
    if ARGV[3] == '1' then fence = tonumber(redis.call('GET', KEYS[2]) or '-1') end
    return {1, fence}
  end
  -- A waiter that stopped refreshing its place (crashed, gave up) must not
  -- block the queue: drop expired heads.
  while true do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head then break end
    local exp = redis.call('ZSCORE', KEYS[4], head)
    if exp and tonumber(exp) > now_ms then break end
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], head)
  end
end

local free
if fair then
  free = redis.call('EXISTS', KEYS[1]) == 0
  if free then
    local head = redis.call('LINDEX', KEYS[3], 0)
    if head and head ~= entry then free = false end
  end
  if free then
    redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
    if redis.call('LINDEX', KEYS[3], 0) == entry then redis.call('LPOP', KEYS[3]) end
    redis.call('ZREM', KEYS[4], entry)
  end
else
  -- Check and set in one call.
  free = redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) ~= false
  -- A default-mode waiter that won (woken, or its own timer) leaves the line.
  if free and waiter ~= '' then redis.call('ZREM', KEYS[5], waiter) end
end

if free then
  local fence = -1
  if ARGV[3] == '1' then
    --#include lock/scripts/fence_floor.lua
    fence = next_fence(fence_counter(KEYS[2]), now_us)
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  if ARGV[11] == '1' then
    if not now_us then now_ms, now_us = server_time() end
    return {1, fence, now_us}
  end
  return {1, fence}
end

if fair and ARGV[5] == '1' then
  local lease = tonumber(ARGV[6])
  if not redis.call('ZSCORE', KEYS[4], entry) then redis.call('RPUSH', KEYS[3], entry) end
  redis.call('ZADD', KEYS[4], now_ms + lease, entry)
  redis.call('PEXPIRE', KEYS[3], lease * 2)
  redis.call('PEXPIRE', KEYS[4], lease * 2)
end
if waiter ~= '' and ARGV[5] == '1' then
  -- In line by arrival, kept across attempts (NX): a woken waiter that lost
  -- the race to a newcomer is back at the front with its first arrival, so
  -- release.lua wakes it again next, not the newcomer.
  local arrival = ARGV[10]
  if not arrival or arrival == '' then
    if not now_us then now_ms, now_us = server_time() end
    arrival = string.format('%d', now_us)
  end
  redis.call('ZADD', KEYS[5], 'NX', arrival, waiter)
  redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[6]) * 2)
  return {0, redis.call('PTTL', KEYS[1]), arrival}
end
return {0, redis.call('PTTL', KEYS[1])}
