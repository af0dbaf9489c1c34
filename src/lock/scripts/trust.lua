-- `jobguard server trust`: record a just-provisioned server as having kept its
-- lock state, unless it shows signs of having served locks (docs/lock-safety.md,
-- "Trusting a new server"). Reads INFO and the record and writes it in one
-- script, so no check of another client falls between what was judged and what
-- is written. Writes the fields epoch.lua reads, plus the audit fields trusted_*.
-- KEYS: 1 the record. ARGV: 1 force 0|1, 2 who, 3 why, 4 the client's own signs
-- ("" or one line each, joined by "\n": keys found under the prefix by SCAN),
-- 5 'write' | 'judge' (judge only: 'clean' instead of writing, so a cluster's
-- primaries are all judged before any is written).
-- Returns {outcome, epoch id, server time ms, run_id, signs (array), role,
--          trusted_by, trusted_at, trusted_why}; outcome is
-- 'trusted' (written), 'clean' (judge: would be written), 'already' (the record already says intact: nothing
-- written), 'refused' (signs, no force: nothing written) or 'replica'.
--#include redis/scripts/server_time.lua
--#include lock/scripts/epoch_id.lua
local function field(text, name) return string.match(text, name .. ':([^\r\n]*)') end
local run_id = field(redis.call('INFO', 'server'), 'run_id') or '?'
local repl = redis.call('INFO', 'replication')
local role = field(repl, 'role') or '?'
local evicted = tonumber(field(redis.call('INFO', 'stats'), 'evicted_keys')) or 0
local now, now_us = server_time()
if role ~= 'master' then return {'replica', '', now, run_id, {}, role, '', '', ''} end

local rec = redis.call('HMGET', KEYS[1], 'run_id', 'evicted', 'until', 'id', 'reason')
local until_ms = tonumber(rec[3]) or 0
-- The audit of the trust that began this epoch; none when a later loss
-- (epoch.lua rewrites the record's epoch, not these fields) began another.
local function audit()
  local a = redis.call('HMGET', KEYS[1], 'trusted_by', 'trusted_at', 'trusted_why', 'trusted_id')
  if a[4] ~= rec[4] then return '', '', '' end
  return a[1] or '', a[2] or '', a[3] or ''
end
-- What the gate (epoch.lua) would call intact: this process wrote the record,
-- nothing evicted since, no quarantine running. Nothing to do.
if rec[1] == run_id and tonumber(rec[2]) == evicted and until_ms <= now then
  local by, at, why = audit()
  return {'already', rec[4] or '', now, run_id, {}, role, by, at, why}
end

local signs = {}
if rec[1] and rec[1] ~= run_id then
  signs[#signs + 1] = 'a lock-state record written by another server process (run_id ' .. string.sub(rec[1], 1, 8) ..
                      ', ' .. (rec[5] or '') .. ')'
elseif rec[1] and string.sub(rec[5] or '', 1, 20) ~= 'no lock-state record' then
  -- This process's own record in a quarantine for anything but a missing
  -- record (an eviction): it lost state after it served.
  signs[#signs + 1] = 'a lock-state quarantine of this server process (' .. (rec[5] or '') .. ')'
end
if evicted > 0 then signs[#signs + 1] = evicted .. ' keys evicted since it started (evicted_keys)' end
local stats = redis.call('INFO', 'commandstats')
for _, c in ipairs({'flushall', 'flushdb', 'swapdb'}) do
  local n = tonumber(string.match(stats, 'cmdstat_' .. c .. ':calls=(%d+)')) or 0
  if n > 0 then signs[#signs + 1] = string.upper(c) .. ' ran ' .. n .. ' times (INFO commandstats)' end
end
local replid2 = field(repl, 'master_replid2') or ''
if string.match(replid2, '[1-9a-f]') then
  signs[#signs + 1] = 'it was a replica until promoted (master_replid2 ' .. string.sub(replid2, 1, 8) .. ')'
end
if ARGV[4] ~= '' then
  for line in string.gmatch(ARGV[4], '[^\n]+') do signs[#signs + 1] = line end
end
if #signs > 0 and ARGV[1] ~= '1' then return {'refused', rec[4] or '', now, run_id, signs, role, '', '', ''} end
if ARGV[5] == 'judge' then return {'clean', rec[4] or '', now, run_id, signs, role, '', '', ''} end

local id = epoch_id(run_id, now_us)
redis.call('HSET', KEYS[1], 'run_id', run_id, 'evicted', evicted, 'until', 0, 'id', id, 'reason', 'trusted as new',
           'trusted_by', ARGV[2], 'trusted_at', string.format('%d', now), 'trusted_why', ARGV[3], 'trusted_id', id,
           'trusted_forced', table.concat(signs, '; '))
return {'trusted', id, now, run_id, signs, role, ARGV[2], string.format('%d', now), ARGV[3]}
