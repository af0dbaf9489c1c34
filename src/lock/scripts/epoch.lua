-- Has this server kept its lock state? Compares the server's identity and
-- eviction count with the lock-state record (a hash without TTL) and, when
-- they disagree, starts a quarantine: grants are refused until every lease an
-- earlier incarnation could have granted has expired (docs/lock-safety.md,
-- "Quarantine after lost lock state"). Every client of the server sees it.
-- KEYS: 1 the record. ARGV: 1 max TTL ms, 2 'check' | 'trust' (a server the
-- caller has just started empty: record it as intact) | 'step' (a client saw
-- the server's clock step forward by ARGV[3] ms: keys may have expired early).
-- Returns {epoch id, quarantine ms left, evicted_keys, evicting 0|1, reason, role,
--          redis_version, aof_enabled 0|1, server time µs} (version and aof
--          pick WAIT or WAITAOF for replica-confirmed grants; the time is a
--          sample for the client's clock-step watch).
--#include redis/scripts/server_time.lua
--#include lock/scripts/epoch_id.lua
local function field(text, name) return string.match(text, name .. ':([^\r\n]*)') end
local server = redis.call('INFO', 'server')
local run_id = field(server, 'run_id') or '?'
local version = field(server, 'redis_version') or '?'
local aof = tonumber(field(redis.call('INFO', 'persistence'), 'aof_enabled')) or 0
local repl = redis.call('INFO', 'replication')
local role = field(repl, 'role') or '?'
local evicted = tonumber(field(redis.call('INFO', 'stats'), 'evicted_keys')) or 0
local mem = redis.call('INFO', 'memory')
local policy = field(mem, 'maxmemory_policy') or 'noeviction'
local evicting = (tonumber(field(mem, 'maxmemory')) or 0) > 0 and policy ~= 'noeviction'
local now, now_us = server_time()
if role ~= 'master' then
  return {'', 0, evicted, evicting and 1 or 0, 'the server is a replica', role, version, aof, now_us}
end
local max_ttl = tonumber(ARGV[1])
local rec = redis.call('HMGET', KEYS[1], 'run_id', 'evicted', 'until', 'id', 'reason')
local until_ms = tonumber(rec[3]) or 0
local reason = ''
if ARGV[2] == 'trust' then
  if rec[1] ~= run_id then
    redis.call('HSET', KEYS[1], 'run_id', run_id, 'evicted', evicted, 'until', 0,
               'id', epoch_id(run_id, now_us), 'reason', 'trusted as new')
  end
  rec = redis.call('HMGET', KEYS[1], 'run_id', 'evicted', 'until', 'id', 'reason')
  return {rec[4], 0, evicted, evicting and 1 or 0, '', role, version, aof, now_us}
end
if not rec[1] then
  reason = 'no lock-state record: restarted without persistence, flushed, record evicted, or new to jobguard'
elseif rec[1] ~= run_id then
  reason = 'a different server process (run_id ' .. string.sub(rec[1], 1, 8) .. ' -> ' .. string.sub(run_id, 1, 8) ..
           '): restarted or failed over, recent writes may be lost'
elseif tonumber(rec[2]) ~= evicted then
  reason = 'keys evicted (evicted_keys ' .. tostring(rec[2]) .. ' -> ' .. evicted .. ', maxmemory-policy ' .. policy .. ')'
end
local id = rec[4]
if reason == '' and ARGV[2] == 'step' then
  local stepped = 'the server clock stepped forward by ' .. ARGV[3] .. ' ms: lock keys may have expired early'
  if until_ms > now and string.sub(rec[5] or '', 1, 26) == 'the server clock stepped f' then
    -- Another client found the same step first: its quarantine stands (a
    -- further step during it only moves the deadline), counted once.
    until_ms = math.max(until_ms, now + max_ttl)
    redis.call('HSET', KEYS[1], 'until', string.format('%d', until_ms))
    return {id, until_ms - now, evicted, evicting and 1 or 0, rec[5], role, version, aof, now_us}
  end
  reason = stepped
  redis.call('HINCRBY', KEYS[1], 'clock_steps', 1)
  redis.call('HSET', KEYS[1], 'clock_step_last', ARGV[3] .. ' ' .. string.format('%d', now))
end
if reason ~= '' then
  -- A new epoch: leases granted under the old one are lost, and nobody is
  -- granted anything until the longest lease that could still be alive is over.
  until_ms = math.max(until_ms, now + max_ttl)
  id = epoch_id(run_id, now_us)
  redis.call('HSET', KEYS[1], 'run_id', run_id, 'evicted', evicted, 'until', string.format('%d', until_ms), 'id', id,
             'reason', reason)
elseif until_ms > now then
  reason = rec[5] or 'lock state lost'
end
return {id, math.max(0, until_ms - now), evicted, evicting and 1 or 0, reason, role, version, aof, now_us}
