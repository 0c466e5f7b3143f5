-- rsc member script `append` (producers, feature level 6): append messages to one shard, once.
-- In this order, atomic with the append: a repeat of an append this producer already made is
-- answered with the ids it got (even if the shard is now sealed or full); an append of an older
-- producer epoch than the shard has seen is refused; then the shard must not be sealed (it
-- drains: the layout the producer routes with is stale), then not full (its retention caps it
-- with `whenFull: refuse`); then the messages are appended and the append recorded.
-- KEYS: shard, its seal (`<shard key>:rsc:v1:seal`), its cap (`<shard key>:rsc:v1:cap`), the
--       producer's record on the shard (`<shard key>:rsc:v1:producer:<id>`, a hash: epoch `e`,
--       floor `f`) and its appends (`...:<id>:sent`, a sorted set by first sequence).
-- ARGV: the producer epoch ('' = not idempotent: no record read or written), the call's first
--       sequence, the producer's floor (every call of a lower first sequence is settled: its
--       records may go, and a copy of one arriving late is refused), the record's lifetime (ms),
--       then the number of messages, then per message the number of its field/value strings
--       followed by those strings, flat (field, value, field, value, ...).
-- Reply: the entry ids, in order; {'REPEAT', ids...} for a repeat (nothing appended); error
-- 'SEALED <shard> drains since layout v<N>' when sealed (nothing appended: route the messages
-- again with the layout of version N or newer); error 'FULL <shard> holds <length> of <cap>
-- entries' when the messages would take the shard past its cap (nothing appended: try again
-- once the group has consumed and retention made room); error 'FENCED producer epoch <e> of
-- <key>: the shard has seen epoch <n>' (another process took the producer id over); error
-- 'STALE sequence <s> of <key> is below the floor <f>' (a late copy of a settled call: never
-- appended).
-- Every write comes after the first XADD: Redis refuses a script under `maxmemory` (OOM) only
-- at its first write of a command that may grow memory, so nothing may be written before it.
local epoch = ARGV[1]
local seq, fresh, floor = nil, false, 0
if epoch ~= '' then
  epoch, seq = tonumber(epoch), tonumber(ARGV[2])
  local meta = redis.call('HMGET', KEYS[4], 'e', 'f')
  local seen = tonumber(meta[1] or '0')
  floor = tonumber(meta[2] or '0')
  if epoch < seen then
    return redis.error_reply('FENCED producer epoch ' .. epoch .. ' of ' .. KEYS[4] .. ': the shard has seen epoch ' .. seen)
  end
  fresh = epoch > seen
  if fresh then
    floor = 0
  else
    local sent = redis.call('ZRANGEBYSCORE', KEYS[5], seq, seq, 'LIMIT', 0, 1)
    if sent[1] then
      local reply = {'REPEAT'}
      local ids = string.sub(sent[1], string.find(sent[1], ':', 1, true) + 1)
      for id in string.gmatch(ids, '%S+') do reply[#reply + 1] = id end
      return reply
    end
    if seq < floor then
      return redis.error_reply('STALE sequence ' .. seq .. ' of ' .. KEYS[4] .. ' is below the floor ' .. floor)
    end
  end
end
local sealed = redis.call('GET', KEYS[2])
if sealed then return redis.error_reply('SEALED ' .. KEYS[1] .. ' drains since layout v' .. sealed) end
local cap = redis.call('GET', KEYS[3])
if cap then
  local length = redis.call('XLEN', KEYS[1])
  if length + tonumber(ARGV[5]) > tonumber(cap) then
    return redis.error_reply('FULL ' .. KEYS[1] .. ' holds ' .. length .. ' of ' .. cap .. ' entries')
  end
end
local ids, at = {}, 6
for n = 1, tonumber(ARGV[5]) do
  local count = tonumber(ARGV[at])
  ids[n] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, at + 1, at + count))
  at = at + count + 1
end
if seq then
  if fresh then  -- a newer epoch (a new process of this producer id): its records start afresh
    redis.call('DEL', KEYS[5])
    redis.call('HSET', KEYS[4], 'e', epoch, 'f', 0)
  end
  local low = tonumber(ARGV[3])
  if low > floor then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. low)
    redis.call('HSET', KEYS[4], 'f', low)
  end
  redis.call('ZADD', KEYS[5], seq, seq .. ':' .. table.concat(ids, ' '))
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
end
return ids
