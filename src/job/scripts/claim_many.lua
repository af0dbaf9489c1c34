-- Several guarded jobs' claims (claim.lua) in one call: the runner's calls
-- made in one turn of the event loop, gathered by src/job/fused.cpp. Composed
-- after acquire.lua, idempotency_begin.lua, claim.lua as claim_one(KEYS,
-- ARGV) and batch_layout.lua.
-- ARGV, KEYS: each call's claim.lua ones, laid out as batch_layout.lua says.
-- Returns n replies, each what claim.lua returns for that call.
-- Why not claim_one n times: each redis.call and each table the composed
-- functions build is a good part of a claim's cost on the server. The common
-- claim (a unit's first run: a key, its write deferred, no fence) is made
-- here with one EXISTS for all of them and one SET each; any other, or any
-- whose record or key exists, goes to claim_one. The calls were made
-- concurrently, so any order of them is one the caller could have seen: the
-- common ones go first. Their checks read nothing another common one writes
-- (each writes only its own lock; a second claim of the same lock is busy, as
-- it would be after the first).
-- Arguments are read inline, as finish_many.lua says why.
local n, nk, na, _, _, parts, num, sh, at, np = batch_layout(KEYS, ARGV)
local out, common, look = {}, {}, {}
if nk == 5 and na == 10 then
  local s3, a3, s10, a10 = sh[3], at[3], sh[10], at[10]
  for i = 1, n do
    local o = (i - 1) * np
    if (s3 or ARGV[a3 + o]) == '0' and (s10 or ARGV[a10 + o]) == 'defer' then
      common[#common + 1] = i
      look[#look + 1] = KEYS[(i - 1) * 5 + 4]
      look[#look + 1] = KEYS[(i - 1) * 5 + 5]
    end
  end
end
if #common > 0 and redis.call('EXISTS', unpack(look)) == 0 then
  -- acquire.lua's eviction check and epoch comparison (epoch_moved.lua),
  -- one INFO and one HGET for all (every call names the same record).
  local ev, id
  local granted = {1, -1, 'deferred'}
  local s1, a1, s2, a2, s4, a4, s5, a5 = sh[1], at[1], sh[2], at[2], sh[4], at[4], sh[5], at[5]
  for _, i in ipairs(common) do
    local o = (i - 1) * np
    local want = s4 or ARGV[a4 + o]
    if want ~= '' then
      ev = ev or tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
      if ev ~= num(want) then out[i] = {-1, ev} end
    end
    local epoch = s5 or ARGV[a5 + o]
    if not out[i] and epoch ~= '' then
      id = id or redis.call('HGET', KEYS[(i - 1) * 5 + 3], 'id') or ''
      if id ~= epoch then out[i] = {-1, -1} end
    end
    if not out[i] then
      local lock = KEYS[(i - 1) * 5 + 1]
      if redis.call('SET', lock, s1 or ARGV[a1 + o], 'NX', 'PX', s2 or ARGV[a2 + o]) then
        out[i] = granted
      else
        out[i] = {0, redis.call('PTTL', lock)}
      end
    end
  end
end
for i = 1, n do
  if not out[i] then out[i] = claim_one(parts(i)) end
end
return out
