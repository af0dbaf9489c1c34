-- A guarded job's finish in one call (GuardedRunner, one_call_finish): the
-- idempotency key completed, the completion record written, the lock
-- released — the runner's order when it makes them one call at a time.
-- Composed (src/job/fused.cpp) after idempotency_complete.lua as
-- idem_complete(KEYS, ARGV), completion_record.lua as record(KEYS, ARGV) and
-- release.lua as release(KEYS, ARGV).
-- KEYS: 1 the completion record, 2 the lock, 3 the lock's default-mode
--       waiters (release.lua wakes the one that has waited longest, not the
--       herd), 4 the idempotency key (optional)
-- ARGV: 1 lock token, 2 release channel, 3 completed_by, 4 result,
--       5 record retention ms, 6 idempotency owner, 7 idempotency retention ms,
--       8 '1' on a Redis Cluster (release.lua's sharded publish), else ''
-- Returns {1, recorded 0|1, released 0|1}, or {0, idempotency_complete's
-- reply} when the key is no longer ours: then nothing is written or
-- released, and the runner's own steps report it as they would.
-- The server's clock read once for the key and the record (each redis.call
-- is a good part of the call's cost).
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if KEYS[4] then
  local c = idem_complete({KEYS[4]}, {ARGV[6], ARGV[4], ARGV[7], now})
  if c[1] ~= 1 then return {0, c} end
end
local rec = record({KEYS[1]}, {ARGV[3], ARGV[4], ARGV[5], now})
return {1, rec[1], release({KEYS[2], KEYS[3]}, {ARGV[1], ARGV[2], '', ARGV[8]})}
