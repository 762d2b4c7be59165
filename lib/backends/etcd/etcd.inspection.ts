import type { LockHolderState, LockState } from '../lock-backend.interface.js';
import type { EtcdConnection } from './etcd.connection.js';
import { isHeldValue, parseValue } from './etcd.kinds.js';
import type { EtcdKeys } from './etcd.keys.js';
import type { EtcdLine } from './etcd.line.js';

/**
 * inspect() on etcd: the key's line in one read, its held entries, and each one's lease (one
 * request a holder). An entry first in line but waiting for another of its keys holds nothing.
 * Holders are listed when the key admits several; an exclusive one is the state itself.
 */
export async function inspectEtcd(connection: EtcdConnection, line: EtcdLine, keys: EtcdKeys, key: string): Promise<LockState | undefined> {
  const what = { op: 'inspect', keys: [key] };
  const kvs = (await connection.txn(line.wholeLine(key), what)).responses[0].response_range.kvs;
  const held = kvs.filter((kv) => isHeldValue(kv.value));
  if (held.length === 0) return undefined;
  const seconds = await Promise.all(held.map((kv) => connection.timeToLive(kv.lease, what)));
  const holders: LockHolderState[] = held
    .map((kv, i) => ({ owner: keys.ownerOf(kv.key), ttlMs: seconds[i] * 1000, fencingToken: Number(kv.create_revision) }))
    .filter((holder) => holder.ttlMs > 0);
  if (holders.length === 0) return undefined;
  const { limit } = parseValue(held[0].value);
  return {
    key,
    owner: holders[0].owner,
    ttlMs: Math.max(...holders.map((h) => h.ttlMs)),
    fencingToken: Math.max(...holders.map((h) => h.fencingToken!)),
    ...(limit !== 1 && { limit, holders }),
  };
}
