import type { ZooKeeperClient } from './zookeeper.client.js';
import { lineStanding, parseEntry } from './zookeeper.kinds.js';
import { childrenOf, inLineOrder, isNoNode, LinePaths } from './zookeeper.line.js';
import { readEntries } from './zookeeper.pending.js';

/**
 * Releases an owner that this process did not make: another instance's holder or waiter, named by
 * an operator (releaseHolders: the lock board's "force release", revokeLock). Its nodes are found
 * by the owner in their names and deleted one by one, each by its own path, which carries its
 * owner and sequence number: a holder that left meanwhile frees nothing, and no later node of
 * anyone is touched. True when a node deleted here was in (held) when the line was read.
 *
 * Nothing in the owner's process changes here: its session keeps running, and the holder learns at
 * its next extension, which finds its node gone (as after a node deleted by hand). Deleting needs
 * the delete right on the key's node (its ACL: the credentials of the instances that make them).
 */
export async function releaseElsewhere(
  client: ZooKeeperClient,
  paths: LinePaths,
  keys: readonly string[],
  owner: string,
): Promise<boolean> {
  const lines = await Promise.all(
    keys.map(async (key) => {
      const parent = paths.parent(key);
      const line = inLineOrder(await childrenOf(client, parent));
      const owned = line.filter((name) => LinePaths.owner(name) === owner);
      // Who is in: read off the nodes that are not pending, up to the owner's last (zookeeper.pending.ts).
      const entries = await readEntries(client, parent, line.slice(0, line.indexOf(owned[owned.length - 1]) + 1));
      const counted = entries.filter((entry) => !entry.pending).map((entry) => entry.name);
      return owned.map((name) => {
        const standing = counted.includes(name) ? lineStanding(counted, name, parseEntry(name)!.limit) : undefined;
        return { path: `${parent}/${name}`, in: standing !== undefined && 'in' in standing && standing.in };
      });
    }),
  );
  const nodes = lines.flat();
  const deleted = await Promise.all(
    nodes.map((node) =>
      client.remove(node.path).then(
        () => node.in,
        (error: unknown) => (isNoNode(error) ? false : Promise.reject(error)),
      ),
    ),
  );
  return deleted.some(Boolean);
}
