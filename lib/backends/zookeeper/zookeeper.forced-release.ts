import type { ZooKeeperClient } from './zookeeper.client.js';
import { lineStanding, parseEntry } from './zookeeper.kinds.js';
import { childrenOf, inLineOrder, isNoNode, LinePaths } from './zookeeper.line.js';

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
  const lines = await Promise.all(keys.map((key) => childrenOf(client, paths.parent(key))));
  const nodes = keys.flatMap((key, i) => {
    const line = inLineOrder(lines[i]);
    return line
      .filter((name) => LinePaths.owner(name) === owner)
      .map((name) => {
        const standing = lineStanding(line, name, parseEntry(name)!.limit);
        return { path: `${paths.parent(key)}/${name}`, in: 'in' in standing && standing.in };
      });
  });
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
