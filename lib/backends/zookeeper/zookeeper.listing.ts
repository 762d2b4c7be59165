import { decodeKeyCursor, encodeKeyCursor } from '../key-cursor.js';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import type { ZooKeeperClient } from './zookeeper.client.js';
import { childrenOf, inLineOrder, type LinePaths } from './zookeeper.line.js';
import { isPendingData } from './zookeeper.pending.js';

/**
 * list() on ZooKeeper: the children of the root, one node per key with a line (ZooKeeper has no
 * paged read of children, so each page reads every name), those after the cursor's key in sorted
 * order, and then the children of each in turn, a page's worth at a time, until the page holds
 * `limit` keys that have someone in line who is not pending: the first of those holds it, as
 * inspect() says (zookeeper.pending.ts).
 */
export async function listZooKeeper(client: ZooKeeperClient, paths: LinePaths, options: LockListOptions): Promise<LockListPage> {
  const after = options.cursor === undefined ? undefined : decodeKeyCursor(options.cursor, 'zookeeper');
  const names = await childrenOf(client, paths.root);
  const candidates = names
    .map(decodeName)
    .filter((key): key is string => key !== undefined && key.startsWith(options.prefix) && (after === undefined || key > after))
    .sort();
  const held: string[] = [];
  for (let from = 0; from < candidates.length && held.length <= options.limit;) {
    const batch = candidates.slice(from, from + options.limit + 1 - held.length);
    from += batch.length;
    const lines = await Promise.all(batch.map((key) => isHeld(client, paths.parent(key))));
    batch.forEach((key, i) => lines[i] && held.push(key));
  }
  if (held.length <= options.limit) return { keys: held };
  const page = held.slice(0, options.limit);
  return { keys: page, cursor: encodeKeyCursor(page[page.length - 1]) };
}

/** Whether a line holds a node that is not pending: its nodes' data, read first first until one is. */
async function isHeld(client: ZooKeeperClient, parent: string): Promise<boolean> {
  const line = inLineOrder(await childrenOf(client, parent));
  for (const name of line) {
    const node = await client.getData(`${parent}/${name}`);
    if (node && !isPendingData(node.data)) return true;
  }
  return false;
}

/** The key a parent node is named after; undefined for a name that is not one (another's node under the root). */
function decodeName(name: string): string | undefined {
  try {
    return decodeURIComponent(name);
  } catch {
    return undefined;
  }
}
