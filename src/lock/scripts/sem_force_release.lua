-- An operator's force release of ONE permit (`jobguard locks release KEY
-- --slot N | --holder OWNER`): the mutex's force_release.lua for a permit.
-- Removes the live holder of that slot (or the one permit of that holder),
-- keeps the holders' invariant (sem_acquire.lua: the slot's free: member, or
-- the key gone with its last holder), advances the fence past every token
-- issued so far, wakes every waiter and appends the audit record, in one
-- script, so no grant slips between the removal and the fence.
-- KEYS: 1 holders, 2 fence counter, 3 audit stream.
-- ARGV: 1 who, 2 reason, 3 resource, 4 audit MAXLEN (approximate),
--       5 wake channel, 6 slot ('' = any), 7 holder ('' = any),
--       8 '1' on a Redis Cluster: SPUBLISH.
-- Returns {0} when no live permit matches, {-1, holder} when the slot's
-- holder is not ARGV[7], {-2, n} when ARGV[7] alone matches n > 1 permits,
-- {1, holder, ms left, new fence, audit entry id, slot} when released.
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
local now_ms, now_us = server_time()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now_ms), '(1000000000000000', 'WITHSCORES')
local found, exp, holder, slot, n = nil, nil, nil, nil, 0
for i = 1, #live, 2 do
  local tok, s = string.match(live[i], '^(.*) (%d+)$')
  if tok then
    local h = string.match(tok, '^(.*)#[^#]*$') or tok
    if ARGV[6] ~= '' then
      if s == ARGV[6] then
        if ARGV[7] ~= '' and ARGV[7] ~= h then return {-1, h} end
        found, exp, holder, slot, n = live[i], live[i + 1], h, s, 1
      end
    elseif ARGV[7] == h then
      n = n + 1
      found, exp, holder, slot = live[i], live[i + 1], h, s
    end
  end
end
if n == 0 then return {0} end
if n > 1 then return {-2, n} end
redis.call('ZREM', KEYS[1], found)
if redis.call('ZCOUNT', KEYS[1], '-inf', '(1000000000000000') == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('ZADD', KEYS[1], string.format('%d', 1e15 + 10000 - tonumber(slot)), 'free:' .. slot)
end
local fence = string.format('%d', next_fence(fence_counter(KEYS[2]), now_us))
redis.call('SET', KEYS[2], fence)
local left = tonumber(exp) - now_ms
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'resource', ARGV[3],
                      'holder', holder .. ' (slot ' .. slot .. ')', 'who', ARGV[1], 'reason', ARGV[2],
                      'fence', fence, 'ttl_left_ms', string.format('%d', left))
-- Not "wake <id>": every waiter tries again, and the grant script's FIFO
-- rule decides whose the permit is.
redis.call(ARGV[8] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[5], 'released ' .. slot)
return {1, holder, left, fence, id, tonumber(slot)}
