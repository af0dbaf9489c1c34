-- One instance's vote in a quorum (Redlock) grant: SET NX PX, the fence, and
-- the lock-state check, atomically.
-- KEYS: 1 lock, 2 fence counter, 3 the lock-state record (quarantine.hpp's
--       kLockStateKey, the hash epoch.lua keeps)
-- ARGV: 1 token, 2 ttl ms, 3 fence 0|1, 4 max TTL ms ('' = no lock-state check)
-- Returns {1, fence or -1} granted, {0, pttl of the holder} busy,
-- {-2, quarantine ms left, reason} when this instance lost its lock state
-- and must not vote until every lease it could have granted has expired.
--#include redis/scripts/server_time.lua
if ARGV[4] ~= '' then
  -- The Redlock "delayed restart", kept by the server itself: a restarted
  -- (or flushed) instance has no record, or a record of another run_id; it
  -- votes no for a max TTL, so it cannot hand a second contender the vote
  -- it gave the current holder before it forgot. The record's format is
  -- epoch.lua's, so single-server LockServices on the same server agree.
  --#include lock/scripts/epoch_id.lua
  local function field(text, name) return string.match(text, name .. ':([^\r\n]*)') end
  local run_id = field(redis.call('INFO', 'server'), 'run_id') or '?'
  local now, now_us = server_time()
  local rec = redis.call('HMGET', KEYS[3], 'run_id', 'until', 'reason')
  local until_ms = tonumber(rec[2]) or 0
  local reason = rec[3] or 'lock state lost'
  if rec[1] ~= run_id then
    if rec[1] then
      reason = 'a different server process (run_id ' .. string.sub(rec[1], 1, 8) .. ' -> ' .. string.sub(run_id, 1, 8) .. ')'
    else
      reason = 'no lock-state record: restarted without persistence, flushed, or new to jobguard'
    end
    until_ms = math.max(until_ms, now + tonumber(ARGV[4]))
    local evicted = tonumber(field(redis.call('INFO', 'stats'), 'evicted_keys')) or 0
    redis.call('HSET', KEYS[3], 'run_id', run_id, 'evicted', evicted, 'until', string.format('%d', until_ms),
               'id', epoch_id(run_id, now_us), 'reason', reason)
  end
  if until_ms > now then return {-2, until_ms - now, reason} end
end

local token = ARGV[1]
local granted = redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) ~= false
if not granted and redis.call('GET', KEYS[1]) == token then
  -- Our own earlier attempt, whose undo was lost: the same token, so it is
  -- ours again for a full TTL.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  granted = true
end
if not granted then return {0, redis.call('PTTL', KEYS[1])} end
local fence = -1
if ARGV[3] == '1' then
  -- Above what this instance issued before a restart only when its clock
  -- is not behind the old one's.
  --#include lock/scripts/fence_floor.lua
  local _, now_us = server_time()
  fence = next_fence(fence_counter(KEYS[2]), now_us)
  redis.call('SET', KEYS[2], string.format('%d', fence))
end
return {1, fence}
