-- rsc coordinator script `count_entries` (feature level 7): how many entries of a shard key lie
-- after one id and at or before another, counted one bounded chunk a call (the caller calls
-- again from the last id counted). Reads only.
-- KEYS: the shard key
-- ARGV: after (exclusive id), up to (inclusive id), the most entries counted in this call
-- Reply: {entries counted, the last id counted ('' none)}.
local found = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], ARGV[2], 'COUNT', tonumber(ARGV[3]))
if #found == 0 then return {0, ''} end
return {#found, found[#found][1]}
