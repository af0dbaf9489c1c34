-- How an idempotency key and a completion record are stored: one string
-- each, written with one SET … PX. Composed before every script that reads or
-- writes them (src/guard/scripts.hpp, with_stored_format), so there is one
-- reader and one writer of each format.
-- Why strings: as hashes each write was HSET + PEXPIRE, two of the five
-- commands a guarded job's scripts make, and every redis.call is a good part
-- of the job's cost on the server (docs/bench.md).
--   key:    'i1 <state> <since> <lease_until> <done> <#fp> <#owner>\n' .. fp .. owner .. result
--   record: 'r1 <at> <#by>\n' .. by .. result
-- Times are the server's ms; <done> is '-' while in progress. Lengths, not
-- separators, delimit the fingerprint, owner and completed_by: they are the
-- caller's bytes (a newline, a space, a NUL); the result is the rest.
-- jobguard before this format wrote both as hashes (fields state, fp,
-- owner, since, lease_until, result, done; and at, by, result). Such a key or
-- record is still read here, for as long as its retention keeps it, and a
-- write replaces it with the string (SET replaces a key of any type).

local function idem_value(state, fp, owner, since, lease_until, done, result)
  return 'i1 ' .. state .. ' ' .. since .. ' ' .. lease_until .. ' ' .. done .. ' ' .. #fp .. ' ' .. #owner .. '\n' ..
         fp .. owner .. result
end

local function record_value(at, by, result)
  return 'r1 ' .. at .. ' ' .. #by .. '\n' .. by .. result
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
  local state, since, lease_until, done, nfp, nowner =
    string.match(string.sub(v, 1, nl - 1), '^i1 (%S+) (%d+) (%d+) (%S+) (%d+) (%d+)$')
  if not state then unreadable('idempotency key', key) end
  local o = nl + tonumber(nfp)
  local r = o + tonumber(nowner)
  if r > #v then unreadable('idempotency key', key) end
  return {state = state, fp = string.sub(v, nl + 1, o), owner = string.sub(v, o + 1, r), since = since,
          lease_until = lease_until, done = done, result = string.sub(v, r + 1)}
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
  local at, nby = string.match(string.sub(v, 1, nl - 1), '^r1 (%d+) (%d+)$')
  if not at then unreadable('completion record', key) end
  local b = nl + tonumber(nby)
  if b > #v then unreadable('completion record', key) end
  return {at = at, by = string.sub(v, nl + 1, b), result = string.sub(v, b + 1)}
end
