-- A read-only snapshot of a read-write lock (nothing is swept).
-- KEYS: 1 readers, 2 writer, 3 fence counter, 4 the line's liveness,
--       5 the writers in the line
-- Returns {server ms, fence or false, live waiters, waiting writers (live),
--          the longest-waiting live writer's arrival (server ms) or -1,
--          #writer entries, writer token, expiry ms, ..., reader token,
--          expiry ms, ...} for the live holders.
--#include redis/scripts/server_time.lua
local now_ms = server_time()
local live = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now_ms, '+inf')
local writers = 0
local first = -1
for _, w in ipairs(live) do
  local arrival = redis.call('ZSCORE', KEYS[5], w)
  if arrival then
    writers = writers + 1
    -- Arrivals are server microseconds.
    local at = math.floor(tonumber(arrival) / 1000)
    if first < 0 or at < first then first = at end
  end
end
local out = {now_ms, redis.call('GET', KEYS[3]), #live, writers, first}
local w = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now_ms, '+inf', 'WITHSCORES')
out[#out + 1] = #w / 2
for i = 1, #w do out[#out + 1] = w[i] end
local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '+inf', 'WITHSCORES')
for i = 1, #r do out[#out + 1] = r[i] end
return out
