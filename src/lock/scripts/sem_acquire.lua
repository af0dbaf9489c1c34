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
--       then what every attempt of the call shares: 4 ttl ms, 5 fence 0|1,
--       6 wait 0|1 (join the line if busy, under the attempt's token),
--       7 waiter lease ms; then two per attempt: its token, and its id in
--       the line when that is not the token ('' when it is: a waiter's id is
--       its first token, which a discarded grant replaces). A call's attempts
--       share the rest (SemaphoreCalls batches them by it): each attempt's
--       own arguments are strings the server copies and Lua interns, the
--       dearest part of an attempt after the holders' key itself.
-- Returns one flat array: the call's permits, ms until the soonest holder's
-- lease ends (-1 none; for its busy attempts), and the evicted_keys count
-- when it was refused (0 otherwise); then a code per attempt, in order: its
-- slot (>= 0) when granted, -1 when busy, -2 when refused (keys were evicted
-- since that check, or the record is not the one checked); then, when the
-- call asked for fences, each attempt's fence (-1 unless granted). What the
-- attempts share is sent once, and the values a reply carries cost the
-- server about a tenth of a microsecond each (SemaphoreCalls::send hands
-- each caller its attempt).
--
-- The holders' zset has two kinds of members, so that a grant finds a free
-- slot without reading every holder and one key holds all of it (it expires,
-- is evicted or is lost whole, never in part):
--   "<token> <slot>"  a holder, scored by its lease's expiry (server ms);
--   "free:<slot>"     a slot nobody holds, scored 1e15 + 10000 - slot: after
--                     every expiry, and the lowest free slot last (the key's
--                     tail), where a grant takes it without reading holders.
-- Invariant: with H = ZCARD, each slot in [0, H) has exactly one member and
-- none is >= H. Every script that removes a holder adds its slot's free
-- member in the same step (sem_release.lua, sem_extend.lua, the admin's),
-- unless it removed the highest slots in use: then the key is shorter
-- instead (sem_release.lua).
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
--#include lock/scripts/epoch_moved.lua
local FIRST = 8  -- the first attempt's token
local items = (#ARGV - FIRST + 1) / 2
local fenced_asked = ARGV[5] == '1'
local out = {0, -1, 0}
local function refuse(ev)
  out[3] = ev
  for i = 1, items do
    out[3 + i] = -2
    if fenced_asked then out[3 + items + i] = -1 end
  end
  return out
end
if ARGV[2] ~= '' then
  local ev = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)'))
  if ev ~= tonumber(ARGV[2]) then return refuse(ev or -1) end
end
if epoch_moved(KEYS[6], ARGV[3]) then return refuse(-1) end
local ttl, may_wait = tonumber(ARGV[4]), ARGV[6] == '1'
local lease = tonumber(ARGV[7])
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
local fence, fenced = nil, false
local any_busy = false
local granted = {}          -- the attempts granted, in order (each its place in ARGV and out)
out[1] = n
for i = 1, items do
  local token, waiter = ARGV[FIRST + 2 * (i - 1)], ''
  if may_wait then
    waiter = ARGV[FIRST + 2 * i - 1]
    if waiter == '' then waiter = token end
  end
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
    granted[#granted + 1] = i
    if in_line then
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('ZREM', KEYS[4], waiter)
    end
    if fenced_asked then
      if not fence then fence = fence_counter(KEYS[2]) end
      fence = next_fence(fence, now_us)
      fenced = true
      out[3 + items + i] = fence
    end
  else
    if may_wait then
      redis.call('ZADD', KEYS[3], 'NX', string.format('%d', now_us), waiter)
      redis.call('ZADD', KEYS[4], string.format('%d', now_ms + lease), waiter)
      redis.call('PEXPIRE', KEYS[3], string.format('%d', lease * 2))
      redis.call('PEXPIRE', KEYS[4], string.format('%d', lease * 2))
      line = true
    end
    any_busy = true
    out[3 + i] = -1
    if fenced_asked then out[3 + items + i] = -1 end
  end
end
if any_busy then
  -- The soonest lease end among the holders stored before this call, or
  -- this call's grants' (they all end at now + ttl).
  local first = redis.call('ZRANGEBYSCORE', holders, '-inf', '(1000000000000000', 'WITHSCORES', 'LIMIT', '0', '1')
  local soonest = first[2] and tonumber(first[2]) or -1
  if #granted > 0 and (soonest < 0 or now_ms + ttl < soonest) then soonest = now_ms + ttl end
  if soonest >= 0 then out[2] = soonest - now_ms end
end

if #granted > 0 then
  -- The lowest free slots, in order: the free members first (the lowest is
  -- the key's last member), then H, H + 1, ... Below n for each grant, as
  -- each was made with fewer than n holders: fewer than n holders leave a
  -- slot below n free, and holders above a lowered count keep theirs until
  -- they leave.
  local g = #granted
  local h = redis.call('ZCARD', holders)
  -- Only free members score above FREE, the lowest slot highest: the first
  -- g of them by descending score are the lowest free slots and the key's
  -- last members, removed by rank. Members alone, no scores: a score comes
  -- back as a printed double for Lua to parse again.
  local free_members = redis.call('ZREVRANGEBYSCORE', holders, '+inf', '(1000000000000000', 'LIMIT', '0',
                                  string.format('%d', g))
  -- Each slot kept as the digits it is written with too: a Lua number
  -- joined to a string is printed with '%.14g', dearer than the rest.
  local slots, digits = {}, {}
  for j, m in ipairs(free_members) do
    digits[j] = string.sub(m, 6)
    slots[j] = tonumber(digits[j])
  end
  if #slots > 0 then redis.call('ZREMRANGEBYRANK', holders, string.format('%d', -#slots), '-1') end
  while #slots < g do
    slots[#slots + 1] = h
    digits[#digits + 1] = string.format('%d', h)
    h = h + 1
  end
  local add = {}
  local e = string.format('%d', now_ms + ttl)  -- every grant's lease end
  for k, i in ipairs(granted) do
    add[#add + 1] = e
    add[#add + 1] = ARGV[FIRST + 2 * (i - 1)] .. ' ' .. digits[k]
    out[3 + i] = slots[k]
  end
  redis.call('ZADD', holders, unpack(add))
end
if #granted > 0 and redis.call('PTTL', holders) < ttl then
  redis.call('PEXPIRE', holders, string.format('%d', ttl))
end
if fenced then redis.call('SET', KEYS[2], string.format('%d', fence)) end
return out
