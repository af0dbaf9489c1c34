-- Renew a permit's lease: only while it is still ours by the server's clock
-- (an expired entry not yet swept is someone else's slot now).
-- KEYS: 1 holders. ARGV: 1 member ("<token> <slot>"), 2 ttl ms.
-- The holders' layout and its invariant: sem_acquire.lua. A read-write
-- lock's readers and writer (rw_acquire.lua) are renewed here too: their
-- members are bare tokens, with no slot to give back.
--#include redis/scripts/server_time.lua
local now_ms = server_time()
local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not exp then return 0 end
if tonumber(exp) <= now_ms then
  redis.call('ZREM', KEYS[1], ARGV[1])
  local s = string.match(ARGV[1], ' (%d+)$')
  if s then redis.call('ZADD', KEYS[1], string.format('%d', 1e15 + 10000 - tonumber(s)), 'free:' .. s) end
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now_ms + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
