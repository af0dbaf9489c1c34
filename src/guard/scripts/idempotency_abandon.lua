-- Idempotency abandon: drop our own in-progress claim.
-- KEYS[1] record; ARGV[1] owner. Returns 1 when dropped, else 0.
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] == 'in_progress' and r[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
