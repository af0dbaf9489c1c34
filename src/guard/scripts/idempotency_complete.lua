-- Idempotency complete: only the current owner may complete; completing twice
-- (a retried call) is harmless.
-- KEYS[1] the key (stored.lua's format); ARGV[1] owner, ARGV[2] result, ARGV[3] retention ms,
--   ARGV[4] (composed calls only) the server's time in ms, read once by the
--   caller's script ('' or absent: read here)
-- Returns {1} or {0, state, owner}
--#include redis/scripts/server_time.lua
local r = idem_read(KEYS[1])
if not r then return {0} end
if r.owner == ARGV[1] and r.state == 'completed' then return {1} end
if r.state ~= 'in_progress' or r.owner ~= ARGV[1] then return {0, r.state, r.owner} end
local now = ARGV[4]
if not now or now == '' then
  now = string.format('%d', (server_time()))
end
redis.call('SET', KEYS[1], idem_value('completed', r.fp, r.owner, r.since, r.lease_until, now, ARGV[2]), 'PX', ARGV[3])
return {1}
