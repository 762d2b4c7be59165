import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';

/**
 * The whole safety argument of the Redis backend: four scripts, each one atomic step on one slot.
 * Every script runs in one round trip; the client sends EVALSHA and falls back to EVAL (which
 * loads the script again) when Redis answers NOSCRIPT, e.g. after a restart.
 */
export interface RedisScript {
  readonly name: string;
  readonly lua: string;
  readonly sha: string;
}

function script(name: string, lua: string): RedisScript {
  return { name, lua, sha: createHash('sha1').update(lua).digest('hex') };
}

/**
 * KEYS: n locks, then their n fencing counters, n wait queues and n queue deadlines.
 * ARGV: owner, ttl ms, waiter timeout ms, counter retention ms.
 * Returns {1, fencing token} or {0, ms until a retry may succeed, -1 when unknown}.
 *
 * All or nothing: every lock is checked before any is written. A lock already held by this owner
 * (a request resent after a reconnect) does not block it. A free lock still goes to the oldest
 * waiter in line first: the line is what keeps a process that releases and re-acquires at once
 * from starving the others. Waiters that stopped asking lose their place after the timeout.
 *
 * The token is the Redis server time in µs, or one more than the key's last token if that is not
 * smaller: strictly greater than every earlier token of each key while the counter lives, and
 * still increasing after it expires or Redis restarts empty, as long as the server clock does.
 */
export const ACQUIRE = script(
  'acquire',
  `
local n = #KEYS / 4
local owner = ARGV[1]
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local wait = nil
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl ~= -2 and redis.call('GET', KEYS[i]) ~= owner then
    wait = math.max(wait or -1, pttl)
  end
end
if not wait then
  for i = 1, n do
    local queue, deadlines = KEYS[2 * n + i], KEYS[3 * n + i]
    if redis.call('EXISTS', queue) == 1 then
      local gone = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
      for _, waiter in ipairs(gone) do
        redis.call('ZREM', queue, waiter)
        redis.call('ZREM', deadlines, waiter)
      end
      local head = redis.call('ZRANGE', queue, 0, 0)[1]
      if head and head ~= owner then
        local headDeadline = tonumber(redis.call('ZSCORE', deadlines, head)) or now
        wait = math.max(wait or -1, math.ceil((headDeadline - now) / 1000))
      end
    end
  end
end
if wait then
  local stamp = string.format('%.0f', now)
  local deadline = string.format('%.0f', now + ARGV[3] * 1000)
  for i = 1, n do
    local queue, deadlines = KEYS[2 * n + i], KEYS[3 * n + i]
    redis.call('ZADD', queue, 'NX', stamp, owner)
    redis.call('ZADD', deadlines, deadline, owner)
    redis.call('PEXPIRE', queue, ARGV[3])
    redis.call('PEXPIRE', deadlines, ARGV[3])
  end
  return {0, wait}
end
local token = now
for i = n + 1, 2 * n do
  local last = tonumber(redis.call('GET', KEYS[i]))
  if last and last >= token then token = last + 1 end
end
local fence = string.format('%.0f', token)
for i = 1, n do
  redis.call('SET', KEYS[i], owner, 'PX', ARGV[2])
  redis.call('SET', KEYS[n + i], fence, 'PX', ARGV[4])
  if redis.call('ZREM', KEYS[2 * n + i], owner) == 1 then
    redis.call('ZREM', KEYS[3 * n + i], owner)
  end
end
return {1, token}
`,
);

/**
 * KEYS: n locks, then their n fencing counters. ARGV: owner, ttl ms, counter retention ms.
 * Returns 1 if the owner still held every lock and each lease is reset to ttl, else 0 (and
 * nothing changed). The counter's retention is renewed too, so a long-held lock keeps its token.
 */
export const EXTEND = script(
  'extend',
  `
local n = #KEYS / 2
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, n do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
  redis.call('PEXPIRE', KEYS[n + i], ARGV[3])
end
return 1
`,
);

/**
 * KEYS: n locks, then their n wait queues and n queue deadlines. ARGV: owner, 'PUBLISH' or
 * 'SPUBLISH' (sharded, on Cluster). Returns how many locks the owner still held; those are deleted.
 *
 * Compare-and-delete, so a late release never frees another owner's lock. A waiter that gives up
 * calls it too, to leave the line. Either way the lock's channel (the lock key itself, so it is
 * in the lock's slot) tells waiters to try again.
 */
export const RELEASE = script(
  'release',
  `
local n = #KEYS / 3
local released = 0
for i = 1, n do
  local changed = false
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
    changed = true
  end
  if redis.call('ZREM', KEYS[n + i], ARGV[1]) == 1 then
    redis.call('ZREM', KEYS[2 * n + i], ARGV[1])
    changed = true
  end
  if changed then redis.call(ARGV[2], KEYS[i], '') end
end
return released
`,
);

/** KEYS: a lock and its fencing counter. Returns {owner or false, pttl, last token or false}. */
export const INSPECT = script(
  'inspect',
  `
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
`,
);

/** Runs a script by its SHA; on NOSCRIPT (a restarted or flushed Redis) sends it whole once. */
export async function runScript(client: Redis | Cluster, script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
  try {
    return await client.evalsha(script.sha, keys.length, ...keys, ...args);
  } catch (error) {
    if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
    return client.eval(script.lua, keys.length, ...keys, ...args);
  }
}
