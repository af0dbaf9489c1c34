-- A guarded job's finish in one call (the one-call claim path, src/job/claim_one_call.cpp): the
-- idempotency key completed, the completion record written, the lock
-- released — the runner's order when it makes them one call at a time.
-- Composed (src/job/fused.cpp) after idempotency_complete.lua as
-- idem_complete(KEYS, ARGV), completion_record.lua as record(KEYS, ARGV) and
-- the lock's release_held (lock_compose.hpp).
-- KEYS: 1 the completion record, 2 the lock, 3 the lock's default-mode
--       waiters (release.lua wakes the one that has waited longest, not the
--       herd), 4 the idempotency key (optional)
-- ARGV: 1 lock token, 2 release channel, 3 completed_by, 4 result,
--       5 record retention ms, 6 idempotency owner, 7 idempotency retention ms,
--       8 '1' on a Redis Cluster (release.lua's sharded publish), else '';
--       the deferred form (claim.lua did not write the key): 9 'deferred',
--       10 the fingerprint, 11 ms since the claim (the client's clock), 12 the
--       key's lease ms
-- Returns {1, recorded 0|1, released 0|1}; or {0, idempotency_complete's
-- reply} when the key is no longer ours: then nothing is written or
-- released, and the runner's own steps report it as they would. The
-- deferred form instead returns {0, {0, state, holder}, released 0|1}: the
-- lock released (when ours) and nothing written, for the runner to report.
-- The server's clock read once for the key and the record (each redis.call
-- is a good part of the call's cost).
--#include redis/scripts/server_time.lua
local now_ms = server_time()
local now = string.format('%d', now_ms)
if ARGV[9] == 'deferred' then
  -- The key is written once, here, by the first run of the unit to finish;
  -- the script runs alone, so the order of the steps below is free.
  -- 0 or 1: release.lua's 2 (a waiter woken) is the lock's own business.
  local rel = math.min(release_held(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[8]), 1)
  local k = idem_read(KEYS[4])
  local record_absent = ''
  if not k then
    if rel == 0 then
      -- Our lock is gone. If another run of the unit holds it now, that run
      -- completes the key when it ends; this one reports the lost lock.
      local holder = redis.call('GET', KEYS[2])
      if holder then return {0, {0, 'unwritten (the lock is held by ' .. holder .. ')', false}, rel} end
    end
    -- The key idempotency_begin.lua and idempotency_complete.lua would
    -- have left: readers cannot tell the two paths apart.
    local since = now_ms - tonumber(ARGV[11])
    redis.call('SET', KEYS[4], idem_value('completed', ARGV[10], ARGV[6], string.format('%d', since),
                                          string.format('%d', since + tonumber(ARGV[12])), now, ARGV[4]),
               'PX', ARGV[7])
    -- The claim found both missing, and a run that is not chunked completes
    -- the unit's key before it writes the unit's record (the steps, this
    -- script, the steps after a lost reply): with the key still missing and
    -- our lock held since the claim, so is the record. (A chunked run records
    -- without that key, but it would have needed the lock.)
    if rel == 1 then record_absent = 'absent' end
  elseif k.state ~= 'completed' or k.owner ~= ARGV[6] then
    -- Claimed or completed by another run (a step-by-step claim while we
    -- held the lock, or a run after our lock was lost): not ours to write.
    return {0, {0, k.state, k.owner}, rel}
  end
  return {1, record({KEYS[1]}, {ARGV[3], ARGV[4], ARGV[5], now, record_absent})[1], rel}
end
if KEYS[4] then
  local c = idem_complete({KEYS[4]}, {ARGV[6], ARGV[4], ARGV[7], now})
  if c[1] ~= 1 then return {0, c} end
end
local rec = record({KEYS[1]}, {ARGV[3], ARGV[4], ARGV[5], now})
return {1, rec[1], math.min(release_held(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[8]), 1)}
