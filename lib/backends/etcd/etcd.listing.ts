import { decodeKeyCursor, encodeKeyCursor } from '../key-cursor.js';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import { prefixEnd } from './etcd.access.js';
import type { EtcdConnection } from './etcd.connection.js';
import { isHeldValue } from './etcd.kinds.js';
import { encode, type EtcdKeys } from './etcd.keys.js';

/** Entries a waiter or a holder may have per key; read in batches of this many per key wanted. */
const ENTRIES_PER_KEY = 2;

/**
 * list() on etcd: range reads in key order over the entries under `<prefix><encoded prefix>`. A
 * key's entries (`<key>/<owner>`) sit together in that order, so a key is listed once, when its
 * entries show a holder, and the next page starts after its last entry (`<key>0`, '0' being the
 * byte after '/'). The backend's own keys (anchors, identity keys: one per entry) sit in a range
 * of their own under the prefix (EtcdKeys.own), which the reads go around rather than through: a
 * listing of the whole prefix would otherwise read every identity key before the first key named
 * after `%`. A name with a `%` that encoding never makes is not a lock's, and is skipped.
 * Linearizable reads; each reads about twice as many entries as keys wanted, more where keys have
 * long lines.
 */
export async function listEtcd(connection: EtcdConnection, keys: EtcdKeys, options: LockListOptions): Promise<LockListPage> {
  const base = `${keys.prefix}${encode(options.prefix)}`;
  const end = prefixEnd(Buffer.from(base));
  const after = options.cursor === undefined ? undefined : decodeKeyCursor(options.cursor, 'etcd');
  let start: Buffer = Buffer.from(after === undefined ? base : `${keys.prefix}${encode(after)}0`);
  const held: string[] = [];
  const what = { op: 'list', keys: [] };
  for (;;) {
    if (start.compare(keys.own.key) >= 0 && start.compare(keys.own.range_end) < 0) start = keys.own.range_end;
    if (start.compare(end) >= 0) break;
    // Up to the backend's own keys when they lie ahead, then on from after them.
    const stop = start.compare(keys.own.key) < 0 && keys.own.key.compare(end) < 0 ? keys.own.key : end;
    const request = { key: start, range_end: stop, limit: (options.limit + 1) * ENTRIES_PER_KEY };
    const { kvs, more } = (await connection.txn({ success: [{ request_range: request }] }, what)).responses[0].response_range;
    for (const { key, value } of kvs) {
      const name = key.toString().slice(keys.prefix.length);
      const slash = name.lastIndexOf('/');
      const encoded = name.slice(0, slash);
      if (slash < 0 || /%(?!25|2F)/.test(encoded) || !isHeldValue(value)) continue;
      const lock = decodeURIComponent(encoded);
      if (held.at(-1) !== lock) held.push(lock);
    }
    if (held.length > options.limit) break;
    if (more && kvs.length > 0) start = Buffer.concat([kvs[kvs.length - 1].key, Buffer.from([0])]);
    else if (stop !== end) start = keys.own.range_end;
    else break;
  }
  if (held.length <= options.limit) return { keys: held };
  const page = held.slice(0, options.limit);
  return { keys: page, cursor: encodeKeyCursor(page[page.length - 1]) };
}
