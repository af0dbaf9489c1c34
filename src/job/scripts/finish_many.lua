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
local n, kat, aat, nk, na, parts, num = batch_layout(KEYS, ARGV)
local out, maybe, locks = {}, {}, {}
for i = 1, n do
  if nk[i] == 4 and na[i] == 12 and ARGV[aat[i] + 8] == 'deferred' then
    maybe[#maybe + 1] = i
    locks[#locks + 1] = KEYS[kat[i] + 1]
  end
end
local common = {}
if #maybe > 0 then
  local held = redis.call('MGET', unpack(locks))
  local idem, waiters, dels = {}, {}, {}
  for j, i in ipairs(maybe) do
    if held[j] == ARGV[aat[i]] then
      common[#common + 1] = i
      idem[#idem + 1] = KEYS[kat[i] + 3]
      waiters[#waiters + 1] = KEYS[kat[i] + 2]
      dels[#dels + 1] = locks[j]
    end
  end
  if #common > 0 and redis.call('EXISTS', unpack(idem)) ~= 0 then common = {} end
  if #common > 0 then
    redis.call('DEL', unpack(dels))
    if redis.call('EXISTS', unpack(waiters)) ~= 0 then
      -- release.lua's default-mode wake, for each lock that has a line.
      for _, i in ipairs(common) do
        local x = aat[i]
        local w = redis.call('ZPOPMIN', KEYS[kat[i] + 2])
        if w[1] then redis.call(ARGV[x + 7] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[x + 1], 'wake ' .. w[1]) end
      end
    end
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local now = string.format('%d', now_ms)
    local done = {1, 1, 1}
    for _, i in ipairs(common) do
      local x, y = aat[i], kat[i]
      local since = now_ms - num(ARGV[x + 10])
      redis.call('SET', KEYS[y + 3], idem_value('completed', ARGV[x + 9], ARGV[x + 5], string.format('%d', since),
                                                string.format('%d', since + num(ARGV[x + 11])), now, ARGV[x + 3]),
                 'PX', ARGV[x + 6])
      if num(ARGV[x + 4]) > 0 then
        redis.call('SET', KEYS[y], record_value(now, ARGV[x + 2], ARGV[x + 3]), 'PX', ARGV[x + 4])
      else
        redis.call('SET', KEYS[y], record_value(now, ARGV[x + 2], ARGV[x + 3]))
      end
      out[i] = done
    end
  end
end
for i = 1, n do
  if not out[i] then out[i] = finish_one(parts(i)) end
end
return out
