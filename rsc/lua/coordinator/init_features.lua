-- rsc coordinator script `init_features`: initializes the deployment's feature-level record
-- once, unless it exists (then it is left as it is), and reads it.
-- KEYS: features
-- ARGV: the level to start at, the level written to start at (the baseline), now ms
-- Reply: {level, written} as the record holds them.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'level', ARGV[1], 'written', ARGV[2], 'changedAtMs', ARGV[3],
             'changedBy', 'initialized')
end
return {redis.call('HGET', KEYS[1], 'level'), redis.call('HGET', KEYS[1], 'written')}
