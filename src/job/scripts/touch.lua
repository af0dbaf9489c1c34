-- Keeps a pending job that its consumer holds but has not started (waiting
-- for a rate limit or a concurrency permit) from looking stalled: resets its
-- idle time, only while it is still this consumer's, without counting a
-- delivery (XCLAIM JUSTID does not). Checked and claimed in one script: a
-- plain XCLAIM would take back a job another consumer's reclaim scan has
-- just taken over.
-- KEYS[1] the stream; ARGV[1] the group, ARGV[2] the consumer, ARGV[3] the entry id.
-- Returns 1 when touched, 0 when the entry is no longer pending with us.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
