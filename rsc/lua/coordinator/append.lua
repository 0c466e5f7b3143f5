-- rsc coordinator script `append`: appends an aggregate's events to its journal and replaces
-- its snapshot, if the snapshot is still at the expected revision (CAS) and no newer
-- coordinator term fenced it; with a checkpoint, records it and trims the journal to the
-- checkpoints still within `retention` revisions.
-- KEYS: snapshot, journal, checkpoints (one hash tag: one slot)
-- ARGV: expected revision, schema version, retention, fence token, n, n x (kind, data, version
--       or '' for none: schema 1), checkpoint state or ''
-- Reply: {'ok', revision, last entry id}; {'fenced', stored fence} when the stored fence is
-- above the token; {'conflict', stored revision} when the revision moved.
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
local n = tonumber(ARGV[5])
local rev = current
local id = redis.call('HGET', KEYS[1], 'lastId') or ''
for i = 0, n - 1 do
  rev = rev + 1
  local kind, data, v = ARGV[6 + 3 * i], ARGV[7 + 3 * i], ARGV[8 + 3 * i]
  if v == '' then
    id = redis.call('XADD', KEYS[2], '*', 'kind', kind, 'rev', rev, 'data', data)
  else
    id = redis.call('XADD', KEYS[2], '*', 'kind', kind, 'rev', rev, 'data', data, 'v', v)
  end
end
local state = ARGV[6 + 3 * n]
if state ~= '' then
  id = redis.call('XADD', KEYS[2], '*', 'kind', 'Checkpoint', 'rev', rev, 'data', state)
  redis.call('RPUSH', KEYS[3], id .. ' ' .. rev)
  redis.call('HSET', KEYS[1], 'state', state, 'stateRevision', rev, 'stateId', id)
  local retention = tonumber(ARGV[3])
  local trimmed = false
  while redis.call('LLEN', KEYS[3]) >= 2 do
    local second = redis.call('LINDEX', KEYS[3], 1)
    if rev - tonumber(string.match(second, ' (%d+)$')) < retention then break end
    redis.call('LPOP', KEYS[3])
    trimmed = true
  end
  if trimmed then
    local first = redis.call('LINDEX', KEYS[3], 0)
    redis.call('XTRIM', KEYS[2], 'MINID', string.match(first, '^(%S+)'))
  end
end
redis.call('HSET', KEYS[1], 'revision', rev, 'lastId', id, 'schemaVersion', ARGV[2])
-- begin fence-raise
if token > fence then
  redis.call('HSET', KEYS[1], 'fence', ARGV[4])
end
-- end fence-raise
return {'ok', rev, id}
