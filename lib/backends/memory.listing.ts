import type { LockListOptions, LockListPage } from './lock-backend.interface.js';
import { decodeKeyCursor, encodeKeyCursor } from './key-cursor.js';

/**
 * One page of list() over keys kept in an unordered map: the `limit` smallest held keys after the
 * cursor, which is the last key of the previous page. Keys come in sorted order, so a key held
 * from the first page to the last is on exactly one page, whatever was taken or freed meanwhile.
 * One pass over the map per page, keeping at most `limit` keys: no sorted index to keep up on the
 * acquire path, and no copy of the whole map.
 */
export function listPage<S>(states: ReadonlyMap<string, S>, options: LockListOptions, held: (state: S) => boolean): LockListPage {
  const { prefix, limit } = options;
  const after = options.cursor === undefined ? undefined : decodeKeyCursor(options.cursor, 'memory');
  /** Sorted; at most limit + 1, the extra one telling that another page follows. */
  const page: string[] = [];
  for (const [key, state] of states) {
    if (!key.startsWith(prefix) || (after !== undefined && key <= after)) continue;
    if (page.length > limit && key >= page[limit]) continue;
    if (!held(state)) continue;
    page.splice(insertionPoint(page, key), 0, key);
    if (page.length > limit + 1) page.pop();
  }
  if (page.length <= limit) return { keys: page };
  page.pop();
  return { keys: page, cursor: encodeKeyCursor(page[page.length - 1]) };
}

function insertionPoint(sorted: readonly string[], key: string): number {
  let low = 0;
  let high = sorted.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (sorted[middle] < key) low = middle + 1;
    else high = middle;
  }
  return low;
}
