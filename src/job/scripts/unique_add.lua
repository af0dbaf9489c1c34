-- Adds a job under a unique lock, atomically: the entry and the lock (whose
-- value is the entry id: the job's own token) appear together or not at all.
-- KEYS: 1 stream, 2 the unique lock, 3 the registry of locks the reaper
--       watches (one slot with the stream: the keys share its hash tag).
-- ARGV: 1 group, 2 lock TTL in ms (0: none), 3 on conflict (reject,
--       replace, log), 4 '1' to register the lock with the reaper (a lock
--       that must outlive its job, until-expired, is not), 5 '1' when the
--       lock holds until its TTL whatever its job did (until-expired), then
--       the fields, name and value in turn.
-- Returns {outcome, new id or '', the holder's id or '', the holder's state}:
--   added: no lock, or an orphaned one (its job gone) taken over;
--   replaced: the holder had not been delivered, and was deleted;
--   conflict: the holder is waiting or running (or, until-expired, anything).
local holder = redis.call('GET', KEYS[2])
local taken_from, state = '', ''
if holder then
  state = unique_state(KEYS[1], ARGV[1], holder)
  if state ~= 'gone' or ARGV[5] == '1' then
    if ARGV[3] == 'replace' and state == 'waiting' then
      redis.call('XDEL', KEYS[1], holder)
      taken_from = holder
    else
      return {'conflict', '', holder, state}
    end
  else
    taken_from = holder
  end
end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[2], id, 'PX', ttl)
else
  redis.call('SET', KEYS[2], id)
end
if ARGV[4] == '1' then redis.call('SADD', KEYS[3], KEYS[2]) end
if taken_from ~= '' and state == 'waiting' then return {'replaced', id, taken_from, state} end
return {'added', id, taken_from, state}
