-- Where each call's keys and arguments are in a batch of calls
-- (claim_many.lua, finish_many.lua); composed before them as
-- batch_layout(KEYS, ARGV).
-- ARGV: 1 n, the calls; 2..n+1 each call's key count; n+2..2n+1 each call's
--       argument count; then every call's arguments, in call order.
-- KEYS: every call's keys, in call order.
-- Returns n; each call's first key's and first argument's index; its key
-- and argument counts; parts(i), call i's own KEYS and ARGV as tables; and
-- num, tonumber remembered.
-- num(s) is tonumber(s) remembered for the call: a batch's counts, TTLs and
-- retentions repeat, and tonumber is a strtod on the server (about 500
-- instructions; a batch of 16 would make some 80 of them).
local memo = {}
local function num(s)
  local v = memo[s]
  if not v then
    v = tonumber(s)
    memo[s] = v
  end
  return v
end
local n = tonumber(ARGV[1])
local kat, aat, nk, na = {}, {}, {}, {}
local k, a = 1, 2 * n + 2
for i = 1, n do
  nk[i] = num(ARGV[1 + i])
  na[i] = num(ARGV[1 + n + i])
  kat[i] = k
  aat[i] = a
  k = k + nk[i]
  a = a + na[i]
end
local function parts(i)
  local ks, as = {}, {}
  for j = 1, nk[i] do ks[j] = KEYS[kat[i] + j - 1] end
  for j = 1, na[i] do as[j] = ARGV[aat[i] + j - 1] end
  return ks, as
end
return n, kat, aat, nk, na, parts, num
