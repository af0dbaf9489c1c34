-- Several guarded jobs' finishes (finish.lua) in one call: the runner's calls
-- made in one turn of the event loop, gathered by src/job/fused.cpp. Composed
-- after idempotency_complete.lua, completion_record.lua, release.lua,
-- finish.lua as finish_one(KEYS, ARGV) and batch_layout.lua.
-- ARGV, KEYS: each call's finish.lua ones, laid out as batch_layout.lua says.
-- Returns n replies, each what finish.lua returns for that call.
-- The common finish (deferred form, our lock still held, the key still
-- missing) is made here with one MGET, one EXISTS and one DEL for all of them
-- and the key's and the record's writes each; the waiters are popped only
-- when some exist. Its outcome is finish.lua's for that case: the key
-- written as completed, the record written without a read (finish.lua's
-- 'absent'), the lock released ({1, 1, 1}). Any other goes to finish_one.
-- The calls were made concurrently, so any order of them is one the caller
-- could have seen: the common ones go first. Each holds its own lock, so
-- their keys are apart (the record's and the key's names hold the lock's
-- resource), and none reads what another writes.
-- Call i's j-th argument is read inline as `s_j or ARGV[a_j + (i - 1) * np]`
-- (batch_layout.lua), not through arg(i, j): a Lua function call is some
-- hundreds of server instructions, and the common finish would read sixteen
-- arguments a job that way (see docs/bench.md).
--#include redis/scripts/server_time.lua
local n, nk, na, key, arg, parts, num, sh, at, np = batch_layout(KEYS, ARGV)
local out, maybe, locks = {}, {}, {}
if nk == 4 and na == 12 then
  local s9, a9 = sh[9], at[9]
  for i = 1, n do
    if (s9 or ARGV[a9 + (i - 1) * np]) == 'deferred' then
      maybe[#maybe + 1] = i
      locks[#locks + 1] = KEYS[(i - 1) * 4 + 2]
    end
  end
end
local common = {}
if #maybe > 0 then
  local held = redis.call('MGET', unpack(locks))
  local idem, waiters, dels = {}, {}, {}
  local s1, a1 = sh[1], at[1]
  for j, i in ipairs(maybe) do
    if held[j] == (s1 or ARGV[a1 + (i - 1) * np]) then
      common[#common + 1] = i
      idem[#idem + 1] = KEYS[(i - 1) * 4 + 4]
      waiters[#waiters + 1] = KEYS[(i - 1) * 4 + 3]
      dels[#dels + 1] = locks[j]
    end
  end
  if #common > 0 and redis.call('EXISTS', unpack(idem)) ~= 0 then common = {} end
  if #common > 0 then
    redis.call('DEL', unpack(dels))
    if redis.call('EXISTS', unpack(waiters)) ~= 0 then
      -- release.lua's default-mode wake, for each lock that has a line.
      for _, i in ipairs(common) do
        local w = redis.call('ZPOPMIN', key(i, 3))
        if w[1] then redis.call(arg(i, 8) == '1' and 'SPUBLISH' or 'PUBLISH', arg(i, 2), 'wake ' .. w[1]) end
      end
    end
    local now_ms = server_time()
    local format = string.format
    local now = format('%d', now_ms)
    local done = {1, 1, 1}
    local s3, a3, s4, a4, s5, a5, s6, a6 = sh[3], at[3], sh[4], at[4], sh[5], at[5], sh[6], at[6]
    local s7, a7, s10, a10, s11, a11, s12, a12 = sh[7], at[7], sh[10], at[10], sh[11], at[11], sh[12], at[12]
    for _, i in ipairs(common) do
      local o, k = (i - 1) * np, (i - 1) * 4
      local since = now_ms - num(s11 or ARGV[a11 + o])
      local result, keep = s4 or ARGV[a4 + o], s5 or ARGV[a5 + o]
      redis.call('SET', KEYS[k + 4],
                 idem_value('completed', s10 or ARGV[a10 + o], s6 or ARGV[a6 + o], format('%d', since),
                            format('%d', since + num(s12 or ARGV[a12 + o])), now, result),
                 'PX', s7 or ARGV[a7 + o])
      if num(keep) > 0 then
        redis.call('SET', KEYS[k + 1], record_value(now, s3 or ARGV[a3 + o], result), 'PX', keep)
      else
        redis.call('SET', KEYS[k + 1], record_value(now, s3 or ARGV[a3 + o], result))
      end
      out[i] = done
    end
  end
end
for i = 1, n do
  if not out[i] then out[i] = finish_one(parts(i)) end
end
return out
