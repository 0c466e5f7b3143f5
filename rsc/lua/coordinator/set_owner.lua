-- rsc coordinator script `set_owner`: sets a group's owner token on a shard, fenced.
-- The owner-token fence, in the shard key's own slot: a writer whose coordinator token (ARGV[2];
-- '' = no fencing) is below the one stored in the fence field (ARGV[1]) is refused, and a
-- higher one is stored. So a deposed coordinator that resumes mid-write cannot overwrite the
-- owner tokens its successor wrote, even between its last term check and the write.
-- KEYS: the shard's owner-token hash
-- ARGV: fence field, coordinator token ('' = no fencing), consumer group, token JSON
-- Reply: 1; refused with 'FENCED owner token of <key> fence <stored token>' when fenced.
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
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
return 1
