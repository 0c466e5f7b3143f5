-- rsc coordinator script `mark_dataset`: checks the dataset marker and moves its seq on, so that
-- a loss of everything (the marker gone) or an older copy (another id, a seq behind) is seen.
-- KEYS: marker
-- ARGV: the dataset id this coordinator knows ('' for none), the seq it last wrote, a new id
--       (used when the marker is gone or first written)
-- Reply: {verdict, id, seq}: 'ok' (seq moved on), 'absent' (marker gone: written anew with the
-- new id), 'other' (another id) or 'behind' (an older seq): for both of those it moves on from
-- the caller's seq, so the next check is 'ok'.
local id = redis.call('HGET', KEYS[1], 'id')
local known = tonumber(ARGV[2])
if not id then
  redis.call('HSET', KEYS[1], 'id', ARGV[3], 'seq', known + 1)
  return {'absent', ARGV[3], known + 1}
end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if ARGV[1] ~= '' and id ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'seq', math.max(seq, known) + 1)
  return {'other', id, math.max(seq, known) + 1}
end
if seq < known then
  redis.call('HSET', KEYS[1], 'seq', known + 1)
  return {'behind', id, known + 1}
end
return {'ok', id, redis.call('HINCRBY', KEYS[1], 'seq', 1)}
