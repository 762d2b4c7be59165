import { performance } from 'node:perf_hooks';
import { FailedReleases } from '../failed-releases.js';
import { findNodes, removeNodes, type LinePaths, type LineRequest } from './zookeeper.line.js';
import type { ZooKeeperSession } from './zookeeper.session.js';

/** Owners with nodes left to delete, at most: as many as FailedReleases keeps. */
const MAX_LEFTOVERS = 10_000;

/**
 * This process's requests, one per owner: the place each stands in, when a held one's ttl runs
 * out, and the nodes of requests given up that are still to be deleted.
 */
export class LineRequests {
  private readonly requests = new Map<string, LineRequest>();
  /** When a held lock's ttl runs out without an extension: this process deletes its nodes then. */
  private readonly expiries = new Map<string, NodeJS.Timeout & { at?: number }>();
  /** Nodes left to delete, by owner (FailedReleases sends by owner; this says which nodes). */
  private readonly leftovers = new Map<string, LineRequest>();
  private readonly failedReleases = new FailedReleases((_keys, owner) => this.removeLeftover(owner));
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
  open(keys: readonly string[], owner: string, limits: readonly number[] = []): LineRequest {
    let request = this.requests.get(owner);
    if (!request) {
      const place = { nodes: undefined, generation: 0, uncertain: false, createdIn: 0, creating: undefined, czxid: undefined, held: false };
      request = { owner, keys, limits, watched: new Map(), woken: false, waker: undefined, ...place };
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
    const arm = (): void => {
      const timer: NodeJS.Timeout & { at?: number } = setTimeout(
        () => {
          if (this.expiries.get(request.owner) !== timer) return;
          // Node fires a timer up to about 2 ms before its time as performance.now() counts it: the
          // nodes must not go before the end of the lease the holder counts, so the rest is waited out.
          if (performance.now() < at) arm();
          else if (this.isCurrent(request)) expire();
        },
        Math.max(0, Math.ceil(at - performance.now())),
      );
      timer.unref();
      timer.at = at;
      this.expiries.set(request.owner, timer);
    };
    arm();
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
   * A release that failed (no answer during a leader election, a dropped connection), or nodes
   * that a request gave up and no release will come for, would stay for as long as the session
   * lives: they are deleted as soon as ZooKeeper answers again (FailedReleases, the mechanism
   * every backend uses; the backend calls sendLeftovers() at each answer and reconnection). One is
   * tried at once too, unless it is a removal that just failed again.
   */
  removeLater(request: LineRequest, now = true): void {
    if (this.closed) return;
    const known = this.leftovers.get(request.owner);
    this.leftovers.set(request.owner, known ? merge(known, request) : request);
    // FailedReleases keeps as many owners at most, dropping the oldest first: so does this.
    if (this.leftovers.size > MAX_LEFTOVERS) this.leftovers.delete(this.leftovers.keys().next().value!);
    this.failedReleases.add(request.keys, request.owner);
    if (now) this.failedReleases.sendAgain();
  }

  /** The owner's nodes waiting to be deleted (see removeLater): never its place. */
  leftoverNodes(owner: string): ReadonlySet<string> {
    return new Set(this.leftovers.get(owner)?.nodes);
  }

  /** ZooKeeper answered: the nodes left to delete are sent again. */
  sendLeftovers(): void {
    this.failedReleases.sendAgain();
  }

  /** At shutdown: the session's end deletes every node, so nothing is left to time or retry. */
  close(): void {
    this.closed = true;
    for (const timer of this.expiries.values()) clearTimeout(timer);
    this.expiries.clear();
    this.failedReleases.close();
    this.leftovers.clear();
  }

  /** FailedReleases' release: the owner's leftover nodes, deleted; added again when that fails, however (see release()). */
  private async removeLeftover(owner: string): Promise<void> {
    const leftover = this.leftovers.get(owner);
    if (!leftover) return;
    this.leftovers.delete(owner);
    await this.remove(leftover).catch(() => {
      this.removeLater(leftover, false);
    });
  }

  /** Once the session ends: every request went with it. */
  clear(): void {
    this.requests.clear();
  }
}

/**
 * Two leftovers of one owner as one: every node of both, and looked for by name in every line of
 * both when either's create answer was lost (the nodes of the owner's current request are kept).
 */
function merge(a: LineRequest, b: LineRequest): LineRequest {
  const keys = [...new Set([...a.keys, ...b.keys])];
  const nodes = [...new Set([...(a.nodes ?? []), ...(b.nodes ?? [])])];
  return { ...a, keys, nodes: nodes.length > 0 ? nodes : undefined, uncertain: a.uncertain || b.uncertain };
}
