-- rsc coordinator script `load`: loads an aggregate in one round trip. Raises its fence to the
-- loader's token first (as `raise_fence` does), so that the appends of an older coordinator
-- term are refused from now on, then reads the snapshot and the journal after its checkpoint.
-- KEYS: snapshot, journal (one hash tag: one slot)
-- ARGV: fence token
-- Reply: {'ok', snapshot as field, value, ..., journal entries after the checkpoint (or all of
-- them without one) as XRANGE answers them}; {'absent'} when the aggregate does not exist
-- (nothing written); {'fenced', stored fence} when the stored fence is above the token.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'absent'}
end
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if fence > tonumber(ARGV[1]) then
  return {'fenced', fence}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
local snapshot = redis.call('HGETALL', KEYS[1])
local start = '-'
local state_id = redis.call('HGET', KEYS[1], 'stateId')
if state_id then
  start = '(' .. state_id
end
return {'ok', snapshot, redis.call('XRANGE', KEYS[2], start, '+')}
