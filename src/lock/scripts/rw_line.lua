-- The read-write line is three sorted sets that must agree: the places
-- (waiter id -> arrival), their liveness (id -> expiry) and the writers among
-- them (writer id -> the same arrival). Readers compare their arrival with
-- the first writer's, and the head of the places goes first: an entry
-- left in one set without the others (a leave whose last removal never
-- reached the server, a place re-added after its key expired) would stop
-- every reader behind it, and the writers behind those readers, with nobody
-- refreshing it, for as long as other writers keep the set alive. So the
-- first writer and the head are kept true here: an entry without a place
-- and a liveness goes, a writer's arrival is the one its place holds.
-- Bounded: at most a few repairs a call, the rest on later calls.
local function rw_drop(line, live, writers, id)
  redis.call('ZREM', line, id)
  redis.call('ZREM', live, id)
  redis.call('ZREM', writers, id)
end

-- The first waiting writer's arrival (a number), nil when none waits.
local function rw_first_writer(line, live, writers)
  for _ = 1, 8 do
    local f = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
    if not f[2] then return nil end
    local placed = redis.call('ZSCORE', line, f[1])
    if placed and redis.call('ZSCORE', live, f[1]) then
      if tonumber(placed) == tonumber(f[2]) then return tonumber(f[2]) end
      redis.call('ZADD', writers, placed, f[1])
    else
      rw_drop(line, live, writers, f[1])
    end
  end
  local f = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
  if f[2] then return tonumber(f[2]) end
  return nil
end

-- The head of the line, after dropping heads without a liveness entry.
local function rw_head(line, live, writers)
  for _ = 1, 8 do
    local h = redis.call('ZRANGE', line, 0, 0)
    if not h[1] or redis.call('ZSCORE', live, h[1]) then return h[1] end
    rw_drop(line, live, writers, h[1])
  end
  return redis.call('ZRANGE', line, 0, 0)[1]
end
