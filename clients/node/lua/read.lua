-- rsc member script `read` (data plane): new entries of several shards, each checked against its
-- own owner token, in one call (all the shards of a member on a standalone Redis; on a cluster,
-- those of one hash slot).
-- KEYS: shard, owners, shard, owners, ...
-- ARGV: consumer group, member id, incarnation, consumer name, then per shard: count, highest id
--       received, known tail ('' if none).
-- Reply: per shard {refusal or '', entries, tail}. A refusal ('FENCED ...', or the error of a
-- command that failed there) concerns that shard only. A shard whose last entry is still its
-- known tail is not read at all (nothing was appended since a read caught up: the read sent
-- behind a wake-up read that timed out).
-- Idempotent: entries a read delivered but whose reply was lost (a timeout, a dropped
-- connection) are pending under this consumer past the highest id it received: they come first
-- (from its own history), so nothing stays pending unseen. Normally that history is empty.
-- `tail` is the id of the stream's last entry ('0-0' when it has none) when the read caught up
-- (fewer than `count` new entries: every entry up to `tail` has been delivered to the group),
-- else ''. A wake-up XREAD blocks from `tail`: read in the same atomic script as the entries,
-- so nothing appended after the read can slip past it. Entries deleted since they were
-- delivered (XDEL, trimming) have no fields: they are acknowledged and skipped.
-- begin per-shard-refusal
local function refused(owners)
  local token = redis.call('HGET', owners, ARGV[1])
  if not token then return 'FENCED no owner' end
  local t = cjson.decode(token)
  if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
    return 'FENCED owned by another member'
  end
  return false
end
local function failure(e)
  return type(e) == 'table' and e.err or tostring(e)
end
-- end per-shard-refusal
local function read_shard(key, count, from)
  local function read(id)
    return redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[4], 'COUNT', count, 'STREAMS', key, id)
  end
  while true do
    local unseen = read(from)
    if not unseen or not unseen[1] or #unseen[1][2] == 0 then break end
    local live = {}
    for _, e in ipairs(unseen[1][2]) do
      -- an entry deleted since (XDEL, trimming) has no fields: nothing to hand out
      if e[2] then live[#live + 1] = e else redis.call('XACK', key, ARGV[1], e[1]) end
      from = e[1]
    end
    if #live > 0 then return {'', live, ''} end
  end
  local new = read('>')
  local entries = new and new[1] and new[1][2] or {}
  if #entries < count then
    local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    return {'', entries, last[1] and last[1][1] or '0-0'}
  end
  return {'', entries, ''}
end
local out = {}
for i = 1, #KEYS / 2 do
  local known = ARGV[3 * i + 4]
  local ok, reply = pcall(function()
    if known ~= '' then
      local last = redis.call('XREVRANGE', KEYS[2 * i - 1], '+', '-', 'COUNT', 1)
      if (last[1] and last[1][1] or '0-0') == known then return {'', {}, known} end
    end
    local why = refused(KEYS[2 * i])
    if why then return {why, {}, ''} end
    return read_shard(KEYS[2 * i - 1], tonumber(ARGV[3 * i + 2]), ARGV[3 * i + 3])
  end)
  out[i] = ok and reply or {failure(reply), {}, ''}
end
return out
