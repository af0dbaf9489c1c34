-- The clock of the server that runs the script (TIME), never a client's:
-- every deadline and fence a key holds is read off the one clock of the
-- server that stores it, so clients whose clocks disagree still agree on
-- them. Milliseconds and microseconds since the epoch, both exact in a Lua
-- number (below 2^53). Each redis.call is a good part of a short script's
-- cost: a script reads the clock once and keeps both.
local function server_time()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
