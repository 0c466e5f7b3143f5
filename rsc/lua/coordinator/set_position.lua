-- rsc coordinator script `set_position` (feature level 7): set one consumer group's position on
-- one shard key, fenced, only while no member holds the shard for the group: the group is
-- created again at the new last-delivered id (with its entries-read when known, so that its lag
-- stays known), which drops its pending entries (after a reset nothing older is delivered
-- again) and its consumers (members re-create theirs).
-- KEYS: the shard's owner-token hash (the fence), the shard key (same slot)
-- ARGV: fence field, coordinator token ('' = no fencing), consumer group, the new last-delivered
--       id, its entries-read ('' unknown)
-- Reply: the pending entries dropped; refused with 'FENCED owner token of <key> fence <stored>'
-- when fenced, 'OWNED <key> is held for <group>' while a member holds it, 'MISSING <key>' when
-- the key does not exist.
-- begin owner-fence
if ARGV[2] ~= '' then
  local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
  local writer = tonumber(ARGV[2])
  if writer < stored then
    return redis.error_reply('FENCED owner token of ' .. KEYS[1] .. ' fence ' .. stored)
  end
  if writer > stored then redis.call('HSET', KEYS[1], ARGV[1], writer) end
end
-- end owner-fence
if redis.call('HEXISTS', KEYS[1], ARGV[3]) == 1 then
  return redis.error_reply('OWNED ' .. KEYS[2] .. ' is held for ' .. ARGV[3])
end
if redis.call('EXISTS', KEYS[2]) == 0 then return redis.error_reply('MISSING ' .. KEYS[2]) end
local pending = 0
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
  local group = {}
  for i = 1, #g, 2 do group[g[i]] = g[i + 1] end
  if group['name'] == ARGV[3] then
    pending = group['pending']
    redis.call('XGROUP', 'DESTROY', KEYS[2], ARGV[3])
  end
end
if ARGV[5] ~= '' then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[3], ARGV[4], 'ENTRIESREAD', ARGV[5])
else
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[3], ARGV[4])
end
return pending
