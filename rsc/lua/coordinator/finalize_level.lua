-- rsc coordinator script `finalize_level`: changes the finalized feature level, if it is still
-- the expected one and nothing above the new level was written.
-- KEYS: features
-- ARGV: expected level, new level, now ms, by
-- Reply: {'ok', new level, written}; {'moved', level, written} when the level is no longer the
-- expected one; {'written', level, written} when data above the new level was written.
local level = redis.call('HGET', KEYS[1], 'level')
local written = tonumber(redis.call('HGET', KEYS[1], 'written') or '1')
if level ~= ARGV[1] then return {'moved', level, written} end
if written > tonumber(ARGV[2]) then return {'written', level, written} end
redis.call('HSET', KEYS[1], 'level', ARGV[2], 'changedAtMs', ARGV[3], 'changedBy', ARGV[4])
return {'ok', ARGV[2], written}
