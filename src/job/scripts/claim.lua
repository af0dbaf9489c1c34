-- A guarded job's claim in one call (GuardedRunner, one_call_claim): the
-- completion record's check, the lock's grant and the idempotency key's
-- claim, in the order the runner otherwise makes them one call at a time.
-- Composed (src/job/fused.cpp) after acquire.lua as acquire(KEYS, ARGV) and
-- idempotency_begin.lua as idem_begin(KEYS, ARGV); their rules live there.
-- KEYS: 1-4 acquire.lua's, 5 the completion record, 6 the idempotency key (optional)
-- ARGV: 1-8 acquire.lua's, 9-12 idempotency_begin.lua's (with KEYS[6])
-- Returns {2, 0, result} when the record says the run is done (nothing
-- granted); else acquire.lua's {status, fence or pttl}, plus begin's reply
-- third when granted with a key. Atomic: no worker can finish the run
-- between the record's check and the grant, so no second check is needed.
-- A unit's first attempt, the common case: neither its record nor its key
-- exists, which one EXISTS tells; then neither is read again (idem_begin's
-- 'absent'). Nothing else runs between here and the writes below.
local fresh = KEYS[6] and redis.call('EXISTS', KEYS[5], KEYS[6]) == 0
if not fresh then
  local rec = redis.call('HMGET', KEYS[5], 'at', 'result')
  if rec[1] then return {2, 0, rec[2] or ''} end
end
local g = acquire({KEYS[1], KEYS[2], KEYS[3], KEYS[4]},
                  {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]})
if g[1] ~= 1 or not KEYS[6] then return g end
return {g[1], g[2], idem_begin({KEYS[6]}, {ARGV[9], ARGV[10], ARGV[11], ARGV[12], fresh and 'absent' or ''})}
