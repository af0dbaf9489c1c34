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
local n, nk, na, key, arg, parts, num = batch_layout(KEYS, ARGV)
local out, maybe, locks = {}, {}, {}
if nk == 4 and na == 12 then
  for i = 1, n do
    if arg(i, 9) == 'deferred' then
      maybe[#maybe + 1] = i
      locks[#locks + 1] = key(i, 2)
    end
  end
end
local common = {}
if #maybe > 0 then
  local held = redis.call('MGET', unpack(locks))
  local idem, waiters, dels = {}, {}, {}
  for j, i in ipairs(maybe) do
    if held[j] == arg(i, 1) then
      common[#common + 1] = i
      idem[#idem + 1] = key(i, 4)
      waiters[#waiters + 1] = key(i, 3)
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
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local now = string.format('%d', now_ms)
    local done = {1, 1, 1}
    for _, i in ipairs(common) do
      local since = now_ms - num(arg(i, 11))
      local result, keep = arg(i, 4), arg(i, 5)
      redis.call('SET', key(i, 4), idem_value('completed', arg(i, 10), arg(i, 6), string.format('%d', since),
                                              string.format('%d', since + num(arg(i, 12))), now, result),
                 'PX', arg(i, 7))
      if num(keep) > 0 then
        redis.call('SET', key(i, 1), record_value(now, arg(i, 3), result), 'PX', keep)
      else
        redis.call('SET', key(i, 1), record_value(now, arg(i, 3), result))
      end
      out[i] = done
    end
  end
end
for i = 1, n do
  if not out[i] then out[i] = finish_one(parts(i)) end
end
return out
