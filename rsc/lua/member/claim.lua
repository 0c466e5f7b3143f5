-- rsc member script `claim` (data plane): a newly owned shard's backlog, what earlier owners
-- read but never acknowledged, claimed to this member (XAUTOCLAIM) before it reads new entries.
-- Claims never count as deliveries (JUSTID): an entry that waited in a queue and was never
-- handed to a handler is not one delivery closer to the dead-letter stream (`start` counts).
-- KEYS: shard, owners
-- ARGV: consumer group, member id, incarnation, consumer name, min idle ms, count, cursor, and
--       optionally '1': read new entries too, in the same call, once the backlog is done
-- Reply: {next cursor ('0-0': done), {{id, fields, deliveries}, ...}}; error 'FENCED ...' when
-- the owner token is missing or names another member or incarnation. With the eighth argument,
-- two more: the new entries read after the backlog (XREADGROUP '>', up to count less those
-- claimed; none while the backlog is not done) and, when that read caught up, the stream's
-- last id ('0-0' when it has none) as `read.lua` gives it, else ''. A newly owned shard's first
-- entries then come in one round trip, not two.
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
local claimed = entries(r[2])
if ARGV[8] ~= '1' then return {r[1], claimed} end
local room = tonumber(ARGV[6]) - #r[2]
if r[1] ~= '0-0' or room <= 0 then return {r[1], claimed, {}, ''} end
-- (an XREADGROUP that finds nothing new creates no consumer: the new owner's is made here, as a
-- read of its own history would make it; where an ACL refuses that, at its first entry)
redis.pcall('XGROUP', 'CREATECONSUMER', KEYS[1], ARGV[1], ARGV[4])
local new = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[4], 'COUNT', room, 'STREAMS', KEYS[1], '>')
local fresh = new and new[1] and new[1][2] or {}
if #fresh < room then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  return {r[1], claimed, fresh, last[1] and last[1][1] or '0-0'}
end
return {r[1], claimed, fresh, ''}
