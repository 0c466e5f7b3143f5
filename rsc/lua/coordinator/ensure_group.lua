-- rsc coordinator script `ensure_group`: creates a consumer group on a shard key (and the key,
-- MKSTREAM) unless the group exists; an existing group is never moved.
-- KEYS: shard key
-- ARGV: consumer group, start id (where a new group starts reading)
-- Reply: 1 created; 0 when it existed (BUSYGROUP). Any other refusal is raised.
local r = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[2], 'MKSTREAM')
if type(r) == 'table' and r.err then
  if string.sub(r.err, 1, 9) == 'BUSYGROUP' then return 0 end
  return redis.error_reply(r.err)
end
return 1
