-- rsc coordinator script `destroy_group`: deletes a group's owner token on a shard, and destroys
-- its consumer group (with its pending entries) on the shard key if both exist.
-- KEYS: shard key, its owner-token hash (same slot)
-- ARGV: consumer group
-- Reply: 1 destroyed; 0 when the key or the group did not exist.
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1])
