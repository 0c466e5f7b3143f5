-- rsc coordinator script `ensure_stream`: creates a shard key as an empty stream if it does not
-- exist (XADD then trim to 0 keeps the key); an existing stream is never touched.
-- KEYS: shard key
-- ARGV: none
-- Reply: 1.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', '*', 'rsc', 'created')
end
return 1
