-- Grant a reader or the writer of a read-write lock, in line order, with an
-- optional fencing token, atomically. Every key carries the resource's hash
-- tag (one slot).
-- KEYS: 1 readers (zset: token scored by lease expiry, server ms),
--       2 writer (zset, the same; at most one live member),
--       3 fence counter (the mutex's: the same high-water mark and floor),
--       4 waiters' line (zset: waiter id scored by first arrival, server µs),
--       5 the line's liveness (zset: waiter id scored by expiry, server ms),
--       6 the writers in the line (zset: writer's id scored by its arrival)
-- ARGV: 1 token, 2 ttl ms, 3 fence 0|1, 4 'r' (shared) | 'w' (exclusive),
--       5 join the line if busy 0|1, 6 waiter lease ms, 7 on a server that
--       evicts keys: the evicted_keys count its lock-state record was checked
--       at ('' elsewhere), 8 the waiter's id in the line ('' = try once)
-- Returns {1, fence or -1, -1, 0} when granted, {0, ms until the soonest
-- holder's lease ends (-1 none), 0} when busy, {-1, evicted} when keys were
-- evicted since that check (sem_acquire.lua's replies, without a slot).
--#include redis/scripts/server_time.lua
if ARGV[7] ~= '' then
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[7]) then return {-1, ev or -1} end
end
local now_ms, now_us = server_time()
local ttl = tonumber(ARGV[2])
local writer = ARGV[4] == 'w'
local waiter = ARGV[8]

local function grant(holders)
  redis.call('ZADD', holders, now_ms + ttl, ARGV[1])
  if redis.call('PTTL', holders) < ttl then redis.call('PEXPIRE', holders, ttl) end
  if waiter ~= '' and redis.call('ZREM', KEYS[4], waiter) == 1 then
    redis.call('ZREM', KEYS[5], waiter)
    redis.call('ZREM', KEYS[6], waiter)
  end
  local fence = -1
  if ARGV[3] == '1' then
    -- A writer is granted only once the readers it waited for are gone, so
    -- its fence is above each of theirs; the readers after it get higher ones.
    --#include lock/scripts/fence_floor.lua
    fence = next_fence(fence_counter(KEYS[3]), now_us)
    redis.call('SET', KEYS[3], string.format('%d', fence))
  end
  return {1, fence, -1, 0}
end

-- The common case first, in as few calls as it takes: a reader, no writer
-- holding (a live one), none waiting (live or not). The slow path below
-- would grant it too: with no writer in the line nothing is ahead of it.
if not writer then
  local w = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if (not w[2] or tonumber(w[2]) <= now_ms) and not redis.call('ZRANGE', KEYS[6], 0, 0)[1] then
    -- Keeps the readers' set to the live ones (a crashed reader's entry goes).
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
    return grant(KEYS[1])
  end
end

-- A lease ends at its expiry by the server's clock and not a moment before:
-- a crashed holder's place comes back here, on the first attempt after it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
-- A waiter that stopped refreshing its place (crashed, paused) must not hold
-- up the line behind it; a dead writer's place would block every reader.
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms)
for _, w in ipairs(dead) do
  redis.call('ZREM', KEYS[4], w)
  redis.call('ZREM', KEYS[5], w)
  redis.call('ZREM', KEYS[6], w)
end

local may
if redis.call('ZCARD', KEYS[2]) > 0 then
  may = false
elseif writer then
  -- Alone, and nobody ahead in the line: a writer waits for the readers
  -- that hold now and for every waiter that came before it.
  if redis.call('ZCARD', KEYS[1]) > 0 then
    may = false
  else
    local rank
    if waiter ~= '' then rank = redis.call('ZRANK', KEYS[4], waiter) end
    if rank then may = rank == 0 else may = redis.call('ZCARD', KEYS[4]) == 0 end
  end
else
  -- Writer preference: a reader enters beside the readers that hold unless
  -- a writer waits ahead of it; a reader that is not yet in the line is
  -- behind every waiting writer.
  local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
  if not first[2] then
    may = true
  else
    local mine
    if waiter ~= '' then mine = redis.call('ZSCORE', KEYS[4], waiter) end
    may = mine ~= false and mine ~= nil and tonumber(mine) < tonumber(first[2])
  end
end

if may then return grant(writer and KEYS[2] or KEYS[1]) end

if waiter ~= '' and ARGV[5] == '1' then
  local lease = tonumber(ARGV[6])
  local arrival = string.format('%d', now_us)
  redis.call('ZADD', KEYS[4], 'NX', arrival, waiter)
  redis.call('ZADD', KEYS[5], now_ms + lease, waiter)
  redis.call('PEXPIRE', KEYS[4], lease * 2)
  redis.call('PEXPIRE', KEYS[5], lease * 2)
  if writer then
    -- The same arrival as its place in the line (readers compare the two).
    redis.call('ZADD', KEYS[6], 'NX', redis.call('ZSCORE', KEYS[4], waiter), waiter)
    redis.call('PEXPIRE', KEYS[6], lease * 2)
  end
end
local left = -1
for _, k in ipairs({KEYS[2], KEYS[1]}) do
  local s = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if s[2] and (left < 0 or tonumber(s[2]) - now_ms < left) then left = tonumber(s[2]) - now_ms end
end
return {0, left, 0}
