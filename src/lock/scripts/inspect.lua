-- A consistent snapshot of one resource's lock, for `jobguard locks` and
-- LockService::inspect. Read-only: it changes nothing.
-- KEYS: 1 lock, 2 fence counter, 3 fair queue, 4 default-mode waiters' line (optional).
-- Returns {token or false, pttl, fence or false, waiters (fair queue + line),
-- now seconds, now µs}.
local t = redis.call('TIME')
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
        redis.call('LLEN', KEYS[3]) + (KEYS[4] and redis.call('ZCARD', KEYS[4]) or 0), t[1], t[2]}
