-- A guarded job's claim in one call (the one-call claim path, src/job/claim_one_call.cpp): the
-- completion record's check, the lock's grant and the idempotency key's
-- claim, in the order the runner otherwise makes them one call at a time.
-- Composed (src/job/fused.cpp) after the lock's grant_once (lock_compose.hpp)
-- and idempotency_begin.lua as idem_begin(KEYS, ARGV); their rules live there.
-- KEYS: 1 the lock, 2 its fence counter, 3 the lock-state record
--       (lock_compose.hpp), 4 the completion record, 5 the idempotency key
--       (optional)
-- ARGV: 1 token, 2 ttl ms, 3 fence 0|1, 4 evicted_keys or '', 5 the checked
--       epoch (lock_compose.hpp), 6-9 idempotency_begin.lua's (with KEYS[5]),
--       10 'defer': a fresh unit's key is not written here but completed by
--       the finish (finish.lua's deferred form)
-- Returns {2, 0, result} when the record says the run is done (nothing
-- granted); else acquire.lua's {status, fence or pttl}, plus begin's reply
-- third when granted with a key, or 'deferred' when its write was deferred.
-- Atomic: no worker can finish the run between the record's check and the
-- grant, so no second check is needed.
-- A unit's first attempt, the common case: neither its record nor its key
-- exists, which one EXISTS tells; then neither is read again (idem_begin's
-- 'absent'). Nothing else runs between here and the writes below.
local fresh = KEYS[5] and redis.call('EXISTS', KEYS[4], KEYS[5]) == 0
if not fresh then
  local rec = record_read(KEYS[4])
  if rec then return {2, 0, rec.result} end
end
local g = grant_once(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if g[1] ~= 1 or not KEYS[5] then return g end
-- Deferred (the runner asks only for a class that is not long-running): the
-- key's lease would be this grant's TTL from this instant, so it would end
-- exactly when the lock does, and until then nobody gets past the lock to
-- read it. Writing it here would protect nothing the lock does not, and the
-- key's write is the dearest part of a claim.
if fresh and ARGV[10] == 'defer' then return {g[1], g[2], 'deferred'} end
return {g[1], g[2], idem_begin({KEYS[5]}, {ARGV[6], ARGV[7], ARGV[8], ARGV[9], fresh and 'absent' or ''})}
