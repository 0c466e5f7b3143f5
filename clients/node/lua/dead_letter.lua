-- rsc member script `dead_letter` (data plane): move an entry that failed `max deliveries` times
-- to the shard's dead-letter stream (`<shard key>:dlq`, same hash slot) and acknowledge it, at
-- once. Idempotent: an entry no longer pending (a retry after a lost reply) is not moved twice.
-- KEYS: shard, owners, dead letters
-- ARGV: consumer group, member id, incarnation, entry id, deliveries, field, value, ...
-- Reply: 1 if moved, 0 if it was no longer pending; error 'FENCED ...' as `claim`.
-- begin owner-check
local token = redis.call('HGET', KEYS[2], ARGV[1])
if not token then return redis.error_reply('FENCED no owner') end
local t = cjson.decode(token)
if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
  return redis.error_reply('FENCED owned by another member')
end
-- end owner-check
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[4], ARGV[4], 1) == 0 then return 0 end
redis.call('XADD', KEYS[3], '*', 'rscSourceId', ARGV[4], 'rscDeliveries', ARGV[5], unpack(ARGV, 6))
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[4])
