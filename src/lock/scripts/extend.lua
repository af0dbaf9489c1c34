-- Compare-and-pexpire: only the holder may extend (renew) its lock.
-- KEYS: 1 lock. ARGV: 1 token, 2 ttl ms.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
