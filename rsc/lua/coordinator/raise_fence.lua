-- rsc coordinator script `raise_fence`: before loading an aggregate, raises its fence to the
-- loader's token, so that the appends of an older coordinator term are refused from now on.
-- KEYS: snapshot
-- ARGV: fence token
-- Reply: {'ok', the fence before}; {'absent', 0} when the aggregate does not exist (nothing
-- written); {'fenced', stored fence} when the stored fence is above the token.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'absent', 0}
end
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if fence > tonumber(ARGV[1]) then
  return {'fenced', fence}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
return {'ok', fence}
