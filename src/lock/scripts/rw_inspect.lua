-- A read-only snapshot of a read-write lock (nothing is swept).
-- KEYS: 1 readers, 2 writer, 3 fence counter, 4 the line's liveness,
--       5 the writers in the line
-- Returns {server ms, fence or false, live waiters, waiting writers (live),
--          #writer entries, writer token, expiry ms, ..., reader token,
--          expiry ms, ...} for the live holders.
--#include redis/scripts/server_time.lua
local now_ms = server_time()
local live = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now_ms, '+inf')
local writers = 0
for _, w in ipairs(live) do
  if redis.call('ZSCORE', KEYS[5], w) then writers = writers + 1 end
end
local out = {now_ms, redis.call('GET', KEYS[3]), #live, writers}
local w = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now_ms, '+inf', 'WITHSCORES')
out[#out + 1] = #w / 2
for i = 1, #w do out[#out + 1] = w[i] end
local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '+inf', 'WITHSCORES')
for i = 1, #r do out[#out + 1] = r[i] end
return out
