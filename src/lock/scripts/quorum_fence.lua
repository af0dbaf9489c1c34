-- The second round of a fenced quorum grant: raise this instance's fence
-- counter to the quorum's fence (the maximum the majority issued), so that
-- every later majority, which shares an instance with this one, issues above
-- it. Only while the lock is still ours: a counter raised for a lock we no
-- longer hold would be harmless, but the answer says whether we do.
-- KEYS: 1 lock, 2 fence counter. ARGV: 1 token, 2 the quorum's fence.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local f = tonumber(ARGV[2])
local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if cur < f then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
