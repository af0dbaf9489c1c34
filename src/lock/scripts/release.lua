-- Compare-and-delete: only the holder's token may delete the lock, so a
-- worker whose lock expired cannot delete the next holder's lock.
-- KEYS: 1 lock, 2 (optional) the fair-mode queue. ARGV: 1 token, 2 release channel.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- Wake waiters now instead of at their next backoff. With a fair queue the
  -- message names its head, the only waiter that can win: the others stay
  -- asleep instead of each sending an attempt that must fail, which on a busy
  -- client host delayed the head's own attempt (bench --contention --fair).
  local msg = ARGV[1]
  if KEYS[2] then msg = redis.call('LINDEX', KEYS[2], 0) or ARGV[1] end
  redis.call('PUBLISH', ARGV[2], msg)
  return 1
end
return 0
