-- rsc member script `append` (producers, feature level 6): append messages to one shard, once.
-- In this order, atomic with the append: a repeat of an append this producer already made is
-- answered with the ids it got (even if the shard is now sealed or full); an append of an older
-- producer epoch than the shard has seen is refused; then the shard must not be sealed (it
-- drains: the layout the producer routes with is stale), then not full (its retention caps it
-- with `whenFull: refuse`); then the messages are appended and the append recorded.
-- KEYS: shard, its seal (`<shard key>:rsc:v1:seal`), its cap (`<shard key>:rsc:v1:cap`), the
--       producer's record on the shard (`<shard key>:rsc:v1:producer:<id>`, a hash: its epoch
--       `e`, its floor `f`, how many calls it records `n`, and per call appended, field = the
--       call's first sequence, value = the entry ids, space separated, or `<first id>*<k>` for k
--       consecutive ids of one millisecond).
-- ARGV: the producer epoch ('' = not idempotent: no record read or written), the call's first
--       sequence, the producer's floor (every call of a lower first sequence is settled: its
--       records may go, and a copy of one arriving late is refused; the stored floor follows it
--       once the record holds 128 calls, and records at or above the stored floor are kept, so
--       a late copy between the two is answered as the repeat it is), the record's lifetime (ms),
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
local seq, fresh, floor, count = nil, false, 0, 0
if epoch ~= '' then
  epoch, seq = tonumber(epoch), ARGV[2]
  local window = tonumber(ARGV[4])
  if not epoch or not tonumber(seq) or not tonumber(ARGV[3]) or not window or window < 1000 then
    return redis.error_reply('INVALID epoch, sequence, floor or window (ms, at least 1000)')
  end
  local meta = redis.call('HMGET', KEYS[4], 'e', 'f', 'n', seq)
  local seen = tonumber(meta[1] or '0')
  floor, count = tonumber(meta[2] or '0'), tonumber(meta[3] or '0')
  if epoch < seen then
    return redis.error_reply('FENCED producer epoch ' .. epoch .. ' of ' .. KEYS[4] .. ': the shard has seen epoch ' .. seen)
  end
  fresh = epoch > seen
  if fresh then
    floor, count = 0, 0
  elseif meta[4] then
    local reply, ids = {'REPEAT'}, meta[4]
    local star = string.find(ids, '*', 1, true)
    if star then
      local dash = string.find(ids, '-', 1, true)
      local ms, first = string.sub(ids, 1, dash - 1), tonumber(string.sub(ids, dash + 1, star - 1))
      for n = 0, tonumber(string.sub(ids, star + 1)) - 1 do
        reply[#reply + 1] = ms .. '-' .. string.format('%.0f', first + n)
      end
    else
      for id in string.gmatch(ids, '%S+') do reply[#reply + 1] = id end
    end
    return reply
  elseif tonumber(seq) < floor then
    return redis.error_reply('STALE sequence ' .. seq .. ' of ' .. KEYS[4] .. ' is below the floor ' .. floor)
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
if seq and #ids > 0 then
  local record = nil
  if #ids > 1 then  -- short when the ids are consecutive in one millisecond (the usual case)
    local first, last = ids[1], ids[#ids]
    local dash = string.find(first, '-', 1, true)
    local s0 = tonumber(string.sub(first, dash + 1))
    if s0 < 2 ^ 52 and last == string.sub(first, 1, dash) .. string.format('%.0f', s0 + #ids - 1) then
      record = first .. '*' .. #ids
    end
  end
  record = record or table.concat(ids, ' ')
  if fresh then  -- a newer epoch (a new process of this producer id): its records start afresh
    redis.call('DEL', KEYS[4])
    redis.call('HSET', KEYS[4], 'e', epoch, 'f', 0, 'n', 1, seq, record)
  else
    redis.call('HSET', KEYS[4], seq, record, 'n', count + 1)
  end
  local low = tonumber(ARGV[3])
  if count + 1 >= 128 and low > floor then  -- pruned in steps: one HKEYS every 128 calls or so
    local gone, removed = {}, 0
    for _, field in ipairs(redis.call('HKEYS', KEYS[4])) do
      local n = tonumber(field)
      if n and n < low then gone[#gone + 1] = field end
      if #gone == 1000 then
        removed = removed + redis.call('HDEL', KEYS[4], unpack(gone))
        gone = {}
      end
    end
    if #gone > 0 then removed = removed + redis.call('HDEL', KEYS[4], unpack(gone)) end
    redis.call('HSET', KEYS[4], 'f', low, 'n', count + 1 - removed)
  end
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
return ids
