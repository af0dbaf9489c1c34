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
local n, nk, na, key, arg, parts, num = batch_layout(KEYS, ARGV)
local out, common, look = {}, {}, {}
if nk == 4 and na == 9 then
  for i = 1, n do
    if arg(i, 3) == '0' and arg(i, 9) == 'defer' then
      common[#common + 1] = i
      look[#look + 1] = key(i, 3)
      look[#look + 1] = key(i, 4)
    end
  end
end
if #common > 0 and redis.call('EXISTS', unpack(look)) == 0 then
  -- acquire.lua's eviction check, one INFO for all.
  local ev
  local granted = {1, -1, 'deferred'}
  for _, i in ipairs(common) do
    local want = arg(i, 4)
    if want ~= '' then
      ev = ev or tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
      if ev ~= num(want) then out[i] = {-1, ev} end
    end
    if not out[i] then
      local lock = key(i, 1)
      if redis.call('SET', lock, arg(i, 1), 'NX', 'PX', arg(i, 2)) then
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
