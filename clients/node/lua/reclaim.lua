-- rsc member script `reclaim` (data plane): entries idle for `min idle ms`, under other consumer
-- names (a member gone) and under this consumer's own (claimed to it by a call whose reply was
-- lost: below what it has read, no read brings them back); the caller drops those it holds
-- itself (queued, being handled, retried later, to acknowledge). Claiming its own resets their
-- idle time. The owner token is checked once there is something to claim: a round with nothing
-- idle (an idle member's every round) costs one command besides the script.
-- KEYS: shard, owners
-- ARGV: consumer group, member id, incarnation, consumer name, min idle ms, count
-- Reply: {{id, fields, deliveries}, ...}; error 'FENCED ...' as `claim`.
-- begin claimed-entries
local function entries(ids)
  local out = {}
  for _, id in ipairs(ids) do
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if #e > 0 then
      local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
      out[#out + 1] = {id, e[1][2], p[1] and p[1][4] or 1}
    end
  end
  return out
end
-- end claimed-entries
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[5], '-', '+', ARGV[6])
local ids = {}
for _, p in ipairs(pending) do ids[#ids + 1] = p[1] end
if #ids == 0 then return {} end
-- begin owner-check
local token = redis.call('HGET', KEYS[2], ARGV[1])
if not token then return redis.error_reply('FENCED no owner') end
local t = cjson.decode(token)
if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
  return redis.error_reply('FENCED owned by another member')
end
-- end owner-check
local args = {KEYS[1], ARGV[1], ARGV[4], ARGV[5]}
for _, id in ipairs(ids) do args[#args + 1] = id end
args[#args + 1] = 'JUSTID'
return entries(redis.call('XCLAIM', unpack(args)))
