import { performance } from 'node:perf_hooks';
import type { ZooKeeperSession } from './zookeeper.session.js';

/** A key's parent node is deleted once it has been empty (as far as this process knows) this long. */
const PARENT_IDLE_MS = 5_000;

/**
 * The parent node of each key's line, `<root>/<key>`: which ones this session knows to exist, and
 * their clean-up. A parent stays when its line empties; parents this process saw empty are deleted
 * once they stayed unused for a while. A delete of a parent someone uses fails (NOT_EMPTY), and a
 * request that finds its parent gone makes it again. ZooKeeper's container nodes would do this on
 * the server, but the client cannot create them (see docs/zookeeper.md).
 */
export class ParentNodes {
  /** Parents known to exist: a request creates only the others first. */
  readonly known = new Set<string>();
  private readonly idle = new Map<string, number>();
  private sweeper: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(private readonly session: ZooKeeperSession) {}

  /** A request is about to use them: not idle. */
  inUse(parents: readonly string[]): void {
    for (const parent of parents) this.idle.delete(parent);
  }

  /** A release may have emptied them. */
  maybeEmpty(parents: readonly string[]): void {
    for (const parent of parents) this.idle.set(parent, performance.now());
    if (this.sweeper || this.closed) return;
    this.sweeper = setInterval(() => this.sweep(), PARENT_IDLE_MS).unref();
  }

  /**
   * Stops the clean-up, and deletes now the parents this process left empty, however recently:
   * it will not use them again. Resolves once ZooKeeper answered (bounded by the command timeout).
   */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweeper);
    const parents = [...this.idle.keys()];
    this.idle.clear();
    // Not worth a new session, or a wait for one: without a live one the parents stay.
    if (this.session.state !== 'connected') return;
    await Promise.all(parents.map((parent) => this.remove(parent)));
  }

  private sweep(): void {
    const now = performance.now();
    for (const [parent, since] of this.idle) {
      if (now - since < PARENT_IDLE_MS) continue;
      this.idle.delete(parent);
      void this.remove(parent);
    }
    if (this.idle.size === 0) {
      clearInterval(this.sweeper);
      this.sweeper = undefined;
    }
  }

  /** Fails harmlessly (NOT_EMPTY) when someone stands in the line again, or when ZooKeeper is away. */
  private remove(parent: string): Promise<void> {
    this.known.delete(parent);
    return this.session.run('clean-up', [], ({ client }) => client.remove(parent)).catch(() => undefined);
  }
}
