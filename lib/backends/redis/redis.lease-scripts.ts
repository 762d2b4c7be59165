import { CLOCK, HOLDERS, script } from './redis.script-prelude.js';

/**
 * KEYS: n locks. ARGV: owner, ttl ms. Returns 1 if the owner still held every lock and each lease
 * is reset to ttl, else 0 (and nothing changed), or -1 if a key has holders that hold it beside
 * each other (`*...`): then EXTEND_HOLDERS, which has their sets, answers for the owner.
 */
export const EXTEND = script(
  'extend',
  `
local owner, ttl = ARGV[1], ARGV[2]
for _, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder ~= owner then return holder and string.byte(holder) == 42 and -1 or 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ttl)
end
return 1
`,
);

/**
 * KEYS: n locks, their n holder sets. ARGV: owner, ttl ms. EXTEND for an owner that holds some of
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
local n = #KEYS / 2
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
  else
    redis.call('ZADD', KEYS[n + i], 'XX', ms() + ttl, owner)
    settle(KEYS[i], KEYS[n + i], values[i])
  end
end
return 1
`,
);

/**
 * KEYS: a lock, its fencing counter and its holder set. Returns {owner or marker or false, pttl,
 * last token or false}, and for a key with holders beside each other (`*...`) also its live
 * holders with the ends of their leases (owner, ms, owner, ms, ...) and the server time in ms.
 */
export const INSPECT = script(
  'inspect',
  `
local holder = redis.call('GET', KEYS[1])
local answer = {holder, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
if holder and string.byte(holder) == 42 then
  local time = redis.call('TIME')
  local now = time[1] * 1000 + math.floor(time[2] / 1000)
  answer[4] = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
  answer[5] = now
end
return answer
`,
);
