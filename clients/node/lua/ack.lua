-- rsc member script `ack` (data plane): acknowledge handled entries of several shards, each
-- checked against its own owner token, in one call.
-- KEYS: shard, owners, shard, owners, ...
-- ARGV: consumer group, member id, incarnation, then per shard the number of its ids, then the
--       ids of every shard in order.
-- Reply: per shard the number acknowledged, or its refusal ('FENCED ...', or the error of the
-- XACK that failed there).
-- begin per-shard-refusal
local function refused(owners)
  local token = redis.call('HGET', owners, ARGV[1])
  if not token then return 'FENCED no owner' end
  local t = cjson.decode(token)
  if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
    return 'FENCED owned by another member'
  end
  return false
end
local function failure(e)
  return type(e) == 'table' and e.err or tostring(e)
end
-- end per-shard-refusal
local out = {}
local at = 4 + #KEYS / 2
for i = 1, #KEYS / 2 do
  local n = tonumber(ARGV[3 + i])
  local first = at
  at = at + n
  local ok, reply = pcall(function()
    local why = refused(KEYS[2 * i])
    if why then return why end
    return redis.call('XACK', KEYS[2 * i - 1], ARGV[1], unpack(ARGV, first, first + n - 1))
  end)
  out[i] = ok and reply or failure(reply)
end
return out
