/**
 * The Lua run on each master. The redlock package counts a master's vote "for" when a script
 * returns the number of keys, so every script here keeps that convention. Each is one atomic
 * step on one master; the quorum across masters is the package's part.
 */

/**
 * Takes every key or none. A key already holding our own owner token counts as free: a retry of
 * the same acquisition (after a timed-out vote that did land) must not refuse itself.
 * ARGV: owner, ttl ms.
 */
export const ACQUIRE_SCRIPT = `
for _, key in ipairs(KEYS) do
  local holder = redis.call('get', key)
  if holder and holder ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('set', key, ARGV[1], 'px', ARGV[2])
end
return #KEYS
`;

/**
 * Renews every key, and re-creates one that is missing: the acquire script, run by the holder.
 * A master that missed the acquisition (down at the time, or restarted empty, or whose copy
 * expired early after a clock jump) gets the key back as soon as it is free there, so a lock won
 * on a bare quorum does not stay one fault away from a second owner. A key held by another owner
 * is left alone (that master votes against). Safe because only a holder whose lease is still
 * valid extends: whatever it re-creates, it could have acquired.
 * ARGV: owner, ttl ms.
 */
export const EXTEND_SCRIPT = ACQUIRE_SCRIPT;

/**
 * Deletes the keys this owner still holds and announces each on `<channelPrefix><key>` with the
 * owner as message, so waiters of every process retry at once. Votes "for" when it deleted any:
 * a key that expired on this master while others still had it is not a failed release.
 * ARGV: owner, channel prefix.
 */
export const RELEASE_SCRIPT = `
local deleted = 0
for _, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[1] then
    redis.call('del', key)
    redis.call('publish', ARGV[2] .. key, ARGV[1])
    deleted = deleted + 1
  end
end
if deleted > 0 then return #KEYS end
return 0
`;

/**
 * Takes back what a failed attempt set, silently: nobody waited for a lock that never existed,
 * so announcing it would only wake every other process's waiters for nothing.
 * ARGV: owner.
 */
export const CLEANUP_SCRIPT = `
local deleted = 0
for _, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[1] then
    redis.call('del', key)
    deleted = deleted + 1
  end
end
if deleted > 0 then return #KEYS end
return 0
`;

/** Holder and remaining lease of one key on one master: { owner or false, pttl }. */
export const INSPECT_SCRIPT = `
return { redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]) }
`;
