-- A consistent snapshot of one resource's lock, for `jobguard locks` and
-- LockService::inspect. Read-only: it changes nothing.
-- KEYS: 1 lock, 2 fence counter, 3 fair queue, 4 default-mode waiters' line (optional).
-- Returns {token or false, pttl, fence or false, waiters (fair queue + line),
-- server time µs}.
--#include redis/scripts/server_time.lua
local _, now_us = server_time()
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
        redis.call('LLEN', KEYS[3]) + (KEYS[4] and redis.call('ZCARD', KEYS[4]) or 0), now_us}
