-- A waiter of a read-write lock that gives up leaves the line: its place,
-- its liveness and its place among the writers, in one step (rw_line.lua:
-- one left behind alone would stop the line).
-- KEYS: 1 waiters' line, 2 the line's liveness, 3 the writers in the line
-- ARGV: 1 the waiter's id
for i = 1, 3 do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 1
