-- The fencing token rule, for every script that issues one: one above the
-- counter, and never below the server's clock in microseconds, so a counter
-- lost to a restart without persistence, or to failover onto a lagging
-- replica, still issues a token above every token issued before
-- (docs/fencing.md). fence_counter reads a counter key (0 when unset).
local function fence_counter(key) return tonumber(redis.call('GET', key) or '0') or 0 end
local function next_fence(counter, now_us) return math.max(counter + 1, now_us) end
