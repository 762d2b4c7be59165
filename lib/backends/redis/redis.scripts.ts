import { PRELUDE, script } from './redis.script-prelude.js';

export type { RedisScript } from './redis.script-prelude.js';
export { EXTEND, EXTEND_HOLDERS, INSPECT } from './redis.lease-scripts.js';

/*
 * The whole safety argument of the Redis backend: a few scripts, each one atomic step on one slot
 * (the helpers they share are in redis.script-prelude.ts, the lease scripts in
 * redis.lease-scripts.ts).
 */

/**
 * KEYS: n locks, their n fencing counters, n lines, n waiter records, n holder sets when ARGV[5]
 * is given, then n holder strings and n identity hashes (see redis.keys.ts).
 * ARGV: owner, ttl ms, and `<waiter timeout ms> <1 or 0> <backend id> <PUBLISH or SPUBLISH>`: 1
 * if the caller will wait (joins the line when it fails), 0 if it gives up at once (so it stays out
 * of the line); the id of the caller's backend is its wake-up channel, and the command is how
 * waiters are told (see RELEASE). The last four travel as one string,
 * read only when the usual case does not apply: each value sent costs Redis a Lua string and a
 * slot in ARGV on every call. ARGV[4]: who asks, `<instance>\n<site>` (stored, never read
 * here). ARGV[5], only when a key admits several holders: each key's limit, `1`, `<permits>` or
 * `shared`, separated by spaces.
 * Returns the fencing token in the usual case (one key, free, nobody in line); else
 * {1, fencing token, 1 if a line was kept for a key (others may still wait) else 0}, or
 * {0, ms until a retry may succeed (-1: unknown), the key's last token (single key; -1
 * otherwise)}: a hand-over announced later carries a greater token; or {2, i, limit}: key i has
 * holders of another limit (`shared` or `<permits>`), which waiting does not change.
 *
 * All or nothing: every lock is checked before any is written. A lock this owner already holds
 * (handed over on release, or a request resent after a reconnect) is taken as it is. A free lock
 * still goes to the first waiter in line: the line keeps a process that releases and re-acquires
 * at once from starving the others. A key that admits several holders lets a caller in beside its
 * holders while they leave it room, unless a waiter ahead of it in line is of another kind (a
 * queued writer keeps later readers out) or would take the room left. A caller that waits stands
 * in the lines of its keys up to the first that keeps it out (keys come sorted), in none after it.
 * Waiters that stopped asking lose their place after the timeout, in all their lines at once.
 * The usual case is four calls: EXISTS of the line, SET NX of the lock, then TIME and SET ... GET
 * for the fencing token (nextToken, inlined).
 */
export const ACQUIRE = script(
  'acquire',
  // The usual case first, before the prelude: its functions are closures made anew on every call,
  // which cost Redis more CPU than this path's own calls (measured in bench/README.md).
  `
if #KEYS == 6 and redis.call('EXISTS', KEYS[3]) == 0 and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local time = redis.call('TIME')
  local token = time[1] * 1000000 + time[2]
  redis.call('SET', KEYS[5], ARGV[1] .. ' ' .. string.format('%d', math.floor(token / 1000)) .. ' ' .. ARGV[4], 'PX', ARGV[2])
  local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[2], 'GET'))
  if last and last >= token then
    token = last + 1
    redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[2])
  end
  return token
end
local width = ARGV[5] and 7 or 6
` +
    PRELUDE +
    `
local owner, ttl, identity = ARGV[1], ARGV[2], ARGV[4]
local waiterTimeout, willWait, backendId, publish = string.match(ARGV[3], '^(%d+) ([01]) (%S+) (%u+)$')
local limits = {}
if ARGV[5] then
  for limit in string.gmatch(ARGV[5], '%S+') do limits[#limits + 1] = limit end
else
  for i = 1, n do limits[i] = '1' end
end
if ARGV[5] then holding() end
-- blocked: the first key that keeps the caller out (keys come sorted), the last line it stands in.
local wait, mine, own, room, lined, blocked = nil, {}, {}, {}, 0, nil
for i = 1, n do
  local holder = redis.call('GET', KEYS[i])
  if holder == owner then
    mine[i], own[i] = true, true
    lined = 1
  elseif holder and limits[i] ~= '1' and string.byte(holder) == 42 then
    -- Holders of a kind: this caller's own, or a mistake waiting cannot heal.
    if holder ~= '*' .. limits[i] then return {2, i, string.sub(holder, 2)} end
    local holders = KEYS[4 * n + i]
    local count = live(holders, whoKey(i))
    if redis.call('ZSCORE', holders, owner) then
      mine[i] = true
      lined = 1
    elseif count >= limitSize(limits[i]) then
      -- Full: the first permit frees when the shortest lease ends, if not before.
      local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')[2]
      wait = math.max(wait or -1, tonumber(first) - ms())
      blocked = blocked or i
    else
      room[i] = limitSize(limits[i]) - count
    end
  elseif holder then
    wait = math.max(wait or -1, redis.call('PTTL', KEYS[i]))
    blocked = blocked or i
  end
end
-- Without a held key every line decides; with one, only the lines before it: one of them may keep
-- the caller out sooner.
if not blocked or blocked > 1 then
  -- Whether a waiter ahead of \`who\` in line i keeps it out: one of another kind, or one of its kind
  -- when the key has no room left for both (\`room\`: places free beside the holders). Returns that
  -- waiter's deadline or nil, and whether anyone stands in the line.
  local function ahead(i, who, limit, room)
    local line, records, k = KEYS[2 * n + i], KEYS[3 * n + i], 0
    while true do
      local waiter = redis.call('ZRANGE', line, k, k)[1]
      if not waiter or waiter == who then return nil, k > 0 or waiter ~= nil end
      local deadline, _, _, theirs = standing(i, waiter)
      if deadline then
        room = room - 1
        if theirs ~= limit or room < 1 then return deadline, true end
        k = k + 1
      else
        leave(i, waiter)
      end
    end
  end
  for i = 1, (blocked or n + 1) - 1 do
    if not mine[i] then
      local deadline, anyone = ahead(i, owner, limits[i], room[i] or 1)
      if anyone then lined = 1 end
      if deadline then
        wait = math.max(wait or -1, math.ceil(deadline - clock() / 1000))
        if not blocked or i < blocked then blocked = i end
      end
    end
  end
end
if wait then
  if willWait == '0' then return {0, wait, -1} end
  -- Numbers go to Redis exactly (as %.17g); into a string they go through %d.
  local record = string.format('%d', math.floor(clock() / 1000) + tonumber(waiterTimeout)) .. ' ' .. (n == 1 and ttl or '0') .. ' ' .. backendId
  -- A place in line up to the first key that keeps it out, none after it: a place in the line of a
  -- later key would keep that key from a holder of an earlier one that takes it next (sorted
  -- order), while this caller waits for the earlier one: both would wait until a wait ran out. So
  -- two waiters never wait for each other on keys that are free: one stands in a later line only
  -- once nobody ahead of it keeps it out of the earlier ones.
  -- A place it still has is kept (nobody who came later passes it); a line it joins has it at the
  -- back. Places run out together (one deadline in every record), but a line drops a waiter only
  -- when it looks at it: one whose place ran out takes a fresh one in each line.
  -- Tells the waiters at the head of line i to ask again: the first, and those behind it of its
  -- kind while its limit leaves room (readers, permits). For a line whose head left without the
  -- key being released; a release hands the key over itself (see RELEASE's admit).
  local function tellFront(i)
    local line, k, kind, room = KEYS[2 * n + i], 0, nil, 1
    while room > 0 do
      local waiter = redis.call('ZRANGE', line, k, k)[1]
      if not waiter then return end
      local deadline, _, process, limit = standing(i, waiter)
      if not deadline then
        leave(i, waiter)
      elseif kind and limit ~= kind then
        return
      else
        if not kind then kind, room = limit, limit == 'shared' and math.huge or tonumber(limit) end
        tell(publish, i, process, waiter)
        room, k = room - 1, k + 1
      end
    end
  end
  local fresh = nil
  for i = 1, n do
    local line, records = KEYS[2 * n + i], KEYS[3 * n + i]
    if i <= blocked then
      if not (redis.call('ZSCORE', line, owner) and standing(i, owner)) then
        fresh = fresh or clock()
        redis.call('ZADD', line, fresh, owner)
      end
      redis.call('HSET', records, owner, limits[i] == '1' and record or record .. ' ' .. limits[i])
      redis.call('PEXPIRE', line, waiterTimeout)
      redis.call('PEXPIRE', records, waiterTimeout)
      -- Who waits, for inspect; since when is the place's score.
      redis.call('HSET', whoKey(i), owner, stamped(i, owner, identity))
      keepAtLeast(whoKey(i), waiterTimeout)
    elseif redis.call('ZSCORE', line, owner) then
      -- A place an earlier attempt took, while the keys before this one let it in: it goes, and
      -- whoever it kept out there may enter now. They were told to wait until this caller's place
      -- ran out, so they are told to ask again, unless the key is held alone (its release tells).
      leave(i, owner)
      local holder = redis.call('GET', KEYS[i])
      if not holder or string.byte(holder) == 42 then tellFront(i) end
    end
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
  if limits[i] == '1' or own[i] then
    redis.call('SET', KEYS[i], owner, 'PX', ttl)
    if not own[i] then tookAlone(i, owner, ttl, identity) end
  else
    -- A lease of its own, by this server's clock; the key lives as long as its longest lease.
    redis.call('ZADD', KEYS[4 * n + i], leaseEnd(tonumber(ttl)), owner)
    settle(KEYS[i], KEYS[4 * n + i], '*' .. limits[i], whoKey(i))
    if not mine[i] then tookBeside(i, owner, ttl, identity) end
  end
  if redis.call('ZREM', KEYS[2 * n + i], owner) == 1 then redis.call('HDEL', KEYS[3 * n + i], owner) end
end
return {1, token, lined}
`,
);

/**
 * KEYS: n locks, their n fencing counters, n lines, n waiter records, n holder sets. ARGV: owner,
 * and `<PUBLISH or SPUBLISH> <longest lease to hand over, ms> <id of the releasing backend> <1 or 0>`
 * in one string (as in ACQUIRE): SPUBLISH is sharded, on Cluster; 1 if a waiter of that backend may
 * go before waiters of other processes (see below), else 0. Returns how many locks the owner still
 * held; each is deleted, or handed to the waiters at the head of its line that can now enter. When
 * it goes to one exclusive waiter of the releasing backend itself, no message is sent: the answer
 * is `{released, waiter, token, lease ms, 1 if it went before others else 0}`, and the releasing
 * process hands it over in memory.
 *
 * The usual case, one key with nobody in line, may be sent with two KEYS, the lock and its line,
 * and the owner alone: it is three calls (EXISTS, GET, DEL) and returns 1 or 0 as above, or -1 if
 * someone is in line after all (they joined while the lock was held) or the key has several
 * holders (`*...`, whose set only the whole call has): then nothing was done, and the caller sends
 * the whole call. Each key sent costs Redis as each argument does.
 *
 * Compare-and-delete (or remove from the holder set), so a late release never frees another
 * owner's lock. A waiter that gives up calls it too, to leave the line. Either way, if someone is in
 * line, the waiters at its head that can now enter are let in, up to the first that cannot (see
 * admit), and each is told on its backend's own channel (on Cluster one per lock,
 * `<line key>:<id>`, in the lock's slot; else `nest-distributed-lock:<id>`), so no other process
 * reads it and nobody who still cannot enter is woken:
 * - a single-key waiter is handed the key right here, with its fencing token, and the message is
 *   `<owner> <token> <lease ms>`: it enters without another round trip. The lease is its ttl, but
 *   no longer than the given cap, so a waiter that died in line holds it up briefly;
 * - a multi-key waiter is told `<owner>` and tries again.
 * Without a line there is nobody to wake: no message.
 *
 * A single key that its owner held alone goes to an exclusive waiter of the releasing backend
 * without a message when that waiter is first in line, or, if allowed, among the first few
 * exclusive waiters behind waiters of other processes: the releasing process bounds how many times
 * in a row it lets its own waiters go first (as cohort locks do), since every hand-over between
 * processes costs a message through Redis.
 */
export const RELEASE = script(
  'release',
  // The usual case first, as in ACQUIRE: one key and nobody in line, so nobody to hand it to.
  `
local oneLine = #KEYS == 2 and KEYS[2] or #KEYS == 7 and KEYS[3]
if oneLine and redis.call('EXISTS', oneLine) == 0 then
  local holder = redis.call('GET', KEYS[1])
  if holder == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  if not holder or string.byte(holder) ~= 42 then return 0 end
end
if #KEYS == 2 then return -1 end
local width = 7
` +
    PRELUDE +
    `
local owner = ARGV[1]
local publish, maxLease, releaser, mayPass = string.match(ARGV[2], '^(%u+) (%d+) (%S+) ([01])$')
maxLease, mayPass = tonumber(maxLease), mayPass == '1'
local released = 0
-- The first exclusive waiter of the releasing backend among the first few in line, behind
-- exclusive waiters of others.
local function nextOfOurs(i)
  local line = KEYS[2 * n + i]
  for _, waiter in ipairs(redis.call('ZRANGE', line, 1, 8)) do
    local deadline, ttl, process, limit = standing(i, waiter)
    if deadline and limit ~= '1' then return nil end
    if deadline and process == releaser and ttl > 0 then return waiter, ttl end
  end
end
-- Lets in, from the head of line i (\`waiter\` and its standing, from front), the waiters that can
-- enter a key nobody holds alone and \`count\` hold beside each other (\`marker\` says of which kind):
-- an exclusive waiter when nobody holds it; waiters of the holders' kind while it has room. The
-- first that cannot enter ends it, so nobody passes it (one of another limit is told, to learn of
-- the mismatch). A multi-key waiter told to try again counts as entered: its room stays its own.
-- Returns 1 if an exclusive waiter was handed the key, and the key's marker.
local function admit(i, count, marker, waiter, ttl, process, limit)
  local lock, line, records, holders = KEYS[i], KEYS[2 * n + i], KEYS[3 * n + i], KEYS[4 * n + i]
  local kind, k = marker, 0
  while waiter do
    local exclusive, lease = limit == '1', math.min(ttl, maxLease)
    if not exclusive then holding() end
    if exclusive and count > 0 or not exclusive and (count >= limitSize(limit) or kind and kind ~= '*' .. limit) then
      if not exclusive and kind and kind ~= '*' .. limit then tell(publish, i, process, waiter) end
      return 0, marker
    end
    count = count + 1
    if not exclusive then kind = '*' .. limit end
    if lease == 0 then
      tell(publish, i, process, waiter)
      k = k + 1
    else
      redis.call('ZREM', line, waiter)
      redis.call('HDEL', records, waiter)
      local token = string.format('%d', nextToken(KEYS[n + i], lease))
      if exclusive then
        redis.call('SET', lock, waiter, 'PX', lease)
        tookAlone(i, waiter, lease)
      else
        redis.call('ZADD', holders, leaseEnd(lease), waiter)
        tookBeside(i, waiter, lease)
        marker = kind
      end
      tell(publish, i, process, waiter .. ' ' .. token .. ' ' .. lease)
    end
    if exclusive then return lease > 0 and 1 or 0, marker end
    -- The next waiter that still has its place.
    repeat
      waiter = redis.call('ZRANGE', line, k, k)[1]
      if waiter then
        local deadline
        deadline, ttl, process, limit = standing(i, waiter)
        if not deadline then leave(i, waiter) end
      end
    until not waiter or process
  end
  return 0, marker
end
for i = 1, n do
  local lock, line, records, holders = KEYS[i], KEYS[2 * n + i], KEYS[3 * n + i], KEYS[4 * n + i]
  local value = redis.call('GET', lock)
  local alone = value == owner
  local held = alone
  -- '*': the key has holders that hold it beside each other (see HOLDERS).
  local marker, count = value and string.byte(value) == 42 and value, 0
  if marker then
    holding()
    count = live(holders, whoKey(i))
    if redis.call('ZREM', holders, owner) == 1 then
      held, count = true, count - 1
      redis.call('HDEL', whoKey(i), owner)
    end
  end
  local turn = held
  if held then released = released + 1 end
  local lined = redis.call('EXISTS', line) == 1
  -- A holder left the line when it took the lock: only a waiter that gives up is still in it.
  if lined and not held and redis.call('ZREM', line, owner) == 1 then
    redis.call('HDEL', records, owner)
    redis.call('HDEL', whoKey(i), owner)
    turn = true
  end
  local handed = 0
  if lined and turn and (alone or marker or not value) then
    local head, _, ttl, process, limit = front(i)
    local passed = 0
    if head and n == 1 and alone and limit == '1' and process ~= releaser and mayPass then
      local ours, oursTtl = nextOfOurs(i)
      if ours then head, ttl, process, passed = ours, oursTtl, releaser, 1 end
    end
    if head and n == 1 and alone and limit == '1' and process == releaser and ttl > 0 then
      local lease = math.min(ttl, maxLease)
      redis.call('SET', lock, head, 'PX', lease)
      tookAlone(i, head, lease)
      redis.call('ZREM', line, head)
      redis.call('HDEL', records, head)
      return {released, head, nextToken(KEYS[2], lease), lease, passed}
    end
    if head then handed, marker = admit(i, count, marker, head, ttl, process, limit) end
  end
  if handed == 1 then
    if marker then redis.call('DEL', holders) end
  elseif marker then
    settle(lock, holders, marker, whoKey(i))
  elseif alone then
    redis.call('DEL', lock, holderKey(i))
  end
end
return released
`,
);
