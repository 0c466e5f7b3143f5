-- rsc coordinator script `acquire_lease`: takes the coordinator lease with a new fencing token,
-- unless another holder has it. The token comes from the counter, and is set above `floor` (the
-- highest token the caller has seen) when Redis lost or rolled back the counter, so tokens go
-- on growing. A lease naming the caller itself is taken again with a new token.
-- KEYS: lease, token counter (both `{coordinator}`)
-- ARGV: holder, url ('' for none), ttl ms, floor
-- Reply: {'acquired', token}; {'held', the lease's JSON, its PTTL ms} when another holder has it.
local current = redis.call('GET', KEYS[1])
if current and cjson.decode(current).holder ~= ARGV[1] then
  return {'held', current, redis.call('PTTL', KEYS[1])}
end
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[4] or '0')
if token <= floor then
  token = floor + 1
  redis.call('SET', KEYS[2], token)
end
redis.call('SET', KEYS[1], cjson.encode({holder = ARGV[1], token = token, url = ARGV[2]}), 'PX', ARGV[3])
return {'acquired', token}
