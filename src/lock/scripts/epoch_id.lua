-- A lock-state epoch's id (the record's `id`, LockInfo's epoch): the server
-- process (the first 8 characters of its run_id) and the server's clock, in
-- seconds and microseconds, when the epoch began.
local function epoch_id(run_id, now_us)
  return string.format('%s.%d.%d', run_id:sub(1, 8), math.floor(now_us / 1000000), now_us % 1000000)
end
