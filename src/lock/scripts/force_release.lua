-- An operator's force release (`jobguard locks release`): delete the lock
-- whoever holds it, advance the fence past every token issued so far, and
-- append the audit record, all in one script so no grant can slip between
-- the delete and the fence (the old holder's fenced writes are then refused
-- by a downstream that has seen any later fence) and no release goes
-- unrecorded.
-- KEYS: 1 lock, 2 fence counter, 3 audit stream.
-- ARGV: 1 who, 2 reason, 3 resource, 4 audit MAXLEN (approximate),
--       5 release channel, 6 expected holder ("" = whoever holds it),
--       7 '1' on a Redis Cluster: SPUBLISH (the channel is on this shard).
-- Returns {0} when the lock is free, {-1, holder} when ARGV[6] does not match
-- the holder, {1, holder, pttl, new fence, audit entry id} when released.
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
local tok = redis.call('GET', KEYS[1])
if not tok then return {0} end
-- The readable part of a jobguard token ("host/pid/job"), as token_owner().
local holder = string.match(tok, '^(.*)#[^#]*$') or tok
if ARGV[6] ~= '' and ARGV[6] ~= holder then return {-1, holder} end
local pttl = redis.call('PTTL', KEYS[1])
local _, now_us = server_time()
local fence = string.format('%d', next_fence(fence_counter(KEYS[2]), now_us))
redis.call('SET', KEYS[2], fence)
redis.call('DEL', KEYS[1])
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'resource', ARGV[3], 'holder', holder,
                      'who', ARGV[1], 'reason', ARGV[2], 'fence', fence, 'ttl_left_ms', tostring(pttl))
-- Wake plain waiters now; a fair queue's head takes the lock at its next attempt.
redis.call(ARGV[7] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[5], tok)
return {1, holder, pttl, fence, id}
