import { performance } from 'node:perf_hooks';
import { LockBackendError } from '../../lock.errors.js';
import { findNodes, removeNodes, type LinePaths, type LineRequest } from './zookeeper.line.js';
import type { ZooKeeperSession } from './zookeeper.session.js';

/**
 * This process's requests, one per owner: the place each stands in, when a held one's ttl runs
 * out, and the nodes of requests given up that are still to be deleted.
 */
export class LineRequests {
  private readonly requests = new Map<string, LineRequest>();
  /** When a held lock's ttl runs out without an extension: this process deletes its nodes then. */
  private readonly expiries = new Map<string, NodeJS.Timeout & { at?: number }>();
  private readonly leftovers = new Set<LineRequest>();
  private leftoverTimer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly session: ZooKeeperSession,
    private readonly paths: LinePaths,
  ) {}

  get(owner: string): LineRequest | undefined {
    return this.requests.get(owner);
  }

  /** Whether `request` is still its owner's: not released, nor given up for a later one. */
  isCurrent(request: LineRequest): boolean {
    return this.requests.get(request.owner) === request;
  }

  all(): IterableIterator<LineRequest> {
    return this.requests.values();
  }

  /** The owner's request, or a new one with no place yet. */
  open(keys: readonly string[], owner: string): LineRequest {
    let request = this.requests.get(owner);
    if (!request) {
      const place = { nodes: undefined, generation: 0, uncertain: false, createdIn: 0, creating: undefined, czxid: undefined, held: false };
      request = { owner, keys, watched: new Set(), woken: false, waker: undefined, ...place };
      this.requests.set(owner, request);
    }
    return request;
  }

  /** Drops the owner's entry only: what its caller's attempt still does with the nodes is its own. */
  drop(owner: string): void {
    this.requests.delete(owner);
  }

  /** Gives the request up: no entry, no expiry, nobody to wake. */
  forget(request: LineRequest): void {
    if (this.isCurrent(request)) this.requests.delete(request.owner);
    clearTimeout(this.expiries.get(request.owner));
    this.expiries.delete(request.owner);
    request.waker = undefined;
  }

  /** Tells the request's caller to look at its line again, now or at its next watch(). */
  wake(request: LineRequest): void {
    if (!this.isCurrent(request)) return;
    if (request.waker) request.waker();
    else request.woken = true;
  }

  /** Calls `expire` at `at` (a performance.now() time) unless the request is extended or given up first. */
  armExpiry(request: LineRequest, at: number, expire: () => void): void {
    clearTimeout(this.expiries.get(request.owner));
    const timer: NodeJS.Timeout & { at?: number } = setTimeout(
      () => {
        if (this.isCurrent(request)) expire();
      },
      Math.max(0, at - performance.now()),
    );
    timer.unref();
    timer.at = at;
    this.expiries.set(request.owner, timer);
  }

  /** How long the owner's held lock has left before its expiry, ms (0 if none is armed). */
  remaining(owner: string): number {
    const at = this.expiries.get(owner)?.at;
    return at === undefined ? 0 : Math.max(0, Math.round(at - performance.now()));
  }

  /** Deletes the request's nodes: found by name when a create's answer was lost. */
  remove(request: LineRequest): Promise<void> {
    return this.session.run('release', request.keys, async (session) => {
      const found = request.uncertain ? (await findNodes(session.client, this.paths, request)).flat() : request.nodes;
      // Nodes found by the owner's name may be those of a later request of the same owner (its
      // acquisition goes on after this request was given up): those stay.
      const current = this.requests.get(request.owner);
      const theirs = current === request ? undefined : current?.nodes;
      const nodes = found?.filter((node) => !theirs?.includes(node));
      if (nodes?.length) await removeNodes(session.client, nodes);
    });
  }

  /**
   * A release that failed (no answer during a leader election, a dropped connection) leaves nodes
   * that the session, still alive, would keep forever: they are deleted as soon as ZooKeeper answers.
   */
  removeLater(request: LineRequest): void {
    this.leftovers.add(request);
    if (this.leftoverTimer || this.closed) return;
    this.leftoverTimer = setTimeout(() => {
      this.leftoverTimer = undefined;
      for (const leftover of [...this.leftovers]) {
        this.leftovers.delete(leftover);
        // Unless refused for good (the identity may not delete here): that would be sent forever.
        this.remove(leftover).catch((error: unknown) => {
          if (!(error instanceof LockBackendError && error.permanent)) this.removeLater(leftover);
        });
      }
    }, 100).unref();
  }

  /** At shutdown: the session's end deletes every node, so nothing is left to time or retry. */
  close(): void {
    this.closed = true;
    for (const timer of this.expiries.values()) clearTimeout(timer);
    this.expiries.clear();
    clearTimeout(this.leftoverTimer);
    this.leftovers.clear();
  }

  /** Once the session ends: every request went with it. */
  clear(): void {
    this.requests.clear();
  }
}
