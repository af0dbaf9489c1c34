-- Grant every lock of a set or none, atomically: the all-or-none lock's one
-- script, for keys on one server (multilock.cpp; a cluster's keys span slots
-- and are taken in order instead).
-- KEYS: 1..n the locks, n+1..2n their fence counters (same order), then the
--       lock-state record when ARGV[4] is given.
-- ARGV: 1 ttl ms, 2 fence 0|1, 3 on a server that evicts keys: the
--       evicted_keys count its lock-state record was checked at ('' elsewhere),
--       4 the record's epoch id the client checked ('' = not compared),
--       5.. one owner token per lock.
-- Returns {1, server time µs, fence or -1 per lock} when granted, {0, index of
-- the first held lock, its pttl} when busy (nothing written), {-1,
-- evicted_keys} when keys were evicted since that check or the record is not
-- the one checked (acquire.lua's reasons).
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
--#include lock/scripts/epoch_moved.lua
if ARGV[3] ~= '' then
  -- As in acquire.lua: eviction happens before a command, never inside a
  -- script, so an unchanged count means no lock key vanished since the check.
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[3]) then return {-1, ev or -1} end
end
local n = #KEYS / 2
if ARGV[4] ~= '' then
  n = (#KEYS - 1) / 2
  if epoch_moved(KEYS[#KEYS], ARGV[4]) then return {-1, -1} end
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {0, i, redis.call('PTTL', KEYS[i])} end
end
local _, now_us = server_time()
local out = {1, now_us}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[4 + i], 'PX', ARGV[1])
  local fence = -1
  if ARGV[2] == '1' then
    fence = next_fence(fence_counter(KEYS[n + i]), now_us)
    redis.call('SET', KEYS[n + i], string.format('%d', fence))
  end
  out[#out + 1] = fence
end
return out
