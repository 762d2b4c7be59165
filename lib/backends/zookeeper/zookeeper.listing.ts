import { decodeKeyCursor, encodeKeyCursor } from '../key-cursor.js';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import type { ZooKeeperClient } from './zookeeper.client.js';
import { childrenOf, type LinePaths } from './zookeeper.line.js';

/**
 * list() on ZooKeeper: the children of the root, one node per key with a line (ZooKeeper has no
 * paged read of children, so each page reads every name), those after the cursor's key in sorted
 * order, and then the children of each in turn, a page's worth at a time, until the page holds
 * `limit` keys that have someone in line: the first of a line holds it, as inspect() says.
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
    const lines = await Promise.all(batch.map((key) => childrenOf(client, paths.parent(key))));
    batch.forEach((key, i) => lines[i].length > 0 && held.push(key));
  }
  if (held.length <= options.limit) return { keys: held };
  const page = held.slice(0, options.limit);
  return { keys: page, cursor: encodeKeyCursor(page[page.length - 1]) };
}

/** The key a parent node is named after; undefined for a name that is not one (another's node under the root). */
function decodeName(name: string): string | undefined {
  try {
    return decodeURIComponent(name);
  } catch {
    return undefined;
  }
}
