-- rsc coordinator script `restore`: writes a whole state back after Redis lost or rolled back
-- the aggregate (`Store.restore`): one checkpoint entry marked `restored`, the journal trimmed
-- to it, the checkpoint list and the snapshot replaced; fenced and CAS-checked as `append`.
-- KEYS: snapshot, journal, checkpoints (one hash tag: one slot)
-- ARGV: expected revision, new revision, schema version, fence token, state, reason
-- Reply: {'ok', new revision, checkpoint entry id}; {'fenced', stored fence} when the stored
-- fence is above the token; {'conflict', stored revision} when the revision moved.
-- begin fence-and-revision
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local token = tonumber(ARGV[4])
if fence > token then
  return {'fenced', fence}
end
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if current ~= tonumber(ARGV[1]) then
  return {'conflict', current}
end
-- end fence-and-revision
local id = redis.call('XADD', KEYS[2], '*', 'kind', 'Checkpoint', 'rev', ARGV[2], 'data', ARGV[5],
                      'restored', ARGV[6])
redis.call('XTRIM', KEYS[2], 'MINID', id)
redis.call('DEL', KEYS[3])
redis.call('RPUSH', KEYS[3], id .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[1], 'state', ARGV[5], 'stateRevision', ARGV[2], 'stateId', id,
           'revision', ARGV[2], 'lastId', id, 'schemaVersion', ARGV[3])
-- begin fence-raise
if token > fence then
  redis.call('HSET', KEYS[1], 'fence', ARGV[4])
end
-- end fence-raise
return {'ok', ARGV[2], id}
