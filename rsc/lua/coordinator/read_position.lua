-- rsc coordinator script `read_position` (feature level 7): where one consumer group stands on
-- one shard key, for a reset's plan. Reads only.
-- KEYS: the shard key
-- ARGV: consumer group
-- Reply: {key exists (0/1), first entry id ('' none), last generated id, entries added, length,
--         group exists (0/1), its last-delivered id, its entries-read ('' unknown), its pending}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, '', '0-0', 0, 0, 0, '0-0', '', 0} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local stream = {}
for i = 1, #info, 2 do stream[info[i]] = info[i + 1] end
local first = stream['first-entry']
local first_id = ''
if first and first ~= false and first[1] then first_id = first[1] end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local group = {}
  for i = 1, #g, 2 do group[g[i]] = g[i + 1] end
  if group['name'] == ARGV[1] then
    local read = group['entries-read']
    if not read or read == false then read = '' end
    return {1, first_id, stream['last-generated-id'], stream['entries-added'], stream['length'],
            1, group['last-delivered-id'], read, group['pending']}
  end
end
return {1, first_id, stream['last-generated-id'], stream['entries-added'], stream['length'],
        0, '0-0', '', 0}
