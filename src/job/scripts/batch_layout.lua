-- Where each call's keys and arguments are in a batch of calls
-- (claim_many.lua, finish_many.lua; written by ScriptBatcher::encode in
-- src/job/fused.cpp); composed before them as batch_layout(KEYS, ARGV).
-- Every call of a batch has the same number of keys and of arguments.
-- ARGV: 1 n, the calls; 2 their key count; 3 their argument count; 4 a mask
--       with one character per argument position, 's' when every call has
--       the same value there (sent once), 'p' when not; then the shared
--       values, in position order; then each call's own ('p') values, call
--       by call.
-- KEYS: every call's keys, in call order.
-- Why shared values: each argument is a string the server parses, copies and
-- makes a Lua string, and most of a guarded job's claim and finish arguments
-- are the same for every job (TTLs, retention, flags; see docs/bench.md).
-- Returns n; nk; na; key(i, j), call i's j-th key; arg(i, j), its j-th
-- argument; parts(i), its own KEYS and ARGV as tables; num, tonumber
-- remembered for the call (a batch's counts and TTLs repeat, and tonumber is
-- a strtod on the server); and shared, at, np, which arg(i, j) reads:
-- call i's j-th argument is shared[j] or ARGV[at[j] + (i - 1) * np], for a
-- loop over many calls to read without a function call each time.
local memo = {}
local function num(s)
  local v = memo[s]
  if not v then
    v = tonumber(s)
    memo[s] = v
  end
  return v
end
local n, nk, na, mask = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
-- shared[j]: the value every call has at j; at[j]: else where position j of
-- call 1 is (call i's is at[j] + (i - 1) * np).
local shared, at = {}, {}
local s, np = 5, 0
for j = 1, na do
  if string.byte(mask, j) == 115 then -- 's'
    shared[j] = ARGV[s]
    s = s + 1
  else
    np = np + 1
    at[j] = np
  end
end
for j = 1, na do
  if at[j] then at[j] = at[j] + s - 1 end
end
local function key(i, j) return KEYS[(i - 1) * nk + j] end
local function arg(i, j) return shared[j] or ARGV[at[j] + (i - 1) * np] end
local function parts(i)
  local ks, as = {}, {}
  for j = 1, nk do ks[j] = KEYS[(i - 1) * nk + j] end
  for j = 1, na do as[j] = arg(i, j) end
  return ks, as
end
return n, nk, na, key, arg, parts, num, shared, at, np
