-- rsc coordinator script `release_lease`: deletes the coordinator lease if it still names this
-- holder with this token (a standby takes over at once).
-- KEYS: lease
-- ARGV: holder, token
-- Reply: 1 deleted; 0 when the lease is gone or not this holder's with this token.
-- begin lease-check
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local lease = cjson.decode(current)
if lease.holder ~= ARGV[1] or lease.token ~= tonumber(ARGV[2]) then return 0 end
-- end lease-check
return redis.call('DEL', KEYS[1])
