import { decodeIdentity } from '../../lock-identity.js';
import type { LockHolderState, LockState, LockWaiterState } from '../lock-backend.interface.js';
import type { ZooKeeperClient } from './zookeeper.client.js';
import { lineStanding, parseEntry } from './zookeeper.kinds.js';
import { childrenOf, inLineOrder, type LinePaths } from './zookeeper.line.js';
import { identityData, isPendingData } from './zookeeper.pending.js';

/** How many waiters inspect tells, first first. */
const WAITERS_SHOWN = 100;

/**
 * A key's holders and line, read off its line: the children, then each node's data and stat, in
 * parallel (who is in follows from their names, see zookeeper.kinds.ts, and from which of them are
 * pending, see zookeeper.pending.ts: a pending node is a waiter, and keeps nobody out).
 *
 * Who asks is a node's data, written when it is made: encodeIdentity's string (after PENDING in a
 * pending node's; nodes of a release before it carry none, or a permit caller's mark, `in`, and
 * show without a name). A node that carries it is written again when it goes in after waiting
 * (ZooKeeperLockBackend.attempt), so it went in at its mtime, or at its creation (its ctime) if
 * never written; a node that carries none tells no time it went in. A waiter waits since its node's creation. Times are those of the
 * ZooKeeper server that applied each write.
 *
 * `ttlOf` gives a holder's remaining lease (what this process knows of its own).
 */
export async function inspectZooKeeper(
  client: ZooKeeperClient,
  paths: LinePaths,
  key: string,
  ttlOf: (owner: string) => number,
): Promise<LockState | undefined> {
  const parent = paths.parent(key);
  const line = inLineOrder(await childrenOf(client, parent));
  const read = await Promise.all(line.map((name) => client.getData(`${parent}/${name}`)));
  // Gone since the children were read: left out. Pending nodes wait, and keep nobody out.
  const nodes = new Map(line.flatMap((name, i) => (read[i] ? [[name, read[i]] as const] : [])));
  const counted = [...nodes.keys()].filter((name) => !isPendingData(nodes.get(name)!.data));
  // Who is in: a prefix of the line, less callers about to leave it as they disagree on its limit.
  const inside = new Set<string>();
  for (const name of counted) {
    const standing = lineStanding(counted, name, parseEntry(name)?.limit ?? 1);
    if ('in' in standing && standing.in) inside.add(name);
    else if (!('mismatch' in standing)) break;
  }
  if (inside.size === 0) return undefined;
  const waiting = [...nodes.keys()].filter((name) => !inside.has(name)).slice(0, WAITERS_SHOWN);
  const holders: LockHolderState[] = [];
  const waiters: LockWaiterState[] = [];
  for (const name of [...inside, ...waiting]) {
    const node = nodes.get(name)!;
    const { owner, limit } = parseEntry(name)!;
    const identity = decodeIdentity(identityData(node.data));
    if (inside.has(name)) {
      const acquiredAt = identity.instance === undefined ? undefined : node.stat.version > 0 ? node.stat.mtime : node.stat.ctime;
      holders.push({
        owner,
        ttlMs: ttlOf(owner),
        fencingToken: node.stat.czxid,
        ...(acquiredAt !== undefined && { acquiredAt }),
        ...identity,
      });
    } else {
      waiters.push({ owner, waitingSince: node.stat.ctime, ...(limit !== 1 && { limit }), ...identity });
    }
  }
  if (holders.length === 0) return undefined;
  const limit = parseEntry([...inside][0])!.limit;
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
