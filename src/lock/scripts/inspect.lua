-- A consistent snapshot of one resource's lock, for `jobguard locks` and
-- LockService::inspect. Read-only: it changes nothing.
-- KEYS: 1 lock, 2 fence counter, 3 fair queue.
-- Returns {token or false, pttl, fence or false, queue length, now seconds, now µs}.
local t = redis.call('TIME')
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
        redis.call('LLEN', KEYS[3]), t[1], t[2]}
