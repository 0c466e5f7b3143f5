-- rsc coordinator script `drain_evidence`: the drain evidence of one shard, read on its own node
-- in one step: whether it is sealed, its last entry, and per consumer group on the key what is
-- pending and whether anything is left to deliver after its last-delivered id.
-- KEYS: shard key, its seal key (same slot)
-- ARGV: none
-- Reply: {sealed 0/1, the stream's last entry id ('' if the key does not exist or is empty),
--         per consumer group {name, pending, entries after its last-delivered id (0/1)}}.
local sealed = redis.call('EXISTS', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {sealed, '', {}} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local groups = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local after = redis.call('XRANGE', KEYS[1], '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
  groups[#groups + 1] = {info['name'], info['pending'], #after}
end
return {sealed, last[1] and last[1][1] or '', groups}
