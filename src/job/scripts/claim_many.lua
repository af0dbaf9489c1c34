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
local n, kat, aat, nk, na, parts = batch_layout(KEYS, ARGV)
local out, common, look = {}, {}, {}
for i = 1, n do
  local x = aat[i]
  if nk[i] == 4 and na[i] == 9 and ARGV[x + 2] == '0' and ARGV[x + 8] == 'defer' then
    common[#common + 1] = i
    look[#look + 1] = KEYS[kat[i] + 2]
    look[#look + 1] = KEYS[kat[i] + 3]
  end
end
if #common > 0 and redis.call('EXISTS', unpack(look)) == 0 then
  -- acquire.lua's eviction check, one INFO for all.
  local ev
  for _, i in ipairs(common) do
    local x = aat[i]
    local want = ARGV[x + 3]
    if want ~= '' then
      ev = ev or tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
      if ev ~= tonumber(want) then out[i] = {-1, ev} end
    end
    if not out[i] then
      local lock = KEYS[kat[i]]
      if redis.call('SET', lock, ARGV[x], 'NX', 'PX', ARGV[x + 1]) then
        out[i] = {1, -1, 'deferred'}
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
