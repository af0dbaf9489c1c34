-- Let go of readers or the writer of a read-write lock: only its holder may
-- (the member is its token), and a lease that already ended by the server's
-- clock is not ours to give. One call lets go of every holder of one mode on
-- one resource that a process released in the same turn of its event loop
-- (SemaphoreCalls, semaphore.cpp): the fixed part (the clock, the check for
-- readers left, the wake) is paid once per call.
-- KEYS: 1 the holders' zset (readers or writer), 2 readers, 3 writer,
--       4 waiters' line, 5 the line's liveness, 6 the writers in the line
-- ARGV: 1 wake channel, 2 '1' on a Redis Cluster: SPUBLISH (the channel has
--       the hash tag), 3.. tokens
-- Returns, per token, 1 when released, 0 when it was not ours (any more).
--#include redis/scripts/server_time.lua
--#include lock/scripts/rw_line.lua
local now_ms = server_time()
local now = string.format('%d', now_ms)
local out, any, gone, seen = {}, false, {}, {}
-- Every token's expiry in one call (ZMSCORE, Redis 6.2+), one call each on
-- an older server.
local asked = {}
for i = 3, #ARGV do asked[#asked + 1] = ARGV[i] end
local scores = redis.pcall('ZMSCORE', KEYS[1], unpack(asked))
if type(scores) ~= 'table' or scores.err then scores = nil end
for i, t in ipairs(asked) do
  local exp
  if scores then exp = scores[i] else exp = redis.call('ZSCORE', KEYS[1], t) end
  out[i] = 0
  -- A token released twice in one call is ours the first time only.
  if exp and not seen[t] then
    seen[t] = true
    gone[#gone + 1] = t
    if tonumber(exp) > now_ms then
      out[i] = 1
      any = true
    end
  end
end
if #gone > 0 then redis.call('ZREM', KEYS[1], unpack(gone)) end
if not any then return out end
-- Readers that leave a live reader in: nobody in the line can enter yet
-- (the waiters are writers and the readers behind them), so nothing to do.
if KEYS[1] == KEYS[2] then
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) > now_ms then return out end
end
-- Nobody waits (the common case): nothing to wake.
if redis.call('EXISTS', KEYS[4]) == 0 then return out end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
-- Nobody in the line can enter while a writer holds; while readers hold,
-- the waiters are writers and the readers behind them (rw_acquire.lua).
if redis.call('ZCARD', KEYS[3]) > 0 or redis.call('ZCARD', KEYS[2]) > 0 then return out end
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
if #dead > 0 then
  redis.call('ZREM', KEYS[4], unpack(dead))
  redis.call('ZREM', KEYS[5], unpack(dead))
  redis.call('ZREM', KEYS[6], unpack(dead))
end
local publish = ARGV[2] == '1' and 'SPUBLISH' or 'PUBLISH'
-- Wake by name whom the lock now belongs to: the writer at the head of the
-- line, or else the readers ahead of the first waiting writer. Past a few
-- dozen readers one message wakes every waiter of each service instead.
local head = rw_head(KEYS[4], KEYS[5], KEYS[6])
if not head then return out end
if redis.call('ZSCORE', KEYS[6], head) then
  redis.call(publish, ARGV[1], 'wake ' .. head)
  return out
end
local first = rw_first_writer(KEYS[4], KEYS[5], KEYS[6])
local upto = first and ('(' .. string.format('%d', first)) or '+inf'
local readers = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', upto, 'LIMIT', 0, 33)
if #readers > 32 then
  redis.call(publish, ARGV[1], 'readers')
  return out
end
for _, w in ipairs(readers) do
  redis.call(publish, ARGV[1], 'wake ' .. w)
end
return out
