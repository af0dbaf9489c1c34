-- Compare-and-delete: only the holder's token may delete the lock, so a
-- worker whose lock expired cannot delete the next holder's lock.
-- KEYS: 1 lock. ARGV: 1 token, 2 release channel.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- Wake waiters now instead of at their next backoff.
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return 1
end
return 0
