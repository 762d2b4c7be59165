import { createHash } from 'node:crypto';

/**
 * A Lua script of the Redis backend. Every script runs in one round trip; the backend sends
 * EVALSHA and falls back to EVAL (which loads the script again) when Redis answers NOSCRIPT, e.g.
 * after a restart.
 */
export interface RedisScript {
  readonly name: string;
  readonly lua: string;
  readonly sha: string;
}

export function script(name: string, lua: string): RedisScript {
  return { name, lua, sha: createHash('sha1').update(lua).digest('hex') };
}

/** The server's clock in µs, read at most once per call. */
export const CLOCK = `
local now = nil
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  end
  return now
end
`;

/**
 * Helpers for keys that admit several holders (shared locks and semaphores), made by holding()
 * before their first use: an exclusive caller never needs them, and each function a script makes
 * costs Redis CPU on every call (see bench/README.md). Such a key holds a marker instead of an
 * owner, `*shared` or `*<permits>` (owners never start with `*`), so every exclusive caller finds it
 * taken without looking further: the exclusive path costs what it did. Its holders stand in a
 * sorted set next to it, owner -> end of its own lease (ms, by this server's clock, never a
 * client's).
 *
 * - ms(): the server time in ms.
 * - leaseEnd(ttl): the end of a lease of `ttl` ms asked now: the first ms() at which it is over. ms()
 *   drops the µs, and a holder counts until ms() reaches its end, so the end is one ms on: the lease
 *   then lasts at least `ttl` from this call, as a key's own PX does (Redis expires a key once its
 *   clock is past the end), and never less than the ttl its holder counts from before it asked.
 * - limitSize(limit): how many holders a limit ('1', '<permits>', 'shared') admits.
 * - live(holders, who): drops holders whose lease ran out (and their identity in `who`); how many are left.
 * - settle(lock, holders, marker, who): after holders came or went, the marker and the set live as long
 *   as the longest lease, or both go with the last holder. So neither outlives its holders.
 */
export const HOLDERS = `
local ms, leaseEnd, limitSize, live, settle
local function holding()
  if ms then return end
  ms = function() return math.floor(clock() / 1000) end
  leaseEnd = function(ttl) return ms() + ttl + 1 end
  limitSize = function(limit) return limit == 'shared' and math.huge or tonumber(limit) end
  live = function(holders, who)
    -- Who they were goes with them: the identity hash would otherwise keep every holder whose
    -- lease ran out for as long as others keep the key.
    local now = ms()
    local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
    if #gone > 0 then
      redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
      if who then
        for i = 1, #gone, 1000 do redis.call('HDEL', who, unpack(gone, i, math.min(i + 999, #gone))) end
      end
    end
    return redis.call('ZCARD', holders)
  end
  settle = function(lock, holders, marker, who)
    live(holders, who)
    local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')[2]
    if not last then
      redis.call('DEL', lock, holders)
      return
    end
    local lease = string.format('%d', tonumber(last) - ms())
    -- The holder set first: Redis 7.0 counts each command's expiry from its own clock reading, so
    -- set second, it could outlive the marker by a millisecond, dead holders and all, under a
    -- writer that took the key meanwhile.
    redis.call('PEXPIRE', holders, lease)
    redis.call('SET', lock, marker, 'PX', lease)
  end
end
`;

/**
 * Helpers both line-keeping scripts share; they expect `width` set (6, or 7 with the holder sets)
 * and KEYS laid out as n locks, their n fencing counters, n lines, n waiter records, maybe n
 * holder sets, then n holder strings and n identity hashes (see redis.keys.ts), and the rarer
 * arguments packed in one ARGV string (see ACQUIRE and RELEASE).
 *
 * - nextToken(counter): one more than the counter's last token, but never below the server time
 *   in µs, and written back. The counter alone keeps tokens increasing while Redis keeps its data;
 *   the clock floor keeps them increasing when it does not: a restart from an RDB snapshot or an
 *   AOF fsynced every second, or a failover to a replica that lagged, brings back an older counter
 *   (or none), and tokens handed out since were at most the clock when they were issued (one per
 *   acquisition never outruns one per µs). So a token is greater than every earlier one of its key
 *   as long as the clock of the server that issues it has not gone back behind the clock of the
 *   server that issued them. So the counter needs to outlive only the lease it was written with:
 *   after that the clock alone is above every token of the key, and a key nobody locks anymore
 *   costs no memory (one request per distinct id would otherwise leave a counter per id).
 *   The clock is written first and the counter read back in the same call (SET ... GET): the
 *   counter is behind the clock but for a clock set back or a second acquisition within the same
 *   µs, and only then is it written again, one above the counter. Every holder of a key, whatever
 *   its kind, takes its token from this one counter.
 * - standing(i, who): if `who` still has its place in line i, its deadline (ms), the ttl it asked
 *   for (0 for a multi-key waiter), the id of its process's backend and its limit for the key.
 * - front(i): the first waiter in line i that still has its place, with the same four values.
 *   Waiters whose place ran out are dropped on the way.
 * - leave(i, who): `who` out of line i: its place, its record and its identity.
 * - tell(publish, i, process, message): sends `message` to the waiters of `process` on key i, with
 *   PUBLISH on the process's channel or, on Cluster, SPUBLISH on the key's (see RELEASE).
 * - tookAlone(i, who, lease, identity) / tookBeside(...): `who` holds key i now, alone or beside
 *   others: its identity (`identity`, or the one it waited with) is stamped with the server time,
 *   into the key's holder string for the lease, or into its identity hash, kept at least as long.
 *   Who holds and waits is only told, never decided on: nothing else reads these.
 *
 * A token goes to Redis through string.format('%d'): a Lua number given to redis.call is written
 * with '%.17g', exact too, but the floating-point formatting costs Redis more than the call itself.
 */
export const PRELUDE =
  CLOCK +
  HOLDERS +
  `
local n = #KEYS / width
local function nextToken(counter, lease)
  local token = clock()
  local last = tonumber(redis.call('SET', counter, string.format('%d', token), 'PX', lease, 'GET'))
  if last and last >= token then
    token = last + 1
    redis.call('SET', counter, string.format('%d', token), 'PX', lease)
  end
  return token
end
-- A record is '<deadline> <ttl> <backend id>', and ' <limit>' after it unless the limit is 1 (the
-- form processes of earlier versions read).
local function standing(i, who)
  local record = redis.call('HGET', KEYS[3 * n + i], who)
  if not record then return nil end
  local deadline, ttl, process, limit = string.match(record, '^(%d+) (%d+) (%S+) ?(%S*)$')
  if deadline and tonumber(deadline) * 1000 > clock() then
    return tonumber(deadline), tonumber(ttl), process, limit == '' and '1' or limit
  end
end
local function holderKey(i) return KEYS[(width - 2) * n + i] end
local function whoKey(i) return KEYS[(width - 1) * n + i] end
local function keepAtLeast(key, lease)
  if redis.call('PTTL', key) < tonumber(lease) then redis.call('PEXPIRE', key, lease) end
end
local function leave(i, who)
  redis.call('ZREM', KEYS[2 * n + i], who)
  redis.call('HDEL', KEYS[3 * n + i], who)
  redis.call('HDEL', whoKey(i), who)
end
local function tell(publish, i, process, message)
  local channel = publish == 'SPUBLISH' and (KEYS[2 * n + i] .. ':' .. process) or ('nest-distributed-lock:' .. process)
  redis.call(publish, channel, message)
end
local function stamped(i, who, identity)
  identity = identity or string.match(redis.call('HGET', whoKey(i), who) or '', '^%d+ (.*)$') or ''
  return string.format('%d', math.floor(clock() / 1000)) .. ' ' .. identity
end
local function tookAlone(i, who, lease, identity)
  redis.call('SET', holderKey(i), who .. ' ' .. stamped(i, who, identity), 'PX', lease)
  redis.call('HDEL', whoKey(i), who)
end
local function tookBeside(i, who, lease, identity)
  redis.call('HSET', whoKey(i), who, stamped(i, who, identity))
  keepAtLeast(whoKey(i), lease)
end
local function front(i)
  local line = KEYS[2 * n + i]
  while true do
    local head = redis.call('ZRANGE', line, 0, 0)[1]
    if not head then return nil end
    local deadline, ttl, process, limit = standing(i, head)
    if deadline then return head, deadline, ttl, process, limit end
    leave(i, head)
  end
end
`;
