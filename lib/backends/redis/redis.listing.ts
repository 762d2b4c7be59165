import type { Cluster, Redis } from 'ioredis';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { withTimeout } from '../bounded-wait.js';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import { lockKeyLayout } from './redis.keys.js';

/**
 * list() on Redis: SCAN with MATCH on each master, never KEYS, so Redis answers each call after
 * about `limit` slots of its keyspace, not after all of it. On Cluster the masters are scanned one
 * after another, ordered by the first slot each serves; the cursor names the master by that slot
 * (not by its address, which a failover changes) with SCAN's own cursor on it.
 *
 * SCAN's promise is Redis's: a key held from the first call to the last is returned, and a page
 * never repeats a key; across pages a key comes twice only if Redis shrinks its table meanwhile
 * (after most keys went). SCAN may answer a few more keys than asked: those go into the cursor,
 * and start the next page.
 */
export async function listRedisKeys(
  client: Redis | Cluster,
  cluster: boolean,
  options: LockListOptions,
  timeoutMs: number,
): Promise<LockListPage> {
  const clientPrefix = client.options.keyPrefix ?? '';
  const masters = cluster ? await mastersBySlot(client as Cluster, timeoutMs) : [{ slot: 0, node: client as Redis }];
  const at = decodeCursor(options.cursor);
  const keys: string[] = [...at.pending];
  let index = at.slot === Infinity ? masters.length : masters.findIndex((master) => master.slot === at.slot);
  if (index < 0) {
    // The master of that slot range changed (a reshard): carry on from the one serving it now.
    index = masters.findIndex((master, i) => master.slot <= at.slot && (masters[i + 1]?.slot ?? Infinity) > at.slot);
  }
  let scan = at.scan;
  const pattern = escapeGlob(clientPrefix + options.prefix) + '*';
  while (index < masters.length && keys.length < options.limit) {
    const [next, found] = await masters[index].node.scan(scan, 'MATCH', pattern, 'COUNT', options.limit - keys.length, 'TYPE', 'string');
    const seen = new Set(keys);
    for (const name of found.sort()) {
      const key = name.slice(clientPrefix.length);
      if (!seen.has(key) && !isCompanion(key, clientPrefix)) keys.push(key);
    }
    scan = next;
    if (scan === '0') index++;
  }
  if (index >= masters.length && keys.length <= options.limit) return { keys };
  const page = keys.slice(0, options.limit);
  const cursor = index >= masters.length ? { slot: Infinity, scan: '0' } : { slot: masters[index].slot, scan };
  return { keys: page, cursor: encodeCursor({ ...cursor, pending: keys.slice(options.limit) }) };
}

/** Each master once, with the first slot it serves, in slot order; once the client knows the slots. */
async function mastersBySlot(cluster: Cluster, timeoutMs: number): Promise<{ slot: number; node: Redis }[]> {
  if (cluster.status !== 'ready') await withTimeout(new Promise((resolve) => cluster.once('ready', resolve)), timeoutMs);
  if (cluster.status !== 'ready') {
    throw new LockBackendError('redis', `list failed: the Redis Cluster client is '${cluster.status}', so its masters are not known yet.`);
  }
  const firstSlot = new Map<string, number>();
  cluster.slots.forEach((nodes, slot) => {
    const master = nodes?.[0];
    if (master !== undefined && !firstSlot.has(master)) firstSlot.set(master, slot);
  });
  const masters = cluster.nodes('master').map((node) => ({ slot: firstSlot.get(`${node.options.host}:${node.options.port}`) ?? -1, node }));
  return masters.filter((master) => master.slot >= 0).sort((a, b) => a.slot - b.slot);
}

const SUFFIXES = [':fence', ':holder'] as const;

/** A string companion of a lock (its fencing counter or holder string), which SCAN's TYPE string finds too. */
function isCompanion(key: string, clientPrefix: string): boolean {
  if (!key.startsWith('{')) return false;
  for (const suffix of SUFFIXES) {
    if (!key.endsWith(suffix)) continue;
    const base = key.slice(0, -suffix.length);
    // `{<key>}` or `{<tag>}:<key>` (see lockKeyLayout), the key with the client's prefix.
    const candidates = [base.slice(1, -1), base.slice(base.indexOf('}:') + 2)]
      .filter((prefixed) => prefixed.startsWith(clientPrefix))
      .map((prefixed) => prefixed.slice(clientPrefix.length));
    const field = suffix === ':fence' ? 'fence' : 'holder';
    if (candidates.some((lock) => lockKeyLayout(lock, clientPrefix)[field] === key)) return true;
  }
  return false;
}

function escapeGlob(text: string): string {
  return text.replace(/[*?[\]\\]/g, '\\$&');
}

interface ScanCursor {
  /** First slot of the master being scanned (0 outside Cluster); Infinity: every master done. */
  slot: number;
  /** SCAN's cursor on it. */
  scan: string;
  /** Keys SCAN answered beyond the page: the next page starts with them. */
  pending: string[];
}

function encodeCursor(cursor: ScanCursor): string {
  return Buffer.from(JSON.stringify([cursor.slot === Infinity ? -1 : cursor.slot, cursor.scan, cursor.pending])).toString('base64url');
}

function decodeCursor(cursor: string | undefined): ScanCursor {
  if (cursor === undefined) return { slot: 0, scan: '0', pending: [] };
  try {
    const [slot, scan, pending] = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as [number, string, string[]];
    if (Number.isInteger(slot) && /^\d+$/.test(scan) && Array.isArray(pending) && pending.every((key) => typeof key === 'string')) {
      return { slot: slot === -1 ? Infinity : slot, scan, pending };
    }
  } catch {
    // Not ours: said below.
  }
  throw new InvalidLockOptionsError(
    'cursor',
    `list: cursor '${cursor.slice(0, 40)}' is not one the Redis backend returned. Pass a page's cursor back unchanged.`,
  );
}
