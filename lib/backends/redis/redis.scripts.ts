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
 * ARGV: owner, ttl ms, waiter timeout ms, counter retention ms, 1 if the caller will wait (joins
 * the line when it fails) or 0 (it gives up at once, so it stays out of the line).
 * Returns {1, fencing token} or {0, ms until a retry may succeed, -1 when unknown}.
 *
 * All or nothing: every lock is checked before any is written. A lock already held by this owner
 * (a request resent after a reconnect) does not block it. A free lock still goes to the oldest
 * waiter in line first: the line is what keeps a process that releases and re-acquires at once
 * from starving the others. Waiters that stopped asking lose their place after the timeout.
 *
 * The token is one more than the largest last token of the keys; a key without a counter (never
 * locked, expired, or Redis restarted empty) counts the server time in µs instead. Strictly
 * greater than every earlier token of each key while its counter lives, and after that as long as
 * the server clock has not gone back: tokens grow by one per acquisition, far slower than the clock.
 * The uncontended path is five calls: GET, EXISTS, GET, SET, SET (plus TIME for a new key).
 */
export const ACQUIRE = script(
  'acquire',
  `
local n = #KEYS / 4
local owner = ARGV[1]
local now = nil
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  end
  return now
end
local wait = nil
for i = 1, n do
  local holder = redis.call('GET', KEYS[i])
  if holder and holder ~= owner then
    wait = math.max(wait or -1, redis.call('PTTL', KEYS[i]))
  end
end
local queued = {}
if not wait then
  for i = 1, n do
    local queue, deadlines = KEYS[2 * n + i], KEYS[3 * n + i]
    if redis.call('EXISTS', queue) == 1 then
      queued[i] = true
      local gone = redis.call('ZRANGEBYSCORE', deadlines, '-inf', clock())
      for _, waiter in ipairs(gone) do
        redis.call('ZREM', queue, waiter)
        redis.call('ZREM', deadlines, waiter)
      end
      local head = redis.call('ZRANGE', queue, 0, 0)[1]
      if head and head ~= owner then
        local headDeadline = tonumber(redis.call('ZSCORE', deadlines, head)) or clock()
        wait = math.max(wait or -1, math.ceil((headDeadline - clock()) / 1000))
      end
    end
  end
end
if wait and ARGV[5] == '0' then return {0, wait} end
if wait then
  local stamp = string.format('%.0f', clock())
  local deadline = string.format('%.0f', clock() + ARGV[3] * 1000)
  for i = 1, n do
    local queue, deadlines = KEYS[2 * n + i], KEYS[3 * n + i]
    redis.call('ZADD', queue, 'NX', stamp, owner)
    redis.call('ZADD', deadlines, deadline, owner)
    redis.call('PEXPIRE', queue, ARGV[3])
    redis.call('PEXPIRE', deadlines, ARGV[3])
  end
  return {0, wait}
end
local token = 0
for i = n + 1, 2 * n do
  local last = tonumber(redis.call('GET', KEYS[i]))
  token = math.max(token, last and last + 1 or clock())
end
local fence = string.format('%.0f', token)
for i = 1, n do
  redis.call('SET', KEYS[i], owner, 'PX', ARGV[2])
  redis.call('SET', KEYS[n + i], fence, 'PX', ARGV[4])
  if queued[i] and redis.call('ZREM', KEYS[2 * n + i], owner) == 1 then
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
 * calls it too, to leave the line. Either way the lock's channel (the lock key itself, so it is in
 * the lock's slot) tells waiters to try again; only waiters in line can be asleep on it (a waiter
 * joins the line with its first failed attempt, before it subscribes), so without a line there is
 * nobody to wake and nothing is published. The message is the owner first in line (a process
 * whose waiter it is not stays asleep: one attempt per handoff instead of one per process).
 */
export const RELEASE = script(
  'release',
  `
local n = #KEYS / 3
local released = 0
for i = 1, n do
  local freed = false
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
    freed = true
  end
  if redis.call('EXISTS', KEYS[n + i]) == 1 then
    if redis.call('ZREM', KEYS[n + i], ARGV[1]) == 1 then
      redis.call('ZREM', KEYS[2 * n + i], ARGV[1])
      freed = true
    end
    -- Names the waiter whose turn it is, so only its process wakes up and tries.
    if freed then redis.call(ARGV[2], KEYS[i], redis.call('ZRANGE', KEYS[n + i], 0, 0)[1] or '') end
  end
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
