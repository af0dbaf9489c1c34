-- Grant one permit of a counting semaphore, FIFO, with an optional fencing
-- token, atomically. Every key carries the resource's hash tag (one slot).
-- KEYS: 1 holders (zset, below): 2 fence counter (the mutex's: the same
--       high-water mark and floor), 3 waiters' line (zset: waiter id scored
--       by first arrival, server µs), 4 the line's liveness (zset: waiter id
--       scored by expiry, server ms), 5 the stored permit count (string;
--       absent = ARGV[4])
-- ARGV: 1 token, 2 ttl ms, 3 fence 0|1, 4 permits asked for, 5 join the line
--       if busy 0|1, 6 waiter lease ms, 7 on a server that evicts keys: the
--       evicted_keys count its lock-state record was checked at ('' elsewhere),
--       8 the waiter's id in the line ('' = try once)
-- Returns {1, fence or -1, slot, permits} when granted, {0, ms until the
-- soonest holder's lease ends (-1 none), permits} when busy, {-1, evicted}
-- when keys were evicted since that check.
--
-- The holders' zset has two kinds of members, so that a grant finds a free
-- slot without reading every holder and one key holds all of it (it expires,
-- is evicted or is lost whole, never in part):
--   "<token> <slot>"  a holder, scored by its lease's expiry (server ms);
--   "free:<slot>"     a slot nobody holds, scored 1e15 + slot (after every
--                     expiry, lowest slot first).
-- Invariant: with H = ZCARD, each slot in [0, H) has exactly one member and
-- none is >= H. Every script that removes a holder adds its slot's free
-- member in the same step (sem_release.lua, sem_extend.lua, the admin's).
if ARGV[7] ~= '' then
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[7]) then return {-1, ev or -1} end
end
-- Numbers go to Redis as strings made with '%d' here: a Lua number passed
-- as it is is printed with '%.17g', which costs more than the command.
local FREE = 1e15
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = string.format('%d', now_ms)
local ttl = tonumber(ARGV[2])
local waiter = ARGV[8]
local holders = KEYS[1]

-- A lease ends at its expiry by the server's clock and not a moment before:
-- a crashed holder's permit comes back here, on the first attempt after it.
local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  for _, m in ipairs(gone) do
    local s = tonumber(string.match(m, ' (%d+)$'))
    if s then redis.call('ZADD', holders, string.format('%d', FREE + s), 'free:' .. s) end
  end
end

local n = tonumber(redis.call('GET', KEYS[5]) or ARGV[4]) or tonumber(ARGV[4])
local live = redis.call('ZCOUNT', holders, '-inf', '(1000000000000000')
local free = n - live
-- FIFO: the permits free now go to the first `free` waiters in line; a
-- newcomer (or a try-once acquire) comes after all of them. An empty line
-- (the common case) costs one read.
local ahead, in_line = 0, false
if free > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  -- A waiter that stopped refreshing its place (crashed, paused) must not
  -- hold up the line behind it.
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, w in ipairs(dead) do
    redis.call('ZREM', KEYS[3], w)
    redis.call('ZREM', KEYS[4], w)
  end
  local rank = false
  if waiter ~= '' then rank = redis.call('ZRANK', KEYS[3], waiter) end
  if rank then
    ahead, in_line = rank, true
  else
    ahead = redis.call('ZCARD', KEYS[3])
  end
end

if free > ahead then
  -- The lowest free slot: the first free member, or H when there is none.
  -- Below n either way: fewer than n holders leave a slot below n free, and
  -- holders above a lowered count keep theirs until they leave.
  local slot
  local f = redis.call('ZRANGEBYSCORE', holders, '1000000000000000', '+inf', 'LIMIT', '0', '1')
  if f[1] then
    redis.call('ZREM', holders, f[1])
    slot = tonumber(string.sub(f[1], 6))
  else
    slot = redis.call('ZCARD', holders)
  end
  redis.call('ZADD', holders, string.format('%d', now_ms + ttl), ARGV[1] .. ' ' .. slot)
  if redis.call('PTTL', holders) < ttl then redis.call('PEXPIRE', holders, ARGV[2]) end
  if in_line then
    redis.call('ZREM', KEYS[3], waiter)
    redis.call('ZREM', KEYS[4], waiter)
  end
  local fence = -1
  if ARGV[3] == '1' then
    -- acquire.lua's rule: never below the server's clock in microseconds.
    local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
    fence = math.max(cur + 1, floor)
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  return {1, fence, slot, n}
end

if waiter ~= '' and ARGV[5] == '1' then
  local lease = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[3], 'NX', string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2])), waiter)
  redis.call('ZADD', KEYS[4], now_ms + lease, waiter)
  redis.call('PEXPIRE', KEYS[3], lease * 2)
  redis.call('PEXPIRE', KEYS[4], lease * 2)
end
local soonest = redis.call('ZRANGEBYSCORE', holders, '-inf', '(1000000000000000', 'WITHSCORES', 'LIMIT', '0', '1')
local left = -1
if soonest[2] then left = tonumber(soonest[2]) - now_ms end
return {0, left, n}
