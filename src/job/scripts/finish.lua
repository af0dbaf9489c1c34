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
if KEYS[4] then
  local c = idem_complete({KEYS[4]}, {ARGV[6], ARGV[4], ARGV[7]})
  if c[1] ~= 1 then return {0, c} end
end
local rec = record({KEYS[1]}, {ARGV[3], ARGV[4], ARGV[5]})
return {1, rec[1], release({KEYS[2], KEYS[3]}, {ARGV[1], ARGV[2], '', ARGV[8]})}
