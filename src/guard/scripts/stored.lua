-- How an idempotency key and a completion record are stored: one string
-- each, written with one SET … PX. Composed before every script that reads or
-- writes them (src/guard/scripts.hpp, with_stored_format), so the scripts
-- have one reader and one writer of each format. (The record's find reads it
-- too, in C++: src/guard/completion.cpp, parse_find, for a plain GET.)
-- Why strings: as a hash each write would be HSET + PEXPIRE, two commands
-- where one does, and every redis.call is a good part of a guarded job's
-- cost on the server (see docs/bench.md).
--   key:    'i1 <state> <since> <lease_until> <done>\n' .. fp .. '\n' .. owner .. '\n' .. result
--   record: 'r1 <at>\n' .. by .. '\n' .. result
-- Times are the server's ms; <done> is '-' while in progress; the result is
-- the rest, whatever its bytes. The fingerprint, owner and completed_by are
-- the caller's bytes too: when one holds a newline, lengths delimit them
-- instead (the head then ends with them):
--   key:    'i1 <state> <since> <lease_until> <done> <#fp> <#owner>\n' .. fp .. owner .. result
--   record: 'r1 <at> <#by>\n' .. by .. result
-- Not lengths always: Lua makes a number a string with a printf of a double,
-- and three lengths in every head are a measurable share of a guarded job's
-- server cost (see docs/bench.md).
-- The older format stores both as hashes (fields state, fp, owner, since,
-- lease_until, result, done; and at, by, result). Such a key or record is
-- still read here, for as long as its retention keeps it, and a
-- write replaces it with the string (SET replaces a key of any type).

local stored_find = string.find
local function idem_value(state, fp, owner, since, lease_until, done, result)
  if not stored_find(fp, '\n', 1, true) and not stored_find(owner, '\n', 1, true) then
    return 'i1 ' .. state .. ' ' .. since .. ' ' .. lease_until .. ' ' .. done .. '\n' .. fp .. '\n' .. owner .. '\n' ..
           result
  end
  return 'i1 ' .. state .. ' ' .. since .. ' ' .. lease_until .. ' ' .. done .. ' ' .. #fp .. ' ' .. #owner .. '\n' ..
         fp .. owner .. result
end

local function record_value(at, by, result)
  if not stored_find(by, '\n', 1, true) then return 'r1 ' .. at .. '\n' .. by .. '\n' .. result end
  return 'r1 ' .. at .. ' ' .. #by .. '\n' .. by .. result
end

-- The two fields after the head ending at `nl`, separated by newlines; and
-- where the rest begins. nil when they are not there.
local function stored_split2(v, nl)
  local a = string.find(v, '\n', nl + 1, true)
  local b = a and string.find(v, '\n', a + 1, true)
  if not b then return nil end
  return string.sub(v, nl + 1, a - 1), string.sub(v, a + 1, b - 1), b + 1
end

-- GET key; for a hash an older jobguard wrote, nil and the hash's `fields`.
local function stored_get(key, fields)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    if not (v.err and string.find(v.err, 'WRONGTYPE', 1, true)) then error(v) end
    return nil, redis.call('HMGET', key, unpack(fields))
  end
  return v
end

local function unreadable(what, key)
  error({err = 'ERR jobguard: ' .. what .. ' ' .. key .. ' is in a format this jobguard does not read'})
end

-- The key's fields {state, fp, owner, since, lease_until, done, result}, or
-- nil when it does not exist.
local function idem_read(key)
  local v, h = stored_get(key, {'state', 'fp', 'owner', 'since', 'lease_until', 'done', 'result'})
  if h then
    if not h[1] then return nil end
    return {state = h[1], fp = h[2] or '', owner = h[3] or '', since = h[4] or '0', lease_until = h[5] or '0',
            done = h[6] or '-', result = h[7] or ''}
  end
  if not v then return nil end
  local nl = string.find(v, '\n', 1, true)
  if not nl then unreadable('idempotency key', key) end
  local head = string.sub(v, 1, nl - 1)
  local state, since, lease_until, done = string.match(head, '^i1 (%S+) (%d+) (%d+) (%S+)$')
  local fp, owner, rest
  if state then
    fp, owner, rest = stored_split2(v, nl)
  else
    local nfp, nowner
    state, since, lease_until, done, nfp, nowner = string.match(head, '^i1 (%S+) (%d+) (%d+) (%S+) (%d+) (%d+)$')
    if state then
      local o = nl + tonumber(nfp)
      rest = o + tonumber(nowner) + 1
      if rest <= #v + 1 then fp, owner = string.sub(v, nl + 1, o), string.sub(v, o + 1, rest - 1) end
    end
  end
  if not fp then unreadable('idempotency key', key) end
  return {state = state, fp = fp, owner = owner, since = since, lease_until = lease_until, done = done,
          result = string.sub(v, rest)}
end

-- The record's fields {at, by, result}, or nil when it does not exist.
local function record_read(key)
  local v, h = stored_get(key, {'at', 'by', 'result'})
  if h then
    if not h[1] then return nil end
    return {at = h[1], by = h[2] or '', result = h[3] or ''}
  end
  if not v then return nil end
  local nl = string.find(v, '\n', 1, true)
  if not nl then unreadable('completion record', key) end
  local head = string.sub(v, 1, nl - 1)
  local at = string.match(head, '^r1 (%d+)$')
  local by, rest
  if at then
    local b = string.find(v, '\n', nl + 1, true)
    if b then by, rest = string.sub(v, nl + 1, b - 1), b + 1 end
  else
    local nby
    at, nby = string.match(head, '^r1 (%d+) (%d+)$')
    if at then
      rest = nl + tonumber(nby) + 1
      if rest <= #v + 1 then by = string.sub(v, nl + 1, rest - 1) end
    end
  end
  if not by then unreadable('completion record', key) end
  return {at = at, by = by, result = string.sub(v, rest)}
end
