-- Compare-and-pexpire for a batch of locks (the lease scheduler's renewals
-- due in one tick): one script call instead of one per lock.
-- KEYS: the locks. ARGV: token and ttl ms for each key in turn.
-- Returns one integer per key: 1 when its token still held it (extended), else 0.
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
