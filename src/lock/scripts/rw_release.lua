-- Let go of a read-write lock: only its holder may (the member is its token),
-- and a lease that already ended by the server's clock is not ours to give.
-- KEYS: 1 the holder's zset (readers or writer), 2 readers, 3 writer,
--       4 waiters' line, 5 the line's liveness, 6 the writers in the line
-- ARGV: 1 token, 2 wake channel, 3 '1' on a Redis Cluster: SPUBLISH (the
--       channel has the hash tag)
-- Returns 1 when released, 0 when it was not ours (any more).
--#include redis/scripts/server_time.lua
local now_ms = server_time()
local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not exp then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(exp) <= now_ms then return 0 end
-- A reader that leaves a live reader in: nobody in the line can enter yet
-- (the waiters are writers and the readers behind them), so nothing to do.
if KEYS[1] == KEYS[2] then
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) > now_ms then return 1 end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
-- Nobody in the line can enter while a writer holds; while readers hold,
-- the waiters are writers and the readers behind them (rw_acquire.lua).
if redis.call('ZCARD', KEYS[3]) > 0 or redis.call('ZCARD', KEYS[2]) > 0 then return 1 end
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms)
for _, w in ipairs(dead) do
  redis.call('ZREM', KEYS[4], w)
  redis.call('ZREM', KEYS[5], w)
  redis.call('ZREM', KEYS[6], w)
end
local publish = ARGV[3] == '1' and 'SPUBLISH' or 'PUBLISH'
-- Wake by name whom the lock now belongs to: the writer at the head of the
-- line, or else the readers ahead of the first waiting writer. Past a few
-- dozen readers one message wakes every waiter of each service instead.
local head = redis.call('ZRANGE', KEYS[4], 0, 0)
if not head[1] then return 1 end
if redis.call('ZSCORE', KEYS[6], head[1]) then
  redis.call(publish, ARGV[2], 'wake ' .. head[1])
  return 1
end
local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
local upto = first[2] and ('(' .. first[2]) or '+inf'
local readers = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', upto, 'LIMIT', 0, 33)
if #readers > 32 then
  redis.call(publish, ARGV[2], 'readers')
  return 1
end
for _, w in ipairs(readers) do
  redis.call(publish, ARGV[2], 'wake ' .. w)
end
return 1
