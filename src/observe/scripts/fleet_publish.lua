-- One publisher batch: adds each class's counts to its minute bucket.
-- KEYS[1]      the classes ZSET
-- KEYS[2..n]   one bucket HASH per class in the batch
-- ARGV[1]      the batch's unix minute (the classes' score)
-- ARGV[2]      EXPIREAT for the buckets and the ZSET (end of minute + retention)
-- ARGV[3]      oldest minute still retained: classes last seen before it leave the ZSET
-- then, per bucket key in order: class name, field count N, N x (field, increment)
-- Returns the number of buckets written.
-- One script call per batch: atomic, so a failed batch is retried whole and
-- never half-applied; all keys share one hash tag (Cluster: one slot).
local minute = ARGV[1]
local expire_at = ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
local a = 4
for k = 2, #KEYS do
  local class = ARGV[a]
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  for _ = 1, n do
    redis.call('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('EXPIREAT', KEYS[k], expire_at)
  redis.call('ZADD', KEYS[1], minute, class)
end
redis.call('EXPIREAT', KEYS[1], expire_at)
return #KEYS - 1
