import { createHash } from 'node:crypto';

/**
 * The whole safety argument of the Redis backend: four scripts, each one atomic step on one slot.
 * Every script runs in one round trip; the backend sends EVALSHA and falls back to EVAL (which
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
 * Helpers both line-keeping scripts share; they expect KEYS laid out as n locks, their n fencing
 * counters, n lines and n waiter records (see redis.keys.ts), and the rarer arguments packed in one
 * ARGV string (see ACQUIRE and RELEASE).
 *
 * - clock(): the server time in µs, read at most once per call.
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
 *   µs, and only then is it written again, one above the counter.
 * - standing(i, who): if `who` still has its place in line i, its deadline (ms), the ttl it asked
 *   for (0 for a multi-key waiter) and the id of its process's backend.
 * - front(i): the first waiter in line i that still has its place, with the same three values.
 *   Waiters whose place ran out are dropped on the way.
 *
 * A token goes to Redis through string.format('%d'): a Lua number given to redis.call is written
 * with '%.17g', exact too, but the floating-point formatting costs Redis more than the call itself.
 */
const PRELUDE = `
local n = #KEYS / 4
local now = nil
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  end
  return now
end
local function nextToken(counter, lease)
  local token = clock()
  local last = tonumber(redis.call('SET', counter, string.format('%d', token), 'PX', lease, 'GET'))
  if last and last >= token then
    token = last + 1
    redis.call('SET', counter, string.format('%d', token), 'PX', lease)
  end
  return token
end
local function standing(i, who)
  local record = redis.call('HGET', KEYS[3 * n + i], who)
  if not record then return nil end
  local deadline, ttl, process = string.match(record, '^(%d+) (%d+) (%S+)$')
  if deadline and tonumber(deadline) * 1000 > clock() then return tonumber(deadline), tonumber(ttl), process end
end
local function front(i)
  local line, records = KEYS[2 * n + i], KEYS[3 * n + i]
  while true do
    local head = redis.call('ZRANGE', line, 0, 0)[1]
    if not head then return nil end
    local deadline, ttl, process = standing(i, head)
    if deadline then return head, deadline, ttl, process end
    redis.call('ZREM', line, head)
    redis.call('HDEL', records, head)
  end
end
`;

/**
 * KEYS: n locks, their n fencing counters, n lines, n waiter records.
 * ARGV: owner, ttl ms, and `<waiter timeout ms> <1 or 0> <backend id>`: 1 if the caller will wait
 * (joins the line when it fails), 0 if it gives up at once (so it stays out of the line); the id of
 * the caller's backend is its wake-up channel (see RELEASE). The last three travel as one string,
 * read only when the usual case does not apply: each value sent costs Redis a Lua string and a
 * slot in ARGV on every call.
 * Returns the fencing token in the usual case (one key, free, nobody in line); else
 * {1, fencing token, 1 if a line was kept for a key (others may still wait) else 0}, or
 * {0, ms until a retry may succeed (-1: unknown), the key's last token (single key; -1
 * otherwise)}: a hand-over announced later carries a greater token.
 *
 * All or nothing: every lock is checked before any is written. A lock this owner already holds
 * (handed over on release, or a request resent after a reconnect) is taken as it is. A free lock
 * still goes to the first waiter in line: the line keeps a process that releases and re-acquires
 * at once from starving the others. Waiters that stopped asking lose their place after the timeout,
 * in all their lines at once.
 * The usual case is four calls: EXISTS of the line, SET NX of the lock, then TIME and SET ... GET
 * for the fencing token (nextToken, inlined).
 */
export const ACQUIRE = script(
  'acquire',
  // The usual case first, before the prelude: its functions are closures made anew on every call,
  // which cost Redis more CPU than this path's own calls (measured in bench/README.md).
  `
if #KEYS == 4 and redis.call('EXISTS', KEYS[3]) == 0 and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local time = redis.call('TIME')
  local token = time[1] * 1000000 + time[2]
  local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[2], 'GET'))
  if last and last >= token then
    token = last + 1
    redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[2])
  end
  return token
end
` +
    PRELUDE +
    `
local owner, ttl = ARGV[1], ARGV[2]
local waiterTimeout, willWait, backendId = string.match(ARGV[3], '^(%d+) ([01]) (%S+)$')
local wait, mine, lined = nil, {}, 0
for i = 1, n do
  local holder = redis.call('GET', KEYS[i])
  if holder == owner then
    mine[i] = true
    lined = 1
  elseif holder then
    wait = math.max(wait or -1, redis.call('PTTL', KEYS[i]))
  end
end
if not wait then
  for i = 1, n do
    if not mine[i] then
      local head, deadline = front(i)
      if head then lined = 1 end
      if head and head ~= owner then wait = math.max(wait or -1, math.ceil(deadline - clock() / 1000)) end
    end
  end
end
if wait then
  if willWait == '0' then return {0, wait, -1} end
  -- Numbers go to Redis exactly (as %.17g); into a string they go through %d.
  local record = string.format('%d', math.floor(clock() / 1000) + tonumber(waiterTimeout)) .. ' ' .. (n == 1 and ttl or '0') .. ' ' .. backendId
  -- One place per waiter, the same in all its lines: any two waiters then stand in the same order
  -- in every line they share, so neither waits for the other on keys that are free. Places run out
  -- together (one deadline in every record), but a line drops a waiter only when it looks at it:
  -- a waiter that lost its place in any of its lines takes a fresh one, at the back of all of them.
  local place = nil
  for i = 1, n do
    local score = redis.call('ZSCORE', KEYS[2 * n + i], owner)
    if not score or not standing(i, owner) or (place and score ~= place) then
      place = nil
      break
    end
    place = score
  end
  place = place or clock()
  for i = 1, n do
    local line, records = KEYS[2 * n + i], KEYS[3 * n + i]
    redis.call('ZADD', line, place, owner)
    redis.call('HSET', records, owner, record)
    redis.call('PEXPIRE', line, waiterTimeout)
    redis.call('PEXPIRE', records, waiterTimeout)
  end
  -- Without a counter, a later hand-over starts one from the clock, so the clock is the bar.
  return {0, wait, n == 1 and (tonumber(redis.call('GET', KEYS[2])) or clock()) or -1}
end
local token
if n == 1 then
  token = nextToken(KEYS[2], ttl)
else
  token = clock()
  for i = n + 1, 2 * n do
    token = math.max(token, (tonumber(redis.call('GET', KEYS[i])) or 0) + 1)
  end
  local written = string.format('%d', token)
  for i = n + 1, 2 * n do redis.call('SET', KEYS[i], written, 'PX', ttl) end
end
for i = 1, n do
  redis.call('SET', KEYS[i], owner, 'PX', ttl)
  if redis.call('ZREM', KEYS[2 * n + i], owner) == 1 then redis.call('HDEL', KEYS[3 * n + i], owner) end
end
return {1, token, lined}
`,
);

/**
 * KEYS: n locks. ARGV: owner, ttl ms. Returns 1 if the owner still held every lock and each lease
 * is reset to ttl, else 0 (and nothing changed).
 */
export const EXTEND = script(
  'extend',
  `
local owner, ttl = ARGV[1], ARGV[2]
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= owner then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ttl)
end
return 1
`,
);

/**
 * KEYS: n locks, their n fencing counters, n lines, n waiter records. ARGV: owner, and
 * `<PUBLISH or SPUBLISH> <longest lease to hand over, ms> <id of the releasing backend> <1 or 0>`
 * in one string (as in ACQUIRE): SPUBLISH is sharded, on Cluster; 1 if a waiter of that backend may
 * go before waiters of other processes (see below), else 0. Returns how many locks the owner still
 * held; each is deleted, or handed to the first waiter in its line. When it goes to a waiter of the
 * releasing backend itself, no message is sent: the answer is `{released, waiter, token, lease ms,
 * 1 if it went before others else 0}`, and the releasing process hands it over in memory.
 *
 * The usual case, one key with nobody in line, may be sent with two KEYS, the lock and its line,
 * and the owner alone: it is three calls (EXISTS, GET, DEL) and returns 1 or 0 as above, or -1 if
 * someone is in line after all (they joined while the lock was held): then nothing was done, and
 * the caller sends the whole call. Each key sent costs Redis as each argument does.
 *
 * Compare-and-delete, so a late release never frees another owner's lock. A waiter that gives up
 * calls it too, to leave the line. Either way, if someone is in line, the first waiter's process
 * is told on its backend's own channel (on Cluster one per lock, `<line key>:<id>`, in the lock's
 * slot; else `nest-distributed-lock:<id>`), so no other process reads it:
 * - a single-key waiter is handed the free lock right here, with its fencing token, and the
 *   message is `<owner> <token> <lease ms>`: it enters without another round trip. The lease is
 *   its ttl, but no longer than the given cap, so a waiter that died in line holds it up briefly;
 * - a multi-key waiter is told `<owner>` and tries again.
 * Without a line there is nobody to wake: no message.
 *
 * A single key that its owner held goes to a waiter of the releasing backend without a message
 * when that waiter is first in line, or, if allowed, among the first few behind waiters of other
 * processes: the releasing process bounds how many times in a row it lets its own waiters go first
 * (as cohort locks do), since every hand-over between processes costs a message through Redis.
 */
export const RELEASE = script(
  'release',
  // The usual case first, as in ACQUIRE: one key and nobody in line, so nobody to hand it to.
  `
local oneLine = #KEYS == 2 and KEYS[2] or #KEYS == 4 and KEYS[3]
if oneLine and redis.call('EXISTS', oneLine) == 0 then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
if #KEYS == 2 then return -1 end
` +
    PRELUDE +
    `
local owner = ARGV[1]
local publish, maxLease, releaser, mayPass = string.match(ARGV[2], '^(%u+) (%d+) (%S+) ([01])$')
maxLease, mayPass = tonumber(maxLease), mayPass == '1'
local released = 0
-- The first waiter of the releasing backend among the first few in line, behind others.
local function nextOfOurs(i)
  local line = KEYS[2 * n + i]
  for _, waiter in ipairs(redis.call('ZRANGE', line, 1, 8)) do
    local deadline, ttl, process = standing(i, waiter)
    if deadline and process == releaser and ttl > 0 then return waiter, ttl end
  end
end
for i = 1, n do
  local lock, line, records = KEYS[i], KEYS[2 * n + i], KEYS[3 * n + i]
  local held = redis.call('GET', lock) == owner
  local turn = held
  if held then released = released + 1 end
  local lined = redis.call('EXISTS', line) == 1
  -- A holder left the line when it took the lock: only a waiter that gives up is still in it.
  if lined and not held and redis.call('ZREM', line, owner) == 1 then
    redis.call('HDEL', records, owner)
    turn = true
  end
  local handed = false
  if lined and turn then
    local head, _, ttl, process = front(i)
    local passed = 0
    if head and n == 1 and held and process ~= releaser and mayPass then
      local ours, oursTtl = nextOfOurs(i)
      if ours then head, ttl, process, passed = ours, oursTtl, releaser, 1 end
    end
    if head and n == 1 and held and process == releaser and ttl > 0 then
      local lease = math.min(ttl, maxLease)
      redis.call('SET', lock, head, 'PX', lease)
      redis.call('ZREM', line, head)
      redis.call('HDEL', records, head)
      return {released, head, nextToken(KEYS[2], lease), lease, passed}
    end
    if head then
      local channel = publish == 'SPUBLISH' and (line .. ':' .. process) or ('nest-distributed-lock:' .. process)
      local lease = math.min(ttl, maxLease)
      if lease > 0 then
        -- Ours: overwritten for the waiter. After a waiter left: only if nobody holds it.
        if held then
          handed = redis.call('SET', lock, head, 'PX', lease) ~= false
        else
          handed = redis.call('SET', lock, head, 'NX', 'PX', lease) ~= false
        end
      end
      if handed then
        redis.call('ZREM', line, head)
        redis.call('HDEL', records, head)
        redis.call(publish, channel, head .. ' ' .. string.format('%d', nextToken(KEYS[n + i], lease)) .. ' ' .. lease)
      else
        redis.call(publish, channel, head)
      end
    end
  end
  if held and not handed then redis.call('DEL', lock) end
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
