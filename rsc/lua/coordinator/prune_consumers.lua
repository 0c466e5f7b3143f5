-- rsc coordinator script `prune_consumers`: deletes the named consumers of a group on one shard
-- (departed members: `idle_consumers` listed them, minus the live members) if they still have
-- nothing pending. The pending count is read and the consumer deleted in one step, so a
-- consumer that still has entries is never deleted (that would fake a clean PEL): the new owner
-- claims them first, then it goes.
-- KEYS: shard key
-- ARGV: consumer group, then the consumer names
-- Reply: how many consumers were deleted (0 when the key or the group does not exist).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
local named = {}
for i = 2, #ARGV do named[ARGV[i]] = true end
local gone = 0
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if named[info['name']] and tonumber(info['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    gone = gone + 1
  end
end
return gone
