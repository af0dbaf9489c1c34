-- An operator's force release of a read-write lock's holders (`jobguard
-- locks release --rw`): remove the live readers and writer whose owner is
-- ARGV[6] (every one when ''), advance the fence past every token issued so
-- far, and append the audit record, in one script (the mutex's rules:
-- no grant slips between the removal and the fence advance, and no release
-- goes unrecorded, as force_release.lua).
-- KEYS: 1 readers, 2 writer, 3 fence counter, 4 audit stream.
-- ARGV: 1 who, 2 reason, 3 resource, 4 audit MAXLEN (approximate), 5 wake
--       channel, 6 owner ("host/pid/job") or '', 7 '1' on a Redis Cluster.
-- Returns {0} when nothing is held, {-1, a holder} when ARGV[6] holds nothing
-- but others do, {1, "reader a,writer b", ms the longest lease had left,
-- new fence, audit entry id} when released.
--#include redis/scripts/server_time.lua
--#include lock/scripts/fence_floor.lua
local now_ms, now_us = server_time()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
local removed, left, other = {}, 0, nil
for i, k in ipairs({KEYS[2], KEYS[1]}) do
  local m = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
  for j = 1, #m, 2 do
    local owner = string.match(m[j], '^(.*)#[^#]*$') or m[j]
    if ARGV[6] == '' or ARGV[6] == owner then
      redis.call('ZREM', k, m[j])
      removed[#removed + 1] = (i == 1 and 'writer ' or 'reader ') .. owner
      left = math.max(left, tonumber(m[j + 1]) - now_ms)
    elseif not other then
      other = owner
    end
  end
end
if #removed == 0 then
  if other then return {-1, other} end
  return {0}
end
local fence = string.format('%d', next_fence(fence_counter(KEYS[3]), now_us))
redis.call('SET', KEYS[3], fence)
local holder = table.concat(removed, ',')
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'resource', ARGV[3], 'holder', holder,
                      'who', ARGV[1], 'reason', ARGV[2], 'fence', fence, 'ttl_left_ms', tostring(left))
-- Not a "wake <id>": every waiter looks again, and the line decides.
redis.call(ARGV[7] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[5], 'released')
return {1, holder, left, fence, id}
