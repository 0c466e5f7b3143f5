-- rsc coordinator script `mark_level_written`: raises the feature level written (never lowers
-- it); refused if the level changed meanwhile or is below the level to mark.
-- KEYS: features
-- ARGV: level (the caller's view of it), written (the level to mark)
-- Reply: 1 marked (or marked already); 0 refused.
local level = redis.call('HGET', KEYS[1], 'level')
if level ~= ARGV[1] or tonumber(level) < tonumber(ARGV[2]) then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'written') or '1') < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'written', ARGV[2])
end
return 1
