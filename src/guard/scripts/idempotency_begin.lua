-- Idempotency begin. Times come from the server's clock (TIME), so the lease
-- is judged by one clock however skewed the workers' clocks are.
-- KEYS[1] the key (stored.lua's format); ARGV[1] fingerprint, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] retention ms,
--   ARGV[5] (composed calls only) 'absent': the caller found KEYS[1] missing
--   earlier in the same script call, so it is not read again (a script runs
--   alone: nothing can have written it since)
-- Returns {status, owner, since_ms, lease_left_ms, extra}
--   status: claimed | reclaimed | in_progress | completed | conflict
--   extra: the stored result (completed) or stored fingerprint (conflict)
--#include redis/scripts/server_time.lua
local now = server_time()
local r = ARGV[5] ~= 'absent' and idem_read(KEYS[1])
local status = 'claimed'
if r then
  if r.fp ~= ARGV[1] then return {'conflict', r.owner, r.since, 0, r.fp} end
  if r.state == 'completed' then return {'completed', r.owner, r.since, 0, r.result} end
  local left = tonumber(r.lease_until) - now
  if left > 0 then return {'in_progress', r.owner, r.since, left, false} end
  status = 'reclaimed'
end
local lease = tonumber(ARGV[3])
local keep = math.max(tonumber(ARGV[4]), lease)
local since = string.format('%d', now)
-- A reclaimed key keeps nothing of its earlier attempt: the SET replaces it.
redis.call('SET', KEYS[1], idem_value('in_progress', ARGV[1], ARGV[2], since, string.format('%d', now + lease), '-', ''),
           'PX', keep)
return {status, ARGV[2], since, lease, false}
