-- rsc coordinator script `trim` (feature level 5): apply a stream's retention policy to one shard
-- key, fenced, counting exactly what each consumer group loses (rsc/events/retention.py has the
-- rules in Python; tests/actors/test_retention.py holds the two to the same answers).
-- Everything is read and removed in one atomic step: a group created, reset or acknowledging
-- between the coordinator's look and the trim cannot lose an entry to it.
-- KEYS: the shard's owner-token hash (the fence), the shard key, its trimmed counts (hash), its cap,
--       its dead-letter stream (all in the shard key's slot)
-- ARGV: fence field, coordinator token ('' = no fencing), now (ms), keep ('acknowledged'/'all'),
--       max age ms ('' = none), max entries ('' = none), when full ('drop-oldest'/'refuse'),
--       the most entries removed one by one in this call, dead letters kept ('' = all),
--       then the names of the groups released from holding (no member for inactiveGroupMs).
-- Reply: {entries removed, 1 if more is left to remove (call again) else 0,
--         {group, entries it lost, ...}, dead letters removed,
--         {group, ms of its oldest entry not acknowledged before this trim (-1: none), ...}};
--         refused with 'FENCED owner token of <key> fence <stored token>' when fenced.
-- A missing shard key has nothing to trim, and nothing is written for it (not even the fence).
if redis.call('EXISTS', KEYS[2]) == 0 then return {0, 0, {}, 0, {}} end
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
local shard = KEYS[2]
local now, keep, max_age, max_entries = tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local when_full, limit, dlq_max = ARGV[7], tonumber(ARGV[8]), ARGV[9]
-- The cap producers' appends check (`whenFull: refuse`), kept as the policy says.
if max_entries ~= '' and when_full == 'refuse' then
  redis.call('SET', KEYS[4], max_entries)
else
  redis.call('DEL', KEYS[4])
end
local dead_removed = 0
if dlq_max ~= '' then
  dead_removed = redis.call('XTRIM', KEYS[5], 'MAXLEN', '~', dlq_max)
end

-- Ids compare as (ms, seq), each a decimal string of any length: by length, then by text.
local function split(id)
  local dash = string.find(id, '-', 1, true)
  return string.sub(id, 1, dash - 1), string.sub(id, dash + 1)
end
local function less_num(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function less(a, b)
  local am, as = split(a)
  local bm, bs = split(b)
  if am ~= bm then return less_num(am, bm) end
  return less_num(as, bs)
end
-- The smallest id above `id` (a sequence past 2^53 stays where it is: one entry more is kept).
local function after(id)
  local ms, seq = split(id)
  if #seq >= 16 then return id end
  return ms .. '-' .. string.format('%.0f', tonumber(seq) + 1)
end

local released = {}
for i = 10, #ARGV do released[ARGV[i]] = true end
local groups = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', shard)) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local mark = after(info['last-delivered-id'])
  if info['pending'] > 0 then
    local oldest = redis.call('XPENDING', shard, info['name'])[2]
    if less(oldest, mark) then mark = oldest end
  end
  groups[#groups + 1] = {
    name = info['name'], delivered = info['last-delivered-id'], mark = mark,
    holds = not released[info['name']], pending = info['pending'], lost = 0,
  }
end
-- Each group's oldest entry not acknowledged yet (pending, else the first it was not delivered).
local oldest = {}
for _, g in ipairs(groups) do
  local first = nil
  if g.pending > 0 then
    first = g.mark
  else
    local next = redis.call('XRANGE', shard, '(' .. g.delivered, '+', 'COUNT', 1)
    if next[1] then first = next[1][1] end
  end
  oldest[#oldest + 1] = g.name
  oldest[#oldest + 1] = first and tonumber((split(first))) or -1
end

-- The cut: every entry below it goes (by age, and by acknowledgement).
local last = redis.call('XREVRANGE', shard, '+', '-', 'COUNT', 1)
local below, by_age = nil, nil
local exact = false  -- an age cut is exact; an acknowledged one may keep a macro node's margin
if max_age ~= '' and now - tonumber(max_age) > 0 then
  by_age = string.format('%.0f', now - tonumber(max_age)) .. '-0'
  below, exact = by_age, true
end
if keep == 'acknowledged' and #groups > 0 and last[1] then
  local ack = nil
  for _, g in ipairs(groups) do
    if g.holds and (ack == nil or less(g.mark, ack)) then ack = g.mark end
  end
  if ack == nil then ack = after(last[1][1]) end -- no group holds: none keeps anything back
  if below == nil or less(below, ack) then
    below, exact = ack, false
  end
end

local removed, more = 0, 0
-- Removes the entries `ids` (the oldest of the key, in order), counting what each group loses:
-- those above its last-delivered id, and its pending ones among them (acknowledged here, so
-- that they are never counted again; the read paths skip a deleted pending entry too).
local function remove(ids)
  if #ids == 0 then return end
  local top = ids[#ids]
  local gone = {}
  for _, id in ipairs(ids) do gone[id] = true end
  for _, g in ipairs(groups) do
    if less(g.mark, after(top)) then -- the group had not acknowledged all of them
      local lost = 0
      for _, id in ipairs(ids) do
        if less(g.delivered, id) then lost = lost + 1 end
      end
      if g.pending > 0 then
        local from = '-'
        while true do
          local page = redis.call('XPENDING', shard, g.name, from, top, 1000)
          if #page == 0 then break end
          local acked = {}
          for _, p in ipairs(page) do
            if gone[p[1]] then lost = lost + 1 end
            acked[#acked + 1] = p[1]
          end
          redis.call('XACK', shard, g.name, unpack(acked))
          if #page < 1000 then break end
          from = '(' .. page[#page][1]
        end
      end
      g.lost = g.lost + lost
    end
  end
  removed = removed + redis.call('XTRIM', shard, 'MINID', after(top))
end

if below ~= nil then
  local lossless = true
  for _, g in ipairs(groups) do
    if less(g.mark, below) then lossless = false end
  end
  if lossless then
    if by_age then -- nothing older than the age stays, whatever the margin of the rest
      removed = removed + redis.call('XTRIM', shard, 'MINID', by_age)
    end
    if not exact and max_entries ~= '' and when_full == 'refuse' then
      -- a refusing cap: the margin would be room producers wait for, so the cut is exact
      removed = removed + redis.call('XTRIM', shard, 'MINID', below)
    elseif not exact then
      removed = removed + redis.call('XTRIM', shard, 'MINID', '~', below)
    end
  else
    local ids = {}
    for _, e in ipairs(redis.call('XRANGE', shard, '-', '(' .. below, 'COUNT', limit)) do
      ids[#ids + 1] = e[1]
    end
    if #ids == limit then more = 1 end
    remove(ids)
  end
end
if max_entries ~= '' and when_full == 'drop-oldest' then
  local over = redis.call('XLEN', shard) - tonumber(max_entries)
  if over > 0 then
    if over > limit then over, more = limit, 1 end
    local ids = {}
    for _, e in ipairs(redis.call('XRANGE', shard, '-', '+', 'COUNT', over)) do ids[#ids + 1] = e[1] end
    remove(ids)
  end
end

local losses = {}
for _, g in ipairs(groups) do
  if g.lost > 0 then
    redis.call('HINCRBY', KEYS[3], g.name, g.lost)
    losses[#losses + 1] = g.name
    losses[#losses + 1] = g.lost
  end
end
if removed > 0 then redis.call('HINCRBY', KEYS[3], ':trimmed', removed) end
return {removed, more, losses, dead_removed, oldest}
