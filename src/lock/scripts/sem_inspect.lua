-- A read-only snapshot of a semaphore (nothing is swept).
-- KEYS: 1 holders, 2 fence counter, 3 waiters' line, 4 the line's liveness,
--       5 stored permit count.
-- Returns {server ms, stored count or false, fence or false, live waiters,
--          member, expiry ms, member, expiry ms, ...} for the live holders.
--#include redis/scripts/server_time.lua
local now_ms = server_time()
local out = {now_ms, redis.call('GET', KEYS[5]), redis.call('GET', KEYS[2]),
             redis.call('ZCOUNT', KEYS[4], '(' .. now_ms, '+inf')}
local h = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '(1e15', 'WITHSCORES')
for i = 1, #h, 2 do
  out[#out + 1] = h[i]
  out[#out + 1] = tonumber(h[i + 1])
end
return out
