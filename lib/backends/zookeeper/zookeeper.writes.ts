import { ZooKeeperError, type ZooKeeperClient, type ZooKeeperOp } from './zookeeper.client.js';
import { isNoNode, type Versioned } from './zookeeper.line.js';

/*
 * The writes of an attempt: each a multi() that checks every node of the request, so that the
 * leader itself answers for the session (a read alone could come from a follower cut off from it,
 * which may have ended the session already).
 */

/** The data of a permit caller's node once it went in (see zookeeper.kinds.ts). */
const IN = Buffer.from('in');
/** The data of a node that turned from pending to waiting for a request that does not say who asks. */
const NONE = Buffer.alloc(0);

/** A write that fails unless every node is still there. */
export async function stillThere(client: ZooKeeperClient, nodes: readonly string[]): Promise<boolean> {
  try {
    await client.multi(nodes.map((path): ZooKeeperOp => ({ op: 'check', path })));
    return true;
  } catch (error) {
    if (isNoNode(error)) return false;
    throw error;
  }
}

/**
 * The write a look asks for (see Position): every node of the request's checked, those in `marks`
 * set to `data` (or IN) as a sign that they went in (their version counts, not their data: who
 * asks, when the request carries it, is written again), its pending ones in `flips` turned waiting
 * at the version read, and the pending nodes ahead in `passed` deleted at the version read (see
 * zookeeper.pending.ts). 'gone': a node of its own is gone; 'changed': a node it read changed
 * meanwhile (a pending node ahead turned waiting, or went), or one of its own did: it looks again.
 */
export async function writeLook(
  client: ZooKeeperClient,
  nodes: readonly string[],
  { marks, flips, passed }: { marks: readonly string[]; flips: readonly Versioned[]; passed: readonly Versioned[] },
  data: Buffer | undefined,
): Promise<'done' | 'gone' | 'changed'> {
  const own = nodes.map((path): ZooKeeperOp => {
    const flip = flips.find((node) => node.path === path);
    if (flip) return { op: 'set', path, data: marks.includes(path) ? (data ?? IN) : (data ?? NONE), version: flip.version };
    return marks.includes(path) ? { op: 'set', path, data: data ?? IN } : { op: 'check', path };
  });
  try {
    await client.multi([...own, ...passed.map(({ path, version }): ZooKeeperOp => ({ op: 'remove', path, version }))]);
    return 'done';
  } catch (error) {
    if (!isNoNode(error) && !(error instanceof ZooKeeperError && error.code === 'BAD_VERSION')) throw error;
    // Which node failed the multi is not said: a gone node of its own is found by the next look.
    return flips.length + passed.length > 0 ? 'changed' : 'gone';
  }
}
