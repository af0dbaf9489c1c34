-- Idempotency complete: only the current owner may complete; completing twice
-- (a retried call) is harmless.
-- KEYS[1] record; ARGV[1] owner, ARGV[2] result, ARGV[3] retention ms,
--   ARGV[4] (composed calls only) the server's time in ms, read once by the
--   caller's script ('' or absent: read here)
-- Returns {1} or {0, state, owner}
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[2] == ARGV[1] and r[1] == 'completed' then return {1} end
if r[1] ~= 'in_progress' or r[2] ~= ARGV[1] then return {0, r[1], r[2]} end
local now = ARGV[4]
if not now or now == '' then
  local t = redis.call('TIME')
  now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
redis.call('HSET', KEYS[1], 'state', 'completed', 'result', ARGV[2], 'done', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1}
