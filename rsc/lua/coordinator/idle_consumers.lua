-- rsc coordinator script `idle_consumers`: the consumers of a group on one shard that have
-- nothing pending: the candidates for pruning (the coordinator keeps the live members' names
-- and asks `prune_consumers` to delete the rest).
-- KEYS: shard key
-- ARGV: consumer group
-- Reply: the names (empty when the key or the group does not exist).
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return {} end
local idle = {}
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if tonumber(info['pending']) == 0 then idle[#idle + 1] = info['name'] end
end
return idle
