-- rsc member script `start` (data plane): a handler starts on a redelivered entry: count the
-- delivery first (XCLAIM to itself increments it), so a crash in the handler counts too.
-- KEYS: shard, owners
-- ARGV: consumer group, member id, incarnation, consumer name, entry id
-- Reply: the delivery count, or 0 when the entry is no longer pending under this consumer;
-- error 'FENCED ...' as `claim`.
-- begin owner-check
local token = redis.call('HGET', KEYS[2], ARGV[1])
if not token then return redis.error_reply('FENCED no owner') end
local t = cjson.decode(token)
if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
  return redis.error_reply('FENCED owned by another member')
end
-- end owner-check
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[5], ARGV[5], 1)
if #p == 0 or p[1][2] ~= ARGV[4] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[4], 0, ARGV[5], 'RETRYCOUNT', p[1][4] + 1, 'JUSTID')
return p[1][4] + 1
