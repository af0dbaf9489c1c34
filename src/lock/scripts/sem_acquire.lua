-- Grant permits of a counting semaphore, FIFO, with optional fencing tokens,
-- atomically: one attempt per item, in order, as if each were its own call.
-- One call carries every attempt on one resource that a process made in the
-- same turn of its event loop (SemaphoreCalls, semaphore.cpp): the fixed part
-- (the script, the clock, the sweep, the count) is paid once per call.
-- Every key carries the resource's hash tag (one slot).
-- KEYS: 1 holders (zset, below): 2 fence counter (the mutex's: the same
--       high-water mark and floor), 3 waiters' line (zset: waiter id scored
--       by first arrival, server µs), 4 the line's liveness (zset: waiter id
--       scored by expiry, server ms), 5 the stored permit count (string;
--       absent = ARGV[4]), 6 the lock-state record (only with ARGV[3])
-- ARGV: 1 permits asked for, 2 on a server that evicts keys: the
--       evicted_keys count its lock-state record was checked at ('' elsewhere),
--       3 the record's epoch id the client checked ('' = not compared),
--       then per attempt, 6 each: token, ttl ms, fence 0|1, join the line if
--       busy 0|1, waiter lease ms, the waiter's id in the line ('' = try once)
-- Returns per attempt {1, fence or -1, slot, permits} when granted, {0, ms
-- until the soonest holder's lease ends (-1 none), permits} when busy,
-- {-1, evicted} when keys were evicted since that check or the record is not
-- the one checked.
--
-- The holders' zset has two kinds of members, so that a grant finds a free
-- slot without reading every holder and one key holds all of it (it expires,
-- is evicted or is lost whole, never in part):
--   "<token> <slot>"  a holder, scored by its lease's expiry (server ms);
--   "free:<slot>"     a slot nobody holds, scored 1e15 + 10000 - slot: after
--                     every expiry, and the lowest free slot last, where
--                     reading and taking it is O(1) (the key's tail).
-- Invariant: with H = ZCARD, each slot in [0, H) has exactly one member and
-- none is >= H. Every script that removes a holder adds its slot's free
-- member in the same step (sem_release.lua, sem_extend.lua, the admin's).
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
--#include lock/scripts/epoch_moved.lua
local items = (#ARGV - 3) / 6
local out = {}
if ARGV[2] ~= '' then
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[2]) then
    for i = 1, items do out[i] = {-1, ev or -1} end
    return out
  end
end
if epoch_moved(KEYS[6], ARGV[3]) then
  for i = 1, items do out[i] = {-1, -1} end
  return out
end
-- Numbers go to Redis as strings made with '%d' here: a Lua number passed
-- as it is is printed with '%.17g', which costs more than the command.
local FREE = 1e15
local now_ms, now_us = server_time()
local now = string.format('%d', now_ms)
local holders = KEYS[1]

-- A lease ends at its expiry by the server's clock and not a moment before:
-- a crashed holder's permit comes back here, on the first attempt after it.
local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  for _, m in ipairs(gone) do
    local s = tonumber(string.match(m, ' (%d+)$'))
    if s then redis.call('ZADD', holders, string.format('%d', FREE + 10000 - s), 'free:' .. s) end
  end
end

local n = tonumber(redis.call('GET', KEYS[5]) or ARGV[1]) or tonumber(ARGV[1])
local live = redis.call('ZCOUNT', holders, '-inf', '(1000000000000000')
local line = redis.call('EXISTS', KEYS[3]) == 1
local swept_line = false
local fence, fenced, max_ttl = nil, false, 0
local stored_soonest = nil  -- the soonest lease end among the holders stored before this call
local granted = {}          -- {item, expiry ms, token} of each grant, in order
for i = 1, items do
  local a = 3 + (i - 1) * 6
  local token, ttl, waiter = ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 6]
  local free = n - live
  -- FIFO: the permits free now go to the first `free` waiters in line; a
  -- newcomer (or a try-once acquire) comes after all of them. An empty line
  -- (the common case) costs nothing more.
  local ahead, in_line = 0, false
  if free > 0 and line then
    if not swept_line then
      -- A waiter that stopped refreshing its place (crashed, paused) must
      -- not hold up the line behind it.
      local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
      for _, w in ipairs(dead) do
        redis.call('ZREM', KEYS[3], w)
        redis.call('ZREM', KEYS[4], w)
      end
      swept_line = true
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
    -- Granted; its slot is given below, with the others'.
    live = live + 1
    granted[#granted + 1] = {i, now_ms + ttl, token}
    if ttl > max_ttl then max_ttl = ttl end
    if in_line then
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('ZREM', KEYS[4], waiter)
    end
    local f_out = -1
    if ARGV[a + 3] == '1' then
      if not fence then fence = fence_counter(KEYS[2]) end
      fence = next_fence(fence, now_us)
      fenced = true
      f_out = fence
    end
    out[i] = {1, f_out, -1, n}
  else
    if waiter ~= '' and ARGV[a + 4] == '1' then
      local lease = tonumber(ARGV[a + 5])
      redis.call('ZADD', KEYS[3], 'NX', string.format('%d', now_us), waiter)
      redis.call('ZADD', KEYS[4], string.format('%d', now_ms + lease), waiter)
      redis.call('PEXPIRE', KEYS[3], string.format('%d', lease * 2))
      redis.call('PEXPIRE', KEYS[4], string.format('%d', lease * 2))
      line = true
    end
    if not stored_soonest then
      local soonest = redis.call('ZRANGEBYSCORE', holders, '-inf', '(1000000000000000', 'WITHSCORES', 'LIMIT', '0', '1')
      stored_soonest = soonest[2] and tonumber(soonest[2]) or -1
    end
    local soonest = stored_soonest
    for _, g in ipairs(granted) do
      if soonest < 0 or g[2] < soonest then soonest = g[2] end
    end
    local left = -1
    if soonest >= 0 then left = soonest - now_ms end
    out[i] = {0, left, n}
  end
end

if #granted > 0 then
  -- The lowest free slots, in order: the free members first (the lowest is
  -- the key's last member), then H, H + 1, ... Below n for each grant, as
  -- each was made with fewer than n holders: fewer than n holders leave a
  -- slot below n free, and holders above a lowered count keep theirs until
  -- they leave.
  local g = #granted
  local h = redis.call('ZCARD', holders)
  local tail = redis.call('ZRANGE', holders, string.format('%d', -g), '-1', 'WITHSCORES')
  -- Each slot kept as the digits it is written with too: a Lua number
  -- joined to a string is printed with '%.14g', dearer than the rest.
  local slots, digits = {}, {}
  for j = #tail - 1, 1, -2 do
    if tonumber(tail[j + 1]) <= FREE then break end
    digits[#digits + 1] = string.sub(tail[j], 6)
    slots[#slots + 1] = tonumber(digits[#digits])
  end
  if #slots > 0 then redis.call('ZPOPMAX', holders, string.format('%d', #slots)) end
  while #slots < g do
    slots[#slots + 1] = h
    digits[#digits + 1] = string.format('%d', h)
    h = h + 1
  end
  local add, expiry = {}, {}  -- expiry: each lease end's digits, made once
  for k, gr in ipairs(granted) do
    local e = expiry[gr[2]]
    if not e then
      e = string.format('%d', gr[2])
      expiry[gr[2]] = e
    end
    add[#add + 1] = e
    add[#add + 1] = gr[3] .. ' ' .. digits[k]
    out[gr[1]][3] = slots[k]
  end
  redis.call('ZADD', holders, unpack(add))
end
if max_ttl > 0 and redis.call('PTTL', holders) < max_ttl then
  redis.call('PEXPIRE', holders, string.format('%d', max_ttl))
end
if fenced then redis.call('SET', KEYS[2], string.format('%d', fence)) end
return out
