-- One step of the reaper: looks at up to ARGV[3] registered unique locks from
-- cursor ARGV[2] and frees those whose job is gone (deleted, or acknowledged
-- without its lock released: a worker killed between its XACK and the
-- release). Locks already gone (released, expired) leave the registry.
-- The locks are registry members, in the stream's slot by construction.
-- KEYS: 1 registry, 2 stream. ARGV: 1 group, 2 cursor, 3 count.
-- Returns {next cursor, {lock, holder id, lock, holder id, ...}}.
local scan = redis.call('SSCAN', KEYS[1], ARGV[2], 'COUNT', tonumber(ARGV[3]))
local reaped = {}
for _, lock in ipairs(scan[2]) do
  local holder = redis.call('GET', lock)
  if not holder then
    redis.call('SREM', KEYS[1], lock)
  elseif unique_state(KEYS[2], ARGV[1], holder) == 'gone' then
    redis.call('DEL', lock)
    redis.call('SREM', KEYS[1], lock)
    reaped[#reaped + 1] = lock
    reaped[#reaped + 1] = holder
  end
end
return {scan[1], reaped}
