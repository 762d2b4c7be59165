import { InvalidLockKeyError } from '../../lock.errors.js';

/**
 * Where a lock lives in Redis. The lock itself is stored under its own key, unchanged, so
 * `GET lock:order:42` and `PTTL lock:order:42` show the owner and the lease. Its companions (the
 * fencing counter, the line of waiters and their records) must sit in the same Redis Cluster
 * slot, so one script can touch them all; their names always start with a hash tag of ours that
 * pins them there:
 *
 * - a key with a hash tag of its own (`lock:order:{42}`, the user's choice, left alone): the slot
 *   is the tag's, so companions are `{42}:lock:order:{42}:fence`, ...;
 * - a key without one and without `}` (`lock:order:42`, the usual case): the whole key decides the
 *   slot, and `{lock:order:42}:fence` has the whole key as its tag;
 * - a key without a hash tag that still contains `}` (a user value like `a}b`, or `{}x`): no tag
 *   can hold it, so companions use a short stand-in tag that hashes to the same slot.
 *
 * Companion names start with `{`, so they never collide with lock names unless keyPrefix does.
 */
export interface LockKeyLayout {
  lock: string;
  fence: string;
  /** The line of waiters, a sorted set: waiting owner -> arrival (server time, µs). */
  line: string;
  /**
   * Hash: waiting owner -> `<deadline ms> <ttl ms> <backend id>`: when it loses its place unless it
   * asks again, the lease it asked for (0 for a multi-key waiter, which is never handed a lock on
   * release), and where to tell it (see RELEASE).
   */
  records: string;
  /**
   * Sorted set of the holders of a key that admits several (shared locks, semaphores): owner ->
   * end of its lease (server time, ms). The lock itself then holds `*shared` or `*<permits>`.
   */
  holders: string;
  /**
   * String: who holds the key alone, `<owner> <taken at, server ms> <instance>\n<site>`, with the
   * lock's lease. Read only while the lock names that owner, so one left behind by a release is
   * never shown.
   */
  holder: string;
  /**
   * Hash: who waits in line or holds beside others, owner -> `<written at, server ms>
   * <instance>\n<site>`. Processes of earlier versions neither write nor read these two.
   */
  who: string;
}

/** What every companion's name looks like (see lockKeyLayout). */
const COMPANION_NAME = /^\{.*:(?:fence|queue|waiters|holders|holder|who)$/s;

/**
 * `clientPrefix` is the ioredis client's keyPrefix: ioredis prepends it to every name we send, so
 * the slot is that of the prefixed key (a prefix must not contain braces itself).
 */
export function lockKeyLayout(key: string, clientPrefix = ''): LockKeyLayout {
  const base = slotPinnedBase(clientPrefix + key);
  // The names stored in Redis keep their first spelling (`:queue` for the line, `:waiters` for its
  // records): during a rolling upgrade processes of two versions share one Redis, and must find
  // each other's waiters.
  return {
    lock: key,
    fence: `${base}:fence`,
    line: `${base}:queue`,
    records: `${base}:waiters`,
    holders: `${base}:holders`,
    holder: `${base}:holder`,
    who: `${base}:who`,
  };
}

/**
 * The layouts of keys locked together by one script. On Cluster one script can only touch one
 * slot, so keys in different slots are refused.
 */
export function lockKeyLayouts(keys: readonly string[], clientPrefix: string, cluster: boolean): LockKeyLayout[] {
  for (const key of keys) {
    // Only with an empty keyPrefix can a lock's name start with '{', as every companion's does.
    if ((clientPrefix + key).charCodeAt(0) === 123 && COMPANION_NAME.test(clientPrefix + key)) {
      throw new InvalidLockKeyError(
        `'${key}' is named like the companion of another lock in Redis (its fencing counter, line or holder records: ` +
          `'{...}:fence', ':queue', ':waiters', ':holders', ':holder', ':who'); the two would overwrite each other. ` +
          `Keep the default keyPrefix ('lock:'), or name the lock otherwise.`,
      );
    }
  }
  if (cluster && keys.length > 1) {
    const slot = keySlot(clientPrefix + keys[0]);
    const other = keys.find((key) => keySlot(clientPrefix + key) !== slot);
    if (other !== undefined) {
      throw new InvalidLockKeyError(
        `Keys ${keys.join(', ')} cannot be locked together on Redis Cluster: '${keys[0]}' and '${other}' are in different slots, and one ` +
          `script can only touch one slot. Give them a common hash tag, e.g. 'order:{42}:payment' and 'order:{42}:stock'.`,
      );
    }
  }
  return keys.map((key) => lockKeyLayout(key, clientPrefix));
}

/**
 * The KEYS of the scripts that keep the line: n locks, n fencing counters, n lines, n waiter
 * records, with `holders` n holder sets (for keys that admit several holders, and for RELEASE,
 * which may hand a key to several), then n holder strings and n identity hashes (who holds and
 * waits).
 */
export function lineScriptKeys(layouts: readonly LockKeyLayout[], holders = false): string[] {
  if (layouts.length === 1) {
    const [{ lock, fence, line, records, holder, who }] = layouts;
    return holders ? [lock, fence, line, records, layouts[0].holders, holder, who] : [lock, fence, line, records, holder, who];
  }
  const keys = [
    ...layouts.map((l) => l.lock),
    ...layouts.map((l) => l.fence),
    ...layouts.map((l) => l.line),
    ...layouts.map((l) => l.records),
    ...(holders ? layouts.map((l) => l.holders) : []),
  ];
  return [...keys, ...layouts.map((l) => l.holder), ...layouts.map((l) => l.who)];
}

function slotPinnedBase(key: string): string {
  const tag = hashTag(key);
  if (tag !== undefined) return `{${tag}}:${key}`;
  if (!key.includes('}')) return `{${key}}`;
  return `{${slotStandIn(keySlot(key))}}:${key}`;
}

/** The hash tag Redis Cluster hashes instead of the whole key, by Redis's own rule; else undefined. */
export function hashTag(key: string): string | undefined {
  const open = key.indexOf('{');
  if (open < 0) return undefined;
  const close = key.indexOf('}', open + 1);
  return close > open + 1 ? key.slice(open + 1, close) : undefined;
}

/**
 * The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag or of the whole key, mod 16384.
 * Not the cluster-key-slot package (ioredis's helper): after an empty `{}` it keeps looking for a
 * later `}` and hashes what lies between, where Redis hashes the whole key (`foo{}{bar}`: 4015
 * there, 8363 in Redis), which would put companions in another slot than their lock.
 */
export function keySlot(key: string): number {
  return crc16(Buffer.from(hashTag(key) ?? key, 'utf8')) & 0x3fff;
}

const CRC16_TABLE = Array.from({ length: 256 }, (_, byte) => {
  let crc = byte << 8;
  for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  return crc;
});

function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff];
  return crc;
}

const standIns = new Map<number, string>();

/** A short brace-free string in `slot`: about 16 000 tries, once per slot, only for odd keys. */
function slotStandIn(slot: number): string {
  let found = standIns.get(slot);
  for (let i = 0; found === undefined; i++) {
    const candidate = `s${i.toString(36)}`;
    if (keySlot(candidate) === slot) found = candidate;
  }
  standIns.set(slot, found);
  return found;
}
