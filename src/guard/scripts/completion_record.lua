-- Completion record: create once, otherwise return the one already there.
-- KEYS[1] record key (stored.lua's format); ARGV[1] completed_by, ARGV[2] result, ARGV[3] retention ms (0 = forever),
--   ARGV[4] (composed calls only) the server's time in ms, read once by the
--   caller's script ('' or absent: read here),
--   ARGV[5] (composed calls only) 'absent': the caller knows KEYS[1] is
--   missing (finish.lua: a run writes its idempotency key before its record,
--   and found the key missing in the same script call), so it is not read
-- Returns {1 if recorded else 0, completed_at_ms, completed_by, result}
--#include redis/scripts/server_time.lua
if ARGV[5] ~= 'absent' then
  local got = record_read(KEYS[1])
  if got then return {0, got.at, got.by, got.result} end
end
local at = ARGV[4]
if not at or at == '' then
  at = string.format('%d', (server_time()))
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], record_value(at, ARGV[1], ARGV[2]), 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], record_value(at, ARGV[1], ARGV[2]))
end
return {1, at, ARGV[1], ARGV[2]}
