-- rsc member script `append` (producers, feature level 5): append messages to one shard unless
-- the shard is sealed (it drains: the layout the producer routes with is stale) or full (its
-- retention policy caps it with `whenFull: refuse`), atomic with the checks. One call per shard a
-- publish writes to (seal and cap are checked once per shard and call).
-- KEYS: shard, its seal (`<shard key>:rsc:v1:seal`), its cap (`<shard key>:rsc:v1:cap`)
-- ARGV: the number of messages, then per message the number of its field/value strings followed
--       by those strings, flat (field, value, field, value, ...).
-- Reply: the entry ids, in order; error 'SEALED <shard> drains since layout v<N>' when sealed
-- (nothing appended: route the messages again with the layout of version N or newer); error
-- 'FULL <shard> holds <length> of <cap> entries' when the messages would take the shard past
-- its cap (nothing appended: try again once the group has consumed and retention made room).
local sealed = redis.call('GET', KEYS[2])
if sealed then return redis.error_reply('SEALED ' .. KEYS[1] .. ' drains since layout v' .. sealed) end
local cap = redis.call('GET', KEYS[3])
if cap then
  local length = redis.call('XLEN', KEYS[1])
  if length + tonumber(ARGV[1]) > tonumber(cap) then
    return redis.error_reply('FULL ' .. KEYS[1] .. ' holds ' .. length .. ' of ' .. cap .. ' entries')
  end
end
local ids, at = {}, 2
for n = 1, tonumber(ARGV[1]) do
  local count = tonumber(ARGV[at])
  ids[n] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, at + 1, at + count))
  at = at + count + 1
end
return ids
