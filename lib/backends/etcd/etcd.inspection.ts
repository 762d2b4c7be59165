import type { IKeyValue } from 'etcd3';
import type { LockHolderState, LockState, LockWaiterState } from '../lock-backend.interface.js';
import type { EtcdConnection } from './etcd.connection.js';
import { readIdentity, type StoredIdentity } from './etcd.identity.js';
import { isHeldValue, parseValue } from './etcd.kinds.js';
import type { EtcdKeys } from './etcd.keys.js';
import type { EtcdLine } from './etcd.line.js';

/** How many waiters inspect tells, first first. */
const WAITERS_SHOWN = 100;

/**
 * inspect() on etcd: the key's line and the identity keys beside it in one read, then each
 * holder's lease (one request a holder). Holders are the entries marked held (an entry first in
 * line but waiting for another of its keys holds nothing); waiters the entries marked waiting, in
 * line order. A pending entry (a caller of several keys that waits for an earlier one) stands in
 * no line yet, and is not shown. An entry shows who asked and since when from its identity key;
 * an entry of a release before them has none, and shows without them.
 */
export async function inspectEtcd(connection: EtcdConnection, line: EtcdLine, keys: EtcdKeys, key: string): Promise<LockState | undefined> {
  const what = { op: 'inspect', keys: [key] };
  const [entries, identities] = (await connection.txn(line.wholeLine(key), what)).responses.map((r) => r.response_range.kvs);
  const held = entries.filter((kv) => isHeldValue(kv.value));
  if (held.length === 0) return undefined;
  const who = new Map(identities.map((kv) => [keys.ownerOf(kv.key), kv.value]));
  const identityOf = (entry: IKeyValue): StoredIdentity => {
    const identity = who.get(keys.ownerOf(entry.key));
    return identity ? readIdentity(identity) : {};
  };
  const seconds = await Promise.all(held.map((kv) => connection.timeToLive(kv.lease, what)));
  const holders: LockHolderState[] = held
    .map((kv, i) => {
      const { since, ...identity } = identityOf(kv);
      return {
        owner: keys.ownerOf(kv.key),
        ttlMs: seconds[i] * 1000,
        fencingToken: Number(kv.create_revision),
        ...(since !== undefined && { acquiredAt: since }),
        ...identity,
      };
    })
    .filter((holder) => holder.ttlMs > 0);
  if (holders.length === 0) return undefined;
  const waiters: LockWaiterState[] = entries
    .filter((kv) => parseValue(kv.value).state === 'waiting')
    .slice(0, WAITERS_SHOWN)
    .map((kv) => {
      const { since, ...identity } = identityOf(kv);
      const { limit } = parseValue(kv.value);
      return {
        owner: keys.ownerOf(kv.key),
        ...(since !== undefined && { waitingSince: since }),
        ...(limit !== 1 && { limit }),
        ...identity,
      };
    });
  const { limit } = parseValue(held[0].value);
  return {
    key,
    owner: holders[0].owner,
    ttlMs: Math.max(...holders.map((h) => h.ttlMs)),
    fencingToken: Math.max(...holders.map((h) => h.fencingToken!)),
    ...(limit !== 1 && { limit }),
    holders,
    waiters,
  };
}
