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
 * byte after '/'). Entries that are not a key's (the anchors of attempts, the access probe) have a
 * `%` that encoding never makes, and are skipped. Linearizable reads; each reads about twice as
 * many entries as keys wanted, more where keys have long lines.
 */
export async function listEtcd(connection: EtcdConnection, keys: EtcdKeys, options: LockListOptions): Promise<LockListPage> {
  const base = `${keys.prefix}${encode(options.prefix)}`;
  const end = prefixEnd(Buffer.from(base));
  const after = options.cursor === undefined ? undefined : decodeKeyCursor(options.cursor, 'etcd');
  let start = Buffer.from(after === undefined ? base : `${keys.prefix}${encode(after)}0`);
  const held: string[] = [];
  const what = { op: 'list', keys: [] };
  for (;;) {
    const request = { key: start, range_end: end, limit: (options.limit + 1) * ENTRIES_PER_KEY };
    const { kvs, more } = (await connection.txn({ success: [{ request_range: request }] }, what)).responses[0].response_range;
    for (const { key, value } of kvs) {
      const name = key.toString().slice(keys.prefix.length);
      const slash = name.lastIndexOf('/');
      const encoded = name.slice(0, slash);
      if (slash < 0 || /%(?!25|2F)/.test(encoded) || !isHeldValue(value)) continue;
      const lock = decodeURIComponent(encoded);
      if (held.at(-1) !== lock) held.push(lock);
    }
    if (held.length > options.limit || !more || kvs.length === 0) break;
    start = Buffer.concat([kvs[kvs.length - 1].key, Buffer.from([0])]);
  }
  if (held.length <= options.limit) return { keys: held };
  const page = held.slice(0, options.limit);
  return { keys: page, cursor: encodeKeyCursor(page[page.length - 1]) };
}
