-- Grant readers or the writer of a read-write lock, in line order, with
-- optional fencing tokens, atomically: one attempt per item, in order, as if
-- each were its own call. One call carries every attempt of one mode on one
-- resource that a process made in the same turn of its event loop
-- (SemaphoreCalls, semaphore.cpp): the fixed part (the script, the clock, the
-- writer's and the line's checks) is paid once per call. Every key carries
-- the resource's hash tag (one slot).
-- KEYS: 1 readers (zset: token scored by lease expiry, server ms),
--       2 writer (zset, the same; at most one live member),
--       3 fence counter (the mutex's: the same high-water mark and floor),
--       4 waiters' line (zset: waiter id scored by first arrival, server µs),
--       5 the line's liveness (zset: waiter id scored by expiry, server ms),
--       6 the writers in the line (zset: writer's id scored by its arrival),
--       7 the lock-state record (only with ARGV[3])
-- ARGV: 1 'r' (shared) | 'w' (exclusive), 2 on a server that evicts keys: the
--       evicted_keys count its lock-state record was checked at ('' elsewhere),
--       3 the record's epoch id the client checked ('' = not compared),
--       then per attempt, 6 each: token, ttl ms, fence 0|1, join the line if
--       busy 0|1, waiter lease ms, the waiter's id in the line ('' = try once)
-- Returns per attempt {1, fence or -1, -1, 0} when granted, {0, ms until the
-- soonest holder's lease ends (-1 none), 0} when busy, {-1, evicted} when
-- keys were evicted since that check or the record is not the one checked
-- (sem_acquire.lua's replies, without a slot).
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
--#include lock/scripts/epoch_moved.lua
--#include lock/scripts/rw_line.lua
local items = (#ARGV - 3) / 6
local out = {}
if ARGV[2] ~= '' then
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[2]) then
    for i = 1, items do out[i] = {-1, ev or -1} end
    return out
  end
end
if epoch_moved(KEYS[7], ARGV[3]) then
  for i = 1, items do out[i] = {-1, -1} end
  return out
end
-- Numbers go to Redis as strings made with '%d' here: a Lua number passed
-- as it is is printed with '%.17g', which costs more than the command.
local now_ms, now_us = server_time()
local now = string.format('%d', now_ms)
local writer = ARGV[1] == 'w'
local holders = writer and KEYS[2] or KEYS[1]
local fence = nil

-- A fencing token per fenced grant, in the attempts' order. A writer is
-- granted only once the readers it waited for are gone, so its fence is
-- above each of theirs; the readers after it get higher ones.
local function fence_for(a)
  if ARGV[a + 3] ~= '1' then return -1 end
  if not fence then fence = fence_counter(KEYS[3]) end
  fence = next_fence(fence, now_us)
  return fence
end

-- Stores the grants (one variadic ZADD), the key's life, the fence and the
-- line places the granted waiters leave.
local function store(grants, waiters, max_ttl)
  redis.call('ZADD', holders, unpack(grants))
  if redis.call('PTTL', holders) < max_ttl then redis.call('PEXPIRE', holders, string.format('%d', max_ttl)) end
  -- A line that is gone (the common case) is not searched for them; one
  -- that is loses them from all three sets, whichever they are still in.
  if #waiters > 0 and redis.call('EXISTS', KEYS[4], KEYS[6]) > 0 then
    redis.call('ZREM', KEYS[4], unpack(waiters))
    redis.call('ZREM', KEYS[5], unpack(waiters))
    redis.call('ZREM', KEYS[6], unpack(waiters))
  end
  if fence then redis.call('SET', KEYS[3], string.format('%d', fence)) end
end

-- The common case first, in as few calls as it takes: readers, no writer
-- holding (a live one), none waiting (live or not). The path below would
-- grant them too: with no writer in the line nothing is ahead of them.
if not writer then
  local w = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if (not w[2] or tonumber(w[2]) <= now_ms) and redis.call('EXISTS', KEYS[6]) == 0 then
    -- Keeps the readers' set to the live ones (a crashed reader's entry goes).
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    local grants, waiters, max_ttl = {}, {}, 0
    for i = 1, items do
      local a = 3 + (i - 1) * 6
      local ttl = tonumber(ARGV[a + 2])
      if ttl > max_ttl then max_ttl = ttl end
      grants[#grants + 1] = string.format('%d', now_ms + ttl)
      grants[#grants + 1] = ARGV[a + 1]
      if ARGV[a + 6] ~= '' then waiters[#waiters + 1] = ARGV[a + 6] end
      out[i] = {1, fence_for(a), -1, 0}
    end
    store(grants, waiters, max_ttl)
    return out
  end
end

-- A lease ends at its expiry by the server's clock and not a moment before:
-- a crashed holder's place comes back here, on the first attempt after it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
-- A waiter that stopped refreshing its place (crashed, paused) must not hold
-- up the line behind it; a dead writer's place would block every reader.
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
if #dead > 0 then
  redis.call('ZREM', KEYS[4], unpack(dead))
  redis.call('ZREM', KEYS[5], unpack(dead))
  redis.call('ZREM', KEYS[6], unpack(dead))
end
-- A head with no liveness entry would never be found dead above.
if redis.call('EXISTS', KEYS[4]) == 1 then rw_head(KEYS[4], KEYS[5], KEYS[6]) end
-- The first waiting writer's arrival, read once per call (a reader's call
-- adds no writer): false until read, nil when none waits.
local first_writer = false

-- Whether attempt `a` may enter now. A grant of this call counts as a holder
-- for the attempts after it (stored at once, so the calls below see it).
local function may_enter(a)
  local waiter = ARGV[a + 6]
  if redis.call('EXISTS', KEYS[2]) == 1 then return false end
  if writer then
    -- Alone, and nobody ahead in the line: a writer waits for the readers
    -- that hold now and for every waiter that came before it.
    if redis.call('EXISTS', KEYS[1]) == 1 then return false end
    local rank
    if waiter ~= '' then rank = redis.call('ZRANK', KEYS[4], waiter) end
    if rank then return rank == 0 end
    return redis.call('EXISTS', KEYS[4]) == 0
  end
  -- Writer preference: a reader enters beside the readers that hold unless
  -- a writer waits ahead of it; a reader that is not yet in the line is
  -- behind every waiting writer.
  if first_writer == false then first_writer = rw_first_writer(KEYS[4], KEYS[5], KEYS[6]) end
  if not first_writer then return true end
  local mine
  if waiter ~= '' then mine = redis.call('ZSCORE', KEYS[4], waiter) end
  return mine ~= false and mine ~= nil and tonumber(mine) < first_writer
end

-- Joins the line (a waiter that asked to), with a writer's place among the
-- writers at the same arrival (readers compare the two).
local function join(a)
  local waiter = ARGV[a + 6]
  if waiter == '' or ARGV[a + 4] ~= '1' then return end
  local lease = tonumber(ARGV[a + 5])
  local life = string.format('%d', lease * 2)
  redis.call('ZADD', KEYS[4], 'NX', string.format('%d', now_us), waiter)
  redis.call('ZADD', KEYS[5], string.format('%d', now_ms + lease), waiter)
  redis.call('PEXPIRE', KEYS[4], life)
  redis.call('PEXPIRE', KEYS[5], life)
  if writer then
    -- Not NX: the writer's arrival is always the one its place holds.
    redis.call('ZADD', KEYS[6], redis.call('ZSCORE', KEYS[4], waiter), waiter)
    redis.call('PEXPIRE', KEYS[6], life)
  end
end

local function soonest_end()
  local left = -1
  for _, k in ipairs({KEYS[2], KEYS[1]}) do
    local s = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if s[2] and (left < 0 or tonumber(s[2]) - now_ms < left) then left = tonumber(s[2]) - now_ms end
  end
  return left
end

for i = 1, items do
  local a = 3 + (i - 1) * 6
  if may_enter(a) then
    local ttl = tonumber(ARGV[a + 2])
    local f = fence_for(a)
    local waiters = {}
    if ARGV[a + 6] ~= '' then waiters[1] = ARGV[a + 6] end
    store({string.format('%d', now_ms + ttl), ARGV[a + 1]}, waiters, ttl)
    out[i] = {1, f, -1, 0}
  else
    join(a)
    out[i] = {0, soonest_end(), 0}
  end
end
return out
