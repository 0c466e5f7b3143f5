-- rsc member script `claim` (data plane): a newly owned shard's backlog, what earlier owners
-- read but never acknowledged, claimed to this member (XAUTOCLAIM) before it reads new entries.
-- Claims never count as deliveries (JUSTID): an entry that waited in a queue and was never
-- handed to a handler is not one delivery closer to the dead-letter stream (`start` counts).
-- KEYS: shard, owners
-- ARGV: consumer group, member id, incarnation, consumer name, min idle ms, count, cursor
-- Reply: {next cursor ('0-0': done), {{id, fields, deliveries}, ...}}; error 'FENCED ...' when
-- the owner token is missing or names another member or incarnation.
-- begin owner-check
local token = redis.call('HGET', KEYS[2], ARGV[1])
if not token then return redis.error_reply('FENCED no owner') end
local t = cjson.decode(token)
if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
  return redis.error_reply('FENCED owned by another member')
end
-- end owner-check
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
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[4], ARGV[5], ARGV[7], 'COUNT', ARGV[6], 'JUSTID')
return {r[1], entries(r[2])}
