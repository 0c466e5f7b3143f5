-- rsc coordinator script `replay_dead_letters`: replays dead letters onto their shard. Each is
-- appended to the shard again with its original fields (the rsc* bookkeeping fields dropped),
-- then deleted from the dead-letter stream, atomically: none lost, none replayed twice.
-- KEYS: shard key, its dead-letter stream (same slot)
-- ARGV: how many at most, then the dead-letter ids to take (none: the oldest)
-- Reply: per entry replayed {dead-letter id, new id on the shard}.
local entries
if #ARGV > 1 then
  entries = {}
  for i = 2, #ARGV do
    local found = redis.call('XRANGE', KEYS[2], ARGV[i], ARGV[i])
    if found[1] then entries[#entries + 1] = found[1] end
  end
else
  entries = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', tonumber(ARGV[1]))
end
local out = {}
for _, e in ipairs(entries) do
  local fields = {}
  for i = 1, #e[2], 2 do
    if string.sub(e[2][i], 1, 3) ~= 'rsc' then
      fields[#fields + 1] = e[2][i]
      fields[#fields + 1] = e[2][i + 1]
    end
  end
  if #fields == 0 then fields = {'rscEmpty', '1'} end
  local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
  redis.call('XDEL', KEYS[2], e[1])
  out[#out + 1] = {e[1], id}
end
return out
