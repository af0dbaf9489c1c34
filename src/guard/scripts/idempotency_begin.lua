-- Idempotency begin. Times come from the server's clock (TIME), so the lease
-- is judged by one clock however skewed the workers' clocks are.
-- KEYS[1] record; ARGV[1] fingerprint, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] retention ms,
--   ARGV[5] (composed calls only) 'absent': the caller found KEYS[1] missing
--   earlier in the same script call, so it is not read again (a script runs
--   alone: nothing can have written it since)
-- Returns {status, owner, since_ms, lease_left_ms, extra}
--   status: claimed | reclaimed | in_progress | completed | conflict
--   extra: the stored result (completed) or stored fingerprint (conflict)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = ARGV[5] == 'absent' and {} or
          redis.call('HMGET', KEYS[1], 'state', 'fp', 'owner', 'since', 'lease_until', 'result')
local status = 'claimed'
if r[1] then
  if r[2] ~= ARGV[1] then return {'conflict', r[3], r[4], 0, r[2]} end
  if r[1] == 'completed' then return {'completed', r[3], r[4], 0, r[6]} end
  local left = tonumber(r[5]) - now
  if left > 0 then return {'in_progress', r[3], r[4], left, false} end
  status = 'reclaimed'
end
local lease = tonumber(ARGV[3])
local keep = math.max(tonumber(ARGV[4]), lease)
local since = string.format('%d', now)
-- A reclaimed key loses the fields of its earlier attempt (a stored result).
if r[1] then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'state', 'in_progress', 'fp', ARGV[1], 'owner', ARGV[2], 'since', since,
           'lease_until', string.format('%d', now + lease))
redis.call('PEXPIRE', KEYS[1], keep)
return {status, ARGV[2], since, lease, false}
