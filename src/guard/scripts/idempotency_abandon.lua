-- Idempotency abandon: drop our own in-progress claim.
-- KEYS[1] the key (stored.lua's format); ARGV[1] owner. Returns 1 when dropped, else 0.
local r = idem_read(KEYS[1])
if r and r.state == 'in_progress' and r.owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
