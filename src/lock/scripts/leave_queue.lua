-- A fair-mode waiter that gives up leaves the queue, so the next waiter does
-- not wait for its place to expire. A release may have granted it the lock
-- just before (release.lua): returns 1 then, and the waiter releases it.
-- KEYS: 1 queue, 2 queue expiries, 3 lock. ARGV: 1 queue entry, 2 token.
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[3]) == ARGV[2] then return 1 end
return 0
