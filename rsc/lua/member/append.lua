-- rsc member script `append` (producers, feature level 2): append messages to one shard unless
-- the shard is sealed (it drains: the layout the producer routes with is stale), atomic with the
-- check. One call per shard a publish writes to (the seal is checked once per shard and call).
-- KEYS: shard, its seal (`<shard key>:rsc:v1:seal`)
-- ARGV: the number of messages, then per message the number of its field/value strings followed
--       by those strings, flat (field, value, field, value, ...).
-- Reply: the entry ids, in order; error 'SEALED <shard> drains since layout v<N>' when sealed
-- (nothing appended: route the messages again with the layout of version N or newer).
local sealed = redis.call('GET', KEYS[2])
if sealed then return redis.error_reply('SEALED ' .. KEYS[1] .. ' drains since layout v' .. sealed) end
local ids, at = {}, 2
for n = 1, tonumber(ARGV[1]) do
  local count = tonumber(ARGV[at])
  ids[n] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, at + 1, at + count))
  at = at + count + 1
end
return ids
