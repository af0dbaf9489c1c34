-- Releases a unique lock for its own job only: a lock taken over since (an
-- orphan re-taken, a replace) belongs to another job and stays.
-- KEYS: 1 the lock, 2 the registry. ARGV: 1 the job's entry id.
-- Returns 1 when released, 0 when the lock was not this job's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], KEYS[1])
  return 1
end
return 0
