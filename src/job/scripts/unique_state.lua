-- Where a stream entry stands for consumer group `group`: 'waiting' (in the
-- stream, not yet delivered), 'delivered' (in the group's pending list:
-- running, or stalled until reclaimed), or 'gone' (deleted, or delivered and
-- acknowledged: done or dead-lettered). A unique lock whose holder is gone
-- is an orphan: nothing will ever release it. Composed before the unique
-- scripts as unique_state(stream, group, id).
local function id_before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return false end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
local function unique_state(stream, group, id)
  if #redis.call('XRANGE', stream, id, id) == 0 then return 'gone' end
  local pending = redis.pcall('XPENDING', stream, group, id, id, 1)
  if type(pending) == 'table' and pending.err == nil and #pending > 0 then return 'delivered' end
  local last = nil
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) == 'table' and groups.err == nil then
    for _, g in ipairs(groups) do
      local name, delivered
      for i = 1, #g, 2 do
        if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
      end
      if name == group then last = delivered end
    end
  end
  -- No such group yet: nothing was delivered.
  if last == nil or id_before(last, id) then return 'waiting' end
  return 'gone'
end
