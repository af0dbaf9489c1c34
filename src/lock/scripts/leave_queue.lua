-- A fair-mode waiter that gives up leaves the queue, so the next waiter does
-- not wait for its place to expire. KEYS: 1 queue, 2 queue expiries. ARGV: 1 token.
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
