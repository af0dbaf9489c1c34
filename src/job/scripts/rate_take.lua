-- One start under a GCRA rate limit (job/limits.hpp). KEYS[1] holds the
-- theoretical arrival time (TAT) of the next start, in microseconds of the
-- server's clock. ARGV[1]: the spacing between starts, in microseconds.
-- Returns 0 when this start may go (and moves the TAT on), else how many
-- microseconds until it may. The server's TIME, not the worker's: every
-- worker on every host reads one clock.
--#include redis/scripts/server_time.lua
local _, now = server_time()
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat > now then return tat - now end
-- A start a little late (less than one spacing: a timer's or a round trip's
-- delay) keeps the schedule, so those delays do not add up into a lower
-- rate; an idle budget starts again from now, so unused time is never saved
-- up for a burst (the next start is one spacing away either way).
local base = now
if now - tat < interval then base = tat end
local px = math.floor(interval / 1000) + 1000
redis.call('SET', KEYS[1], string.format('%.0f', base + interval), 'PX', px)
return 0
