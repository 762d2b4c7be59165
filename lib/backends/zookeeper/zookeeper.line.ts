import { InvalidLockKeyError } from '../../lock.errors.js';
import { ZooKeeperError, type ZooKeeperClient } from './zookeeper.client.js';
import { kindSuffix, lineStanding, parseEntry } from './zookeeper.kinds.js';
import { isPendingData, pendingData, readAhead } from './zookeeper.pending.js';
import type { LiveSession } from './zookeeper.session.js';

/**
 * One request of this process: its place in the line of each of its keys. All its nodes were
 * created by one multi(), so they share one zxid: in every line, requests stand in the order in
 * which ZooKeeper applied them. Those after the first line that keeps it out are pending (see
 * zookeeper.pending.ts): every wait is for a node with a smaller zxid, so none is a cycle.
 */
export interface LineRequest {
  readonly owner: string;
  readonly keys: readonly string[];
  /** How many holders each key admits, as TryAcquireOptions.limits (1: exclusive). Carried by the node names. */
  limits: readonly number[];
  /** Who asks (encodeIdentity's string, UTF-8), as its nodes' data: read by inspect, by nothing that decides. */
  data?: Buffer;
  /** The node per key (same order as keys), once created and known. */
  nodes: string[] | undefined;
  /** The session that created them: a node of an earlier one is gone, or going. */
  generation: number;
  /** A create whose answer never came: the nodes may exist, and are found by the owner in their name. */
  uncertain: boolean;
  /**
   * The session the last create was sent in. Nodes found by name after a lost answer are the
   * request's place only in that session: those of an earlier one end with it (which the server
   * may declare well after this process gave it up), not with the session that would hold them.
   */
  createdIn: number;
  /**
   * The create in flight, until its outcome is known, and the session it was sent in. The client
   * queues requests while it has no connection and sends them once it reconnects, so a create can
   * be applied long after the attempt that sent it gave up: nothing may look for its nodes, or make
   * others, before then. (A client closed without a connection never answers what it queued: a
   * create of an earlier session is not waited for, its nodes went with that session.)
   */
  creating: { settled: Promise<void>; generation: number } | undefined;
  /** The nodes' czxid: the fencing token. */
  czxid: number | undefined;
  held: boolean;
  /**
   * The nodes it went in with. An attempt that timed out goes on in the background, and may find
   * them gone (released by force, or the session lost) and line up again with new ones: those
   * hold nothing, so an extension that finds other nodes says the lock was taken.
   */
  heldWith?: readonly string[];
  /**
   * Nodes watched already (a watch is one-shot and stays set until it fires), and whether their
   * mark (data set: that waiter went in) counts as a wake-up, or only their deletion.
   */
  readonly watched: Map<string, boolean>;
  /**
   * Its nodes marked as in while it still waits for other keys: a permit caller right behind one of
   * them waits for that mark to start watching the holders, and would sleep through its turn.
   */
  marked?: Set<string>;
  /**
   * A request of one key, exclusive: the node just ahead of its own (`node`) when that one is
   * first in the line (it was first at the last look, or its data was set since: an exclusive node
   * is written only as it goes in). Sequence numbers only grow, so nothing can come in ahead: once
   * it is deleted (`gone`), the request is first, and takes the key without reading its line again.
   */
  firstAhead?: { path: string; node: string; gone: boolean };
  /**
   * A request of one key, exclusive: the node just ahead of its own in the whole line, when it is
   * the one watched (no pending node between them). Its data being set means it went in, and is
   * first: the hand-over without a look (firstAhead) holds only for it, as a pending node between
   * could turn waiting meanwhile.
   */
  adjacent?: string;
  /**
   * When the last write of its nodes that ZooKeeper applied was sent (performance.now()): the
   * session outlives it by the validity the backend counts from an answered request.
   */
  certifiedAt?: number;
  /**
   * A request of one key, exclusive, that waits: a watch on its own node, set on the connection
   * `connection` (see ZooKeeperSession.connectedOn). `gone` once the node was deleted or written,
   * or the watch could not be set. While it stays quiet on that connection, the node was there
   * when the one ahead went: events reach a client in the order ZooKeeper applied them.
   */
  ownWatch?: { node: string; connection: number; set: boolean; gone: boolean };
  /** A predecessor went while nobody listened: the next watch() calls its callback at once. */
  woken: boolean;
  waker: (() => void) | undefined;
}

/**
 * The largest request sent, in bytes: a ZooKeeper server closes the connection of a client that
 * sends a packet over its `jute.maxbuffer` (0xfffff, 1 MiB less a byte, by default), which would
 * cut every lock of this process off with it, attempt after attempt. A margin is left for the
 * rest of the packet.
 */
export const MAX_REQUEST_BYTES = 1_000_000;
/** What a create in a multi() carries besides its path: headers, no data, the open ACL, flags. */
const CREATE_OP_BYTES = 64;

/** Path and name rules: keys and owners are escaped, so `/`, `.` and `..` cannot make paths. */
export class LinePaths {
  constructor(readonly root: string) {}

  /** Refuses keys whose create request would be over MAX_REQUEST_BYTES, before anything is sent. `data`: each node's. */
  checkSize(keys: readonly string[], owner: string, data = 0): void {
    let bytes = CREATE_OP_BYTES;
    // Escaped, a path is ASCII: one byte a character.
    for (const key of keys) bytes += this.prefix(key, owner, 2 ** 53).length + 10 + CREATE_OP_BYTES + data;
    if (bytes <= MAX_REQUEST_BYTES) return;
    const shown = keys.length === 1 ? `Key '${keys[0].slice(0, 60)}…'` : `${keys.length} keys ('${keys[0].slice(0, 60)}…', …)`;
    throw new InvalidLockKeyError(
      `${shown} would make a ZooKeeper request of about ${bytes} bytes (keys are percent-encoded in node names), over the ` +
        `${MAX_REQUEST_BYTES} that a server accepts with its default jute.maxbuffer (1 MB); it would close this process's ` +
        `connection. Lock fewer or shorter keys: an identifier rather than a payload.`,
    );
  }

  parent(key: string): string {
    return `${this.root}/${escape(key)}`;
  }

  /** `<root>/<key>/<owner><kind>-`: ZooKeeper appends a 10-digit sequence number (kinds: zookeeper.kinds.ts). */
  prefix(key: string, owner: string, limit = 1): string {
    return `${this.parent(key)}/${escape(owner)}${kindSuffix(limit)}-`;
  }

  /** The owner named by a node, or undefined for a node that is not a line entry. */
  static owner(name: string): string | undefined {
    return parseEntry(name)?.owner;
  }
}

function escape(text: string): string {
  return encodeURIComponent(text).replace(/\./g, '%2E');
}

/** A line's entries, first (the holder) first: by sequence number, which ZooKeeper gave in order. */
export function inLineOrder(children: readonly string[]): string[] {
  return children.filter((name) => /-\d{10}$/.test(name)).sort((a, b) => Number(a.slice(-10)) - Number(b.slice(-10)));
}

/** A node with the version its data had when read: written or deleted only if still at it. */
export interface Versioned {
  path: string;
  version: number;
}

/**
 * What a look at the lines asks of the request before it stands where it found itself: `passed`,
 * the pending nodes ahead of it in the lines it is in on, to delete; `flips`, its own pending nodes
 * up to the first line that keeps it out (every key before them is its), to turn waiting; `marks`,
 * its nodes to mark as in (a permit caller behind may watch them).
 */
interface Writes {
  marks: string[];
  flips: Versioned[];
  passed: Versioned[];
}

/** Where a request stands: in every line, refused by one, or the nodes it waits for. */
export type Position =
  | ({ first: true } & Writes)
  | ({ first: false; waitFor: { path: string; marks: boolean; version: number }[]; firstAhead?: string; adjacent?: string } & Writes)
  | { mismatch: { key: string; limit: number } }
  | { gone: true };

/**
 * Looks at every line of the request (one getChildren per key, sent together, then the data of
 * the nodes ahead that can decide, see readAhead): in all of them means held (zookeeper.kinds.ts
 * says who is in, zookeeper.pending.ts which nodes count). A node missing from its line means the
 * request lost its place (its session ended, its lease ran out and its holder deleted it, or it
 * was pending and a caller entered past it). It waits in the first line that keeps it out, and is
 * pending in the lines after it.
 */
export async function position(
  client: ZooKeeperClient,
  paths: LinePaths,
  request: LineRequest,
  /** The lines read right behind the create that made the request's nodes (see Created). */
  behind?: Created['lines'],
): Promise<Position> {
  const nodes = request.nodes!;
  // A parent gone (an operator deleted the whole line) took our node with it: gone, not an error.
  const [lines, own] = await Promise.all([
    Promise.all(
      request.keys.map(async (key, i) => {
        const parent = paths.parent(key);
        const line = await behind?.[i];
        // Read after the create only if it shows the node (see Created.lines).
        return line?.includes(nodes[i].slice(parent.length + 1)) ? line : childrenOf(client, parent);
      }),
    ),
    // Its own nodes after the first: pending or not, and their version (the first never is).
    Promise.all(nodes.map((node, i) => (i === 0 ? undefined : client.getData(node)))),
  ]);
  const looks = await Promise.all(
    nodes.map(async (node, i) => {
      const parent = paths.parent(request.keys[i]);
      const line = inLineOrder(lines[i]);
      const name = node.slice(parent.length + 1);
      const at = line.indexOf(name);
      if (at < 0 || (i > 0 && !own[i])) return undefined;
      const limit = request.limits[i] ?? 1;
      const ahead = await readAhead(client, parent, line.slice(0, at), limit === 1);
      const standing = lineStanding([...ahead.counted, ...line.slice(at)], name, limit);
      return { parent, line, at, ahead, standing };
    }),
  );
  if (looks.some((look) => look === undefined || 'gone' in look.standing)) return { gone: true };
  const found = looks as NonNullable<(typeof looks)[number]>[];
  const mismatched = found.findIndex(({ standing }) => 'mismatch' in standing);
  if (mismatched >= 0)
    return { mismatch: { key: request.keys[mismatched], limit: (found[mismatched].standing as { mismatch: number }).mismatch } };
  const blocked = found.findIndex(({ standing }) => 'in' in standing && !standing.in);
  const upTo = blocked < 0 ? nodes.length : blocked;
  const writes: Writes = { marks: [], flips: [], passed: [] };
  for (let i = 0; i < upTo; i++) {
    const { parent, ahead, standing } = found[i];
    writes.passed.push(...ahead.pending.map((entry) => ({ path: `${parent}/${entry.name}`, version: entry.version })));
    if ('mark' in standing && standing.mark) writes.marks.push(nodes[i]);
  }
  for (let i = 1; i <= upTo && i < nodes.length; i++) {
    if (isPendingData(own[i]!.data)) writes.flips.push({ path: nodes[i], version: own[i]!.stat.version });
  }
  if (blocked < 0) return { first: true, ...writes };
  const { parent, line, at, ahead, standing } = found[blocked];
  const waitFor = (standing as { waitFor: string[]; marks: boolean }).waitFor.map((name) => ({
    path: `${parent}/${name}`,
    marks: (standing as { marks: boolean }).marks,
    version: ahead.versions.get(name) ?? 0,
  }));
  // One exclusive key, the node just ahead of it in the whole line watched (no pending node
  // between), and that node first of its line (see LineRequest.firstAhead).
  const single = nodes.length === 1 && (request.limits[0] ?? 1) === 1;
  const adjacent = single && at > 0 && waitFor[0].path === `${parent}/${line[at - 1]}` ? waitFor[0].path : undefined;
  const firstOfLine = adjacent !== undefined ? line[0] : undefined;
  const firstAhead = firstOfLine !== undefined && waitFor[0].path.endsWith(`/${firstOfLine}`) ? waitFor[0].path : undefined;
  return { first: false, waitFor, ...writes, ...(firstAhead && { firstAhead }), ...(adjacent && { adjacent }) };
}

/** What a create answered, and the lines read right behind it. */
export interface Created {
  nodes: string[];
  /** Their czxid (the fencing token): the zxid of the multi() that made them. */
  czxid: number | undefined;
  /**
   * Each key's line, read right behind the create (undefined where that read failed). A session's
   * requests are answered in order and a read after the same session's write, so a line that
   * shows the request's node was read after it was made; one that does not is read again.
   */
  lines: Promise<string[] | undefined>[];
}

/** The data the parent of a request's first key is set to, by the multi() that makes the request's nodes. */
const PARENT_DATA = Buffer.alloc(0);

/**
 * Creates the request's nodes in one multi(). A key's parent is created when missing (it may have
 * been cleaned up since): the multi then fails with NO_NODE, and is sent again once it exists.
 *
 * The same multi() sets the data of the first key's parent (to nothing, as it is made): its answer
 * to a setData carries the node's stat, whose mzxid is the multi's own zxid, and so the czxid of
 * every node it made: the fencing token comes with the create's answer, without a read of the node
 * after it. The lines are read right behind the create, without waiting for its answer: an
 * uncontended acquisition is one round trip.
 */
export async function createNodes(
  session: LiveSession,
  paths: LinePaths,
  request: LineRequest,
  knownParents: Set<string>,
): Promise<Created> {
  const { client } = session;
  for (let attempt = 0; ; attempt++) {
    const missing = request.keys.map((key) => paths.parent(key)).filter((parent) => !knownParents.has(parent));
    await Promise.all(missing.map((parent) => createParent(client, paths.root, parent, knownParents)));
    const answer = client.multi([
      ...request.keys.map(
        (key, i) =>
          ({
            op: 'create',
            path: paths.prefix(key, request.owner, request.limits[i] ?? 1),
            // Pending after its first key (see zookeeper.pending.ts).
            data: i === 0 ? request.data : pendingData(request.data),
            mode: 'ephemeral-sequential',
          }) as const,
      ),
      { op: 'set', path: paths.parent(request.keys[0]), data: PARENT_DATA },
    ]);
    const lines = request.keys.map((key) => childrenOf(client, paths.parent(key)).catch(() => undefined));
    try {
      const { created, zxid } = await answer;
      return { nodes: created, czxid: zxid, lines };
    } catch (error) {
      if (!(error instanceof ZooKeeperError && error.code === 'NO_NODE') || attempt >= 3) throw error;
      for (const key of request.keys) knownParents.delete(paths.parent(key));
    }
  }
}

/**
 * Finds the request's nodes by the owner in their names (after a create whose answer was lost):
 * per key, every node of the owner, earliest first (creates whose answers were all lost make one
 * each). A write goes first: the server this client reconnected to may be a follower that has not
 * applied the create yet, and it answers a write only once it has applied everything before it.
 */
export async function findNodes(client: ZooKeeperClient, paths: LinePaths, request: LineRequest): Promise<string[][]> {
  // Any write will do, even one that fails: it goes through the leader in order. (No parent, no node.)
  await client.multi([{ op: 'check', path: paths.parent(request.keys[0]) }]).catch((error: unknown) => {
    if (!isNoNode(error)) throw error;
  });
  const lines = await Promise.all(request.keys.map((key) => childrenOf(client, paths.parent(key))));
  return request.keys.map((key, i) =>
    inLineOrder(lines[i])
      .filter((child) => LinePaths.owner(child) === request.owner)
      .map((name) => `${paths.parent(key)}/${name}`),
  );
}

/** Deletes nodes, all at once when they are all there, else one by one; a missing node is no error. */
export async function removeNodes(client: ZooKeeperClient, nodes: readonly string[]): Promise<void> {
  try {
    await client.multi(nodes.map((path) => ({ op: 'remove', path }) as const));
  } catch (error) {
    if (!isNoNode(error)) throw error;
    await Promise.all(nodes.map((path) => client.remove(path).catch((e: unknown) => (isNoNode(e) ? undefined : Promise.reject(e)))));
  }
}

/** A node's children; none when the node is gone (an operator deleted a whole line, or it was cleaned up). */
export function childrenOf(client: ZooKeeperClient, path: string): Promise<string[]> {
  return client.getChildren(path).catch((error: unknown) => (isNoNode(error) ? [] : Promise.reject(error)));
}

export function isNoNode(error: unknown): boolean {
  return error instanceof ZooKeeperError && error.code === 'NO_NODE';
}

async function createParent(client: ZooKeeperClient, root: string, parent: string, knownParents: Set<string>): Promise<void> {
  try {
    await client.create(parent, 'persistent');
  } catch (error) {
    if (isNoNode(error)) {
      await createRoot(client, root);
      await createIfMissing(client, parent);
    } else if (!(error instanceof ZooKeeperError && error.code === 'NODE_EXISTS')) {
      throw error;
    }
  }
  knownParents.add(parent);
}

/** The root is missing: made once, segment by segment (each with the client's ACL). */
export async function createRoot(client: ZooKeeperClient, root: string): Promise<void> {
  const segments = root.split('/').slice(1);
  for (let i = 1; i <= segments.length; i++) await createIfMissing(client, `/${segments.slice(0, i).join('/')}`);
}

async function createIfMissing(client: ZooKeeperClient, path: string): Promise<void> {
  await client.create(path, 'persistent').catch((error: unknown) => {
    if (!(error instanceof ZooKeeperError && error.code === 'NODE_EXISTS')) throw error;
  });
}
