import type { ZooKeeperClient } from './zookeeper.client.js';

/**
 * Pending nodes: a request of several keys makes a node in the line of every key (one multi(),
 * whose zxid is its fencing token), and those after its first key are pending, said by their data,
 * until it is in on every key before them. A pending node keeps the request's place and token and
 * keeps nobody out: a caller that would be in but for pending nodes ahead of it deletes them first,
 * each with a remove at the version it read (so one that turned waiting meanwhile stays), and the
 * request that owned one, finding it gone, starts over at the back of every line with a new token.
 * So a holder of `a` that asks for `b` next (sorted order) takes it while a request for `[a, b]`
 * waits for `a`, and whoever enters a key after someone has a greater token than theirs.
 *
 * Once in on every key before it, the request turns its pending node into a waiting one with a
 * setData at the version it read: it fails when the node was deleted meanwhile (the request then
 * starts over). A node only ever goes from pending to waiting, never back, and no new node comes in
 * ahead of another: so the nodes that count ahead of a node only grow fewer, and a caller in on a
 * line (as far as it goes) stays in.
 *
 * The data of a pending node is PENDING, then a line feed and who asks when the request carries it:
 * decodeIdentity reads nothing of it (it starts with a line feed). Processes of a release before it
 * read a line's names only: they take a pending node for a waiter, and wait behind it.
 */
const PENDING = '\npending';

/** The data of a request's pending node: PENDING, then who asks when it says. */
export function pendingData(data: Buffer | undefined): Buffer {
  return Buffer.from(data?.length ? `${PENDING}\n${data.toString('utf8')}` : PENDING);
}

export function isPendingData(data: Buffer): boolean {
  const text = data.toString('utf8');
  return text === PENDING || text.startsWith(`${PENDING}\n`);
}

/** Who asks, as written beside PENDING (or the whole data of a node that is not pending). */
export function identityData(data: Buffer): string {
  const text = data.toString('utf8');
  return isPendingData(data) ? text.slice(PENDING.length + 1) : text;
}

/** A node of a line, as read: whether pending, and the version its data had then. */
export interface LineEntry {
  name: string;
  pending: boolean;
  version: number;
}

/**
 * The state of the named nodes of a line, read in parallel; nodes gone since the names were read
 * are left out.
 */
export async function readEntries(client: ZooKeeperClient, parent: string, names: readonly string[]): Promise<LineEntry[]> {
  const nodes = await Promise.all(names.map((name) => client.getData(`${parent}/${name}`)));
  return names.flatMap((name, i) => {
    const node = nodes[i];
    return node ? [{ name, pending: isPendingData(node.data), version: node.stat.version }] : [];
  });
}

/** How many nodes ahead an exclusive caller reads at a time, nearest first. */
const BATCH = 4;

/**
 * The nodes ahead of a caller (names in line order) that count for it, and the pending ones among
 * them. An exclusive caller needs only the nearest node that is not pending: the nodes ahead are
 * read nearest first, a few at a time, and those before the first that is not pending are not read
 * (they count, whatever they are: it waits for the nearest anyway). Any other caller reads them all.
 */
export async function readAhead(
  client: ZooKeeperClient,
  parent: string,
  ahead: readonly string[],
  exclusive: boolean,
): Promise<{ counted: string[]; pending: LineEntry[]; versions: Map<string, number> }> {
  const versions = new Map<string, number>();
  if (!exclusive) {
    const entries = await readEntries(client, parent, ahead);
    for (const entry of entries) versions.set(entry.name, entry.version);
    return { counted: entries.filter((e) => !e.pending).map((e) => e.name), pending: entries.filter((e) => e.pending), versions };
  }
  const pending: LineEntry[] = [];
  for (let end = ahead.length; end > 0; end -= BATCH) {
    const batch = ahead.slice(Math.max(0, end - BATCH), end);
    const entries = await readEntries(client, parent, batch);
    for (const entry of entries) versions.set(entry.name, entry.version);
    const counted = entries.filter((e) => !e.pending);
    if (counted.length > 0) {
      const nearest = ahead.indexOf(counted[counted.length - 1].name);
      const passed = new Set(entries.filter((e) => e.pending).map((e) => e.name));
      return {
        counted: ahead.slice(0, nearest + 1).filter((name) => !passed.has(name)),
        pending: entries.filter((e) => e.pending && ahead.indexOf(e.name) > nearest),
        versions,
      };
    }
    pending.push(...entries);
  }
  return { counted: [], pending, versions };
}
