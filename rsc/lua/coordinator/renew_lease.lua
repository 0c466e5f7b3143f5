-- rsc coordinator script `renew_lease`: extends the coordinator lease by ttl from now (and sets
-- the URL it advertises), if it still names this holder with this token.
-- KEYS: lease
-- ARGV: holder, token, url ('' for none), ttl ms
-- Reply: 1 renewed; 0 when the lease is gone or not this holder's with this token.
-- begin lease-check
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local lease = cjson.decode(current)
if lease.holder ~= ARGV[1] or lease.token ~= tonumber(ARGV[2]) then return 0 end
-- end lease-check
local renewed = cjson.encode({holder = ARGV[1], token = lease.token, url = ARGV[3]})
redis.call('SET', KEYS[1], renewed, 'PX', ARGV[4])
return 1
