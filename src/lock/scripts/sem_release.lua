-- Give permits back: only its holder may give a permit back (the member
-- names its token), and a lease that already ended by the server's clock is
-- not ours to give. One call gives back every permit of one resource that a
-- process released in the same turn of its event loop (SemaphoreCalls,
-- semaphore.cpp): the fixed part below (the clock, the line) is paid once.
-- KEYS: 1 holders, 2 waiters' line, 3 the line's liveness, 4 stored permit count
-- ARGV: 1 wake channel, 2 permits asked for, 3 '1' on a Redis Cluster:
--       SPUBLISH (the channel has the hash tag), 4.. members ("<token> <slot>")
-- Returns, per member, 1 when released, 0 when the permit was not ours (any more).
-- The holders' layout and its invariant: sem_acquire.lua.
--#include redis/scripts/server_time.lua
local FREE = 1e15
local holders = KEYS[1]
local now_ms = server_time()
local now = string.format('%d', now_ms)
local out, any = {}, false
local gone_members = {}
local members = #ARGV - 3
local removed = nil
-- With no entry of the key expired (the common case, one count), every
-- member found is live, and one ZREM says whether all were found: then
-- nobody's expiry need be read. The members go to Redis straight from ARGV:
-- a copy into a table of our own would cost a table slot per member.
if redis.call('ZCOUNT', holders, '-inf', now) == 0 then
  removed = redis.call('ZREM', holders, unpack(ARGV, 4, #ARGV))
  if removed == members then
    for i = 4, #ARGV do
      out[i - 3] = 1
      gone_members[i - 3] = i
    end
    any = removed > 0
  else
    -- Some were not ours any more (force-released, swept after expiring).
    -- Which, from the slots: each slot below the key's count before the
    -- ZREM had one member (the invariant), so a member removed just now
    -- left its slot with none, and one that was not there left its slot
    -- held (another holder, a free member) or at or above that count.
    local before = redis.call('ZCARD', holders) + removed
    local held = {}
    for _, m in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
      local s = string.match(m, '[ :](%d+)$')
      if s then held[tonumber(s)] = true end
    end
    for i = 4, #ARGV do
      local s = tonumber(string.match(ARGV[i], ' (%d+)$', math.max(1, #ARGV[i] - 7)))
      out[i - 3] = 0
      if s and s < before and not held[s] then
        -- Marked held: the same member twice in one call counts once.
        held[s] = true
        out[i - 3] = 1
        any = true
        gone_members[#gone_members + 1] = i
      end
    end
  end
else
  -- Every member's expiry in one call (ZMSCORE, Redis 6.2+), one call each
  -- on an older server.
  local scores = redis.pcall('ZMSCORE', holders, unpack(ARGV, 4, #ARGV))
  if type(scores) ~= 'table' or scores.err then scores = nil end
  for i = 4, #ARGV do
    local exp
    if scores then exp = scores[i - 3] else exp = redis.call('ZSCORE', holders, ARGV[i]) end
    out[i - 3] = 0
    if exp then
      -- The slot is free either way (an expired entry was only not yet swept).
      gone_members[#gone_members + 1] = i
      if tonumber(exp) > now_ms then
        out[i - 3] = 1
        any = true
      end
    end
  end
  if #gone_members > 0 then redis.call('ZREM', holders, unpack(ARGV, 4, #ARGV)) end
end
-- One variadic ZREM for the whole batch above (it passes over the members
-- that are not there). With no holder left the whole key goes (an empty
-- semaphore leaves nothing), free members and all, so they are written only
-- when someone still holds a permit: the holders count below FREE, the free
-- members above it.
if redis.call('ZCOUNT', holders, '-inf', '(1000000000000000') == 0 then
  redis.call('DEL', holders)
elseif #gone_members > 0 then
  -- The slots given back at the top need no free member: with the highest
  -- slots in use gone, the key is shorter by them (H before this call was
  -- the members left plus the ones removed). Only the slots below the
  -- highest still in use get one. Holders that come and go in groups (the
  -- calls of 32 of a busy process) then write free members for every other
  -- group only.
  local given = {}
  for k = 1, #gone_members do
    -- The slot is the member's last digits: matched from near its end, not
    -- tried at every position of a long token.
    local m = ARGV[gone_members[k]]
    local s = string.match(m, ' (%d+)$', math.max(1, #m - 7))
    given[tonumber(s)] = s
  end
  local top = redis.call('ZCARD', holders) + #gone_members - 1
  while given[top] do
    given[top] = nil
    top = top - 1
  end
  local markers = {}
  for slot, s in pairs(given) do
    markers[#markers + 1] = string.format('%d', FREE + 10000 - slot)
    markers[#markers + 1] = 'free:' .. s
  end
  if #markers > 0 then redis.call('ZADD', holders, unpack(markers)) end
end
if not any then return out end
-- Nobody waits (the common case): nothing to wake.
if redis.call('EXISTS', KEYS[2]) == 0 then return out end
local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  for _, m in ipairs(gone) do
    local g = tonumber(string.match(m, ' (%d+)$'))
    if g then redis.call('ZADD', holders, string.format('%d', FREE + 10000 - g), 'free:' .. g) end
  end
end
local n = tonumber(redis.call('GET', KEYS[4]) or ARGV[2]) or tonumber(ARGV[2])
local free = n - redis.call('ZCOUNT', holders, '-inf', '(1000000000000000')
if free <= 0 then return out end
-- Wake by name the waiters the free permits now belong to (sem_acquire.lua's
-- FIFO rule), not the herd: the others would only find themselves behind.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, w in ipairs(dead) do
  redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
end
local publish = ARGV[3] == '1' and 'SPUBLISH' or 'PUBLISH'
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, free - 1)) do
  redis.call(publish, ARGV[1], 'wake ' .. w)
end
return out
