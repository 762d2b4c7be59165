import { CLOCK, HOLDERS, script } from './redis.script-prelude.js';

/**
 * KEYS: n locks, their n holder strings, their n fencing counters. ARGV: owner, ttl ms. Returns 1
 * if the owner still held every lock and each lease (and who holds it) is reset to ttl, else 0
 * (and nothing changed), or -1
 * if a key has holders that hold it beside each other (`*...`): then EXTEND_HOLDERS, which has
 * their sets, answers for the owner.
 */
export const EXTEND = script(
  'extend',
  `
local owner, ttl = ARGV[1], ARGV[2]
local n = #KEYS / 3
for i = 1, n do
  local holder = redis.call('GET', KEYS[i])
  if holder ~= owner then return holder and string.byte(holder) == 42 and -1 or 0 end
end
for i = 1, 2 * n do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
-- The counter holds the holder's token while it holds the key alone: kept as long as the lease,
-- so inspect() still tells the token (which a forced release names) after the first ttl.
for i = 2 * n + 1, 3 * n do
  local left = redis.call('PTTL', KEYS[i])
  if left >= 0 and left < tonumber(ttl) then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
`,
);

/**
 * KEYS: n locks, their n holder sets, n holder strings, n identity hashes. ARGV: owner, ttl ms.
 * EXTEND for an owner that holds some of
 * its keys beside others (shared, or a permit): its own lease in the set is reset to ttl, by this
 * server's clock, and the key's to the longest lease of its holders. Returns 1, or 0 if the owner no
 * longer holds every key (its lease ran out, or it was never in): then nothing changed.
 */
export const EXTEND_HOLDERS = script(
  'extend-holders',
  CLOCK +
    HOLDERS +
    `
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local n = #KEYS / 4
holding()
local values = {}
for i = 1, n do
  values[i] = redis.call('GET', KEYS[i])
  if values[i] ~= owner then
    local shared = values[i] and string.byte(values[i]) == 42
    if not shared or (tonumber(redis.call('ZSCORE', KEYS[n + i], owner)) or 0) <= ms() then return 0 end
  end
end
for i = 1, n do
  if values[i] == owner then
    redis.call('PEXPIRE', KEYS[i], ttl)
    redis.call('PEXPIRE', KEYS[2 * n + i], ttl)
  else
    redis.call('ZADD', KEYS[n + i], 'XX', leaseEnd(ttl), owner)
    settle(KEYS[i], KEYS[n + i], values[i], KEYS[3 * n + i])
    if redis.call('PTTL', KEYS[3 * n + i]) < ttl then redis.call('PEXPIRE', KEYS[3 * n + i], ttl) end
  end
end
return 1
`,
);

/**
 * KEYS: a lock, its fencing counter, its holder set, its line, its waiter records, its holder
 * string and its identity hash. Returns {owner or marker or false, pttl, last token or false,
 * holders, server time in ms, holder string or false, waiters}: for a key with holders beside each
 * other (`*...`), `holders` lists the live ones as owner, end of lease (ms), identity; else it is
 * empty, and the holder string tells who holds it alone. `waiters` lists the first 100 waiters that
 * still have their place, in line order, as owner, place (server µs), limit, identity. An identity
 * is `<written at, ms> <instance>\n<site>`, or false where none was stored.
 */
export const INSPECT = script(
  'inspect',
  `
local lock, fence, holders, line, records, holderKey, who = unpack(KEYS)
local holder = redis.call('GET', lock)
if not holder then return {false} end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local answer = {holder, redis.call('PTTL', lock), redis.call('GET', fence), {}, now, redis.call('GET', holderKey), {}}
if string.byte(holder) == 42 then
  local list = redis.call('ZRANGEBYSCORE', holders, '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
  for k = 1, #list, 2 do
    local entry = answer[4]
    entry[#entry + 1] = list[k]
    entry[#entry + 1] = list[k + 1]
    entry[#entry + 1] = redis.call('HGET', who, list[k])
  end
end
local waiting = redis.call('ZRANGE', line, 0, 99, 'WITHSCORES')
for k = 1, #waiting, 2 do
  local record = redis.call('HGET', records, waiting[k])
  local deadline, limit = string.match(record or '', '^(%d+) %d+ %S+ ?(%S*)$')
  if deadline and tonumber(deadline) > now then
    local entry = answer[7]
    entry[#entry + 1] = waiting[k]
    entry[#entry + 1] = waiting[k + 1]
    entry[#entry + 1] = limit == '' and '1' or limit
    entry[#entry + 1] = redis.call('HGET', who, waiting[k])
  end
end
return answer
`,
);
