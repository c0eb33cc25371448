package redis

import "github.com/redis/go-redis/v9"

// The Lua scripts the Subscriber runs. Each touches one stream (KEYS[1]),
// and the fenced ones of a shard subscription also the shard's lease key,
// which shares the stream's slot (see shardStream), so they work on Redis
// Cluster too.

// claimOwnScript resets the idle time and sets the delivery count of entries
// this consumer owns, and only those: an entry another consumer has
// reclaimed in the meantime is left alone. ARGV: group, consumer, then one
// triple per entry: id, idle time to set (ms), change of the delivery count
// (-1, 0 or +1). It returns one number per entry: the new delivery count,
// -1 when the entry is no longer pending for this consumer, -2 when its
// data was trimmed from the stream (Redis then drops it from the pending
// list).
var claimOwnScript = redis.NewScript(`
local out = {}
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if #p == 0 or p[1][2] ~= ARGV[2] then
    out[#out + 1] = -1
  else
    local n = p[1][4] + tonumber(ARGV[i + 2])
    if n < 0 then n = 0 end
    local c = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id,
      'IDLE', ARGV[i + 1], 'RETRYCOUNT', n, 'JUSTID')
    if #c == 0 then out[#out + 1] = -2 else out[#out + 1] = n end
  end
end
return out
`)

// autoClaimScript runs XAUTOCLAIM and reads the delivery count of each
// claimed entry from the pending list, in one round trip. ARGV: group,
// consumer, min idle time (ms), start id, count, and for a shard
// subscription the value its lease must have (KEYS[2], the lease key): a
// FENCED error when it has another. It returns the next start id, the
// claimed entries, their delivery counts, and the ids of pending entries
// whose data was trimmed (Redis 7 drops those from the pending list).
var autoClaimScript = redis.NewScript(`
if KEYS[2] and redis.call('GET', KEYS[2]) ~= ARGV[6] then
  return redis.error_reply('FENCED the shard lease is not this consumer\'s')
end
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local counts = {}
for i, e in ipairs(r[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
  if #p > 0 then counts[i] = p[1][4] else counts[i] = 0 end
end
return {r[1], r[2], counts, r[3] or {}}
`)

// deleteConsumerScript removes a consumer from a group if, and only if, it
// has no pending entries (XGROUP DELCONSUMER would drop them). ARGV: group,
// consumer. It returns 1 when the consumer was removed.
var deleteConsumerScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
`)
