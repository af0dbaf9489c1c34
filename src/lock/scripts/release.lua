-- Compare-and-delete: only the holder's token may delete the lock, so a
-- worker whose lock expired cannot delete the next holder's lock.
-- KEYS: 1 lock; for a fair lock also 2 queue, 3 queue expiries, 4 fence
--       counter; for a default-mode lock 2 its waiters by arrival (zset).
-- ARGV: 1 token, 2 release channel; for a fair lock also 3 the resource;
--       4 '1' on a Redis Cluster: SPUBLISH (sharded; the channels share the
--         lock's hash tag, so they live on this shard), else PUBLISH.
-- Returns 0 when the lock was not ours, 1 when released, 2 when released
-- and a default-mode waiter was woken by name (the releasing service then
-- gives that waiter a head start before its own next wait: service_impl.hpp).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local publish = ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH'

if KEYS[4] then
  -- Fair: hand the lock straight to the live head of the queue, so the next
  -- holder starts on this message instead of one more round trip. Each entry
  -- is "<ttl> <fence 0|1> <grant channel> <token>"; the grant channel belongs
  -- to the waiter's process, and PUBLISH counting no receiver means that
  -- process is gone (or not listening yet): then the lock is left free with
  -- the head's place kept, as without direct grants, and the head takes it at
  -- its next attempt or its place expires. (The clock and the fence rule are
  -- built in here only: a plain release does not pay for their definitions.)
  --#include redis/scripts/server_time.lua
  --#include lock/scripts/fence_floor.lua
  local now_ms, now_us = server_time()
  while true do
    local head = redis.call('LINDEX', KEYS[2], 0)
    if not head then break end
    local exp = redis.call('ZSCORE', KEYS[3], head)
    if exp and tonumber(exp) > now_ms then
      local ttl, f, chan, tok = string.match(head, '^(%d+) ([01]) (%S+) (%S+)$')
      if not tok then break end
      local fence = -1
      if f == '1' then fence = next_fence(fence_counter(KEYS[4]), now_us) end
      if redis.call(publish, chan, tok .. ' ' .. string.format('%d', fence) .. ' ' .. ARGV[3]) > 0 then
        redis.call('SET', KEYS[1], tok, 'PX', ttl)
        if f == '1' then redis.call('SET', KEYS[4], string.format('%d', fence)) end
        redis.call('LPOP', KEYS[2])
        redis.call('ZREM', KEYS[3], head)
        return 1
      end
      break
    end
    redis.call('LPOP', KEYS[2])
    redis.call('ZREM', KEYS[3], head)
  end
end

redis.call('DEL', KEYS[1])
if KEYS[2] and not KEYS[4] then
  -- Default mode: wake the waiter that has waited longest, not the herd. The
  -- lock is left free (no reservation: that is the fair mode), so a newcomer
  -- may still take it first; the woken waiter is then back in line at its
  -- first arrival (acquire.lua). "wake <id>": a token holds no space, so no
  -- listener takes it for the herd message below. An entry whose waiter has
  -- died wakes nobody: the next waiter's own backoff takes the lock.
  local w = redis.call('ZPOPMIN', KEYS[2])
  if w[1] then
    redis.call(publish, ARGV[2], 'wake ' .. w[1])
    return 2
  end
  return 1
end
-- Wake every plain waiter now instead of at their next backoff (the call
-- without the waiters key: composed finishes, earlier clients).
redis.call(publish, ARGV[2], ARGV[1])
return 1
