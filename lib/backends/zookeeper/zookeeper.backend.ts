import { performance } from 'node:perf_hooks';
import { inspect } from 'node:util';
import type { AcquireResult, ExtendResult, LockBackend, LockState, TryAcquireOptions } from '../lock-backend.interface.js';
import { nodeZooKeeperClients, ZooKeeperError, type ZooKeeperClient } from './zookeeper.client.js';
import { createNodes, findNodes, inLineOrder, isNoNode, LinePaths, position, removeNodes, type LineRequest } from './zookeeper.line.js';
import { checkConnectionString, resolveOptions, type ZooKeeperLockBackendOptions } from './zookeeper.options.js';
import { ParentNodes } from './zookeeper.parents.js';
import { ZooKeeperSession, type LiveSession } from './zookeeper.session.js';

/**
 * Locks as ZooKeeper's lock recipe: a request creates an ephemeral sequential node per key,
 * `<root>/<key>/<owner>-<sequence>`, all in one multi(), and holds its keys when its nodes are
 * first in every line. A waiter watches only the node just before its own, so a release wakes one
 * waiter (no herd), and waiters are served in the order their requests reached ZooKeeper.
 *
 * The fencing token is the nodes' czxid: the zxid of the transaction that created them, global
 * and increasing across every key, leader change and parent node. (The sequence suffix restarts
 * when a parent node is deleted and made again, so it is not one.)
 *
 * Liveness is the session (see docs/zookeeper.md): a holder that dies keeps its locks until its
 * session expires; a lease is certain for at most two thirds of the session timeout after each
 * answered request, so a holder that cannot reach ZooKeeper, or whose event loop stalls, gives
 * its lock up (its signal fires) before the server can give it to someone else. The ttl still
 * bounds a lease nobody extends: this process deletes the nodes when it runs out.
 */
export class ZooKeeperLockBackend implements LockBackend {
  readonly name = 'zookeeper';
  readonly fencing = true;

  private readonly session: ZooKeeperSession;
  private readonly paths: LinePaths;
  private readonly requests = new Map<string, LineRequest>();
  /** When a held lock's ttl runs out without an extension: this process deletes its nodes then. */
  private readonly expiries = new Map<string, NodeJS.Timeout>();
  private readonly parents: ParentNodes;
  private readonly leftovers = new Set<LineRequest>();
  private leftoverTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly stopListening: () => void;

  /**
   * `new ZooKeeperLockBackend('zk1:2181,zk2:2181,zk3:2181')`: the backend opens its own session
   * (node-zookeeper-client must be installed) and closes it on application shutdown.
   */
  constructor(
    connection: string,
    options?: ZooKeeperLockBackendOptions,
    /** @internal For tests: another client behind the same adapter. */
    newClient?: () => ZooKeeperClient,
  ) {
    const connectionString = checkConnectionString(connection);
    const resolved = resolveOptions(options);
    this.paths = new LinePaths(resolved.root);
    const create = newClient ?? nodeZooKeeperClients(connectionString, resolved.sessionTimeout);
    this.session = new ZooKeeperSession(create, resolved.commandTimeout, this.name);
    this.parents = new ParentNodes(this.session);
    // A lost session took this process's places in line and their watches: every waiter asks again.
    this.stopListening = this.session.onState((state) => {
      if (state !== 'lost') return;
      this.parents.known.clear();
      for (const request of this.requests.values()) this.wake(request);
    });
  }

  /** Curator's names: 'connected', 'suspended' (no connection, the session may live on), 'lost'. */
  get state(): string {
    return this.session.state;
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    const willWait = options?.willWait ?? true;
    if (this.closed) throw this.session.error('acquire', keys, 'the backend is closed (the application shut down).');
    this.paths.checkSize(keys, owner);
    const sentAt = performance.now();
    const request = this.request(keys, owner);
    this.parents.inUse(keys.map((key) => this.paths.parent(key)));
    const current = request;
    current.woken = false;
    try {
      const acquired = await this.session.run('acquire', keys, (session) => this.attempt(session, current, willWait));
      if (!acquired) return { acquired: false };
      const certifiedAt = await this.certify(current, sentAt, ttlMs);
      // Its nodes are given up (or gone): the key may be free, and nothing would wake the caller,
      // whose place in line this was, before its next poll. It tries again at once.
      if (certifiedAt === undefined) return { acquired: false, retryAfterMs: 0 };
      this.armExpiry(current, sentAt + ttlMs);
      // Counted from this request: the time to the last write, then what that write certifies.
      return { acquired: true, fencingToken: current.czxid, validityMs: Math.min(ttlMs, certifiedAt - sentAt + this.validity(ttlMs)) };
    } catch (error) {
      if (this.requests.get(owner) === current) {
        // Whether the nodes were made is unknown; the next attempt looks for them.
        current.uncertain = current.nodes === undefined;
        current.woken = true;
        if (!willWait) {
          // No next attempt, and no release, will come for them: they go now, or as soon as
          // ZooKeeper answers. A create applied whose answer was lost would otherwise stand first
          // in line for as long as the session lives, the key held by nobody.
          this.forget(current);
          this.removeLater(current);
        }
      }
      throw error;
    }
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const sentAt = performance.now();
    const request = this.requests.get(owner);
    if (!request?.held || !request.nodes) return { extended: false };
    const nodes = request.nodes;
    // A write, so the leader itself says the session is alive: a follower cut off from it could
    // still answer a read for a session the leader already ended. A node gone is 'taken'.
    const ok = await this.session.run('extend', keys, (session) =>
      session.generation === request.generation ? this.stillThere(session, nodes) : Promise.resolve(false),
    );
    if (!ok || this.requests.get(owner) !== request) {
      this.forget(request);
      return { extended: false };
    }
    this.armExpiry(request, sentAt + ttlMs);
    return { extended: true, validityMs: this.validity(ttlMs) };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    const request = this.requests.get(owner);
    if (!request) return false;
    this.forget(request);
    this.parents.maybeEmpty(keys.map((key) => this.paths.parent(key)));
    const held = request.held;
    await this.remove(request).catch((error: unknown) => {
      this.removeLater(request);
      throw error;
    });
    return held;
  }

  async inspect(key: string): Promise<LockState | undefined> {
    this.paths.checkSize([key], '');
    return this.session.run('inspect', [key], async ({ client }) => {
      const parent = this.paths.parent(key);
      const children = await client.getChildren(parent).catch((error: unknown) => (isNoNode(error) ? [] : Promise.reject(error)));
      for (const name of inLineOrder(children)) {
        const stat = await client.exists(`${parent}/${name}`);
        if (!stat) continue;
        const owner = LinePaths.owner(name)!;
        const ours = this.requests.get(owner);
        // Another process's lease is known to last at most one session timeout once its holder goes.
        const ttlMs = ours?.held ? this.remaining(owner) : this.session.timeout;
        return { key, owner, ttlMs, fencingToken: stat.czxid };
      }
      return undefined;
    });
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.closed) throw this.session.error('watch', keys, 'the backend is closed (the application shut down).');
    if (owner === undefined) return () => undefined;
    // A caller may watch before its first attempt (it queued behind others of this process): the
    // attempt then finds its waker here.
    const request = this.request(keys, owner);
    request.waker = onRelease;
    if (request.woken) {
      request.woken = false;
      onRelease();
    }
    return () => {
      if (request.waker === onRelease) request.waker = undefined;
      if (!request.nodes && !request.uncertain && !request.creating && this.requests.get(owner) === request) this.requests.delete(owner);
    };
  }

  /** A failed attempt already watches the node it waits for, and a wake-up is kept until watched. */
  watching(): boolean {
    return !this.closed;
  }

  /**
   * When the lock is certain from, as a performance.now() time: `sentAt`, or the moment a later
   * check of the nodes was sent. An answer that comes after the lease it certifies ran out (an
   * event loop stalled, an ensemble slow under load) is useless to the caller, who takes it as
   * lost, while the nodes stay first in line, waking nobody, until the ttl ends them: so the
   * session is certified again with a write (the check) before the lock is reported. (Once the
   * ttl itself ran out there is nothing to certify: the expiry deletes the nodes at once.)
   * Undefined, and the nodes given up, when the lock could not be certified (gone, or every check
   * late too).
   */
  private async certify(request: LineRequest, sentAt: number, ttlMs: number): Promise<number | undefined> {
    let certifiedAt = sentAt;
    for (let check = 0; ; check++) {
      const now = performance.now();
      if (now < certifiedAt + this.validity(ttlMs) || now >= sentAt + ttlMs) return certifiedAt;
      const nodes = request.nodes;
      if (check >= 3 || !nodes || this.requests.get(request.owner) !== request) {
        await this.release(request.keys, request.owner).catch(() => undefined);
        return undefined;
      }
      certifiedAt = performance.now();
      const generation = request.generation;
      const still = await this.session.run('acquire', request.keys, (session) =>
        session.generation === generation ? this.stillThere(session, nodes) : Promise.resolve(false),
      );
      if (!still) {
        request.held = false;
        request.nodes = undefined;
        request.czxid = undefined;
        return undefined;
      }
    }
  }

  /** Ends the session: ZooKeeper deletes its nodes (locks and places in line) at once. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopListening();
    for (const timer of this.expiries.values()) clearTimeout(timer);
    this.expiries.clear();
    // Before the session ends: the parents this process emptied would otherwise stay, one per key.
    await this.parents.close();
    clearTimeout(this.leftoverTimer);
    this.leftovers.clear();
    this.requests.clear();
    this.session.close();
  }

  toJSON(): { name: string; root: string } {
    return { name: this.name, root: this.paths.root };
  }

  [inspect.custom](depth: number, options: object): string {
    return `ZooKeeperLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  private remove(request: LineRequest): Promise<void> {
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
  private removeLater(request: LineRequest): void {
    this.leftovers.add(request);
    if (this.leftoverTimer || this.closed) return;
    this.leftoverTimer = setTimeout(() => {
      this.leftoverTimer = undefined;
      for (const leftover of [...this.leftovers]) {
        this.leftovers.delete(leftover);
        this.remove(leftover).catch(() => this.removeLater(leftover));
      }
    }, 100).unref();
  }

  private request(keys: readonly string[], owner: string): LineRequest {
    let request = this.requests.get(owner);
    if (!request) {
      const fields = {
        nodes: undefined,
        generation: 0,
        uncertain: false,
        createdIn: 0,
        creating: undefined,
        czxid: undefined,
        held: false,
      };
      request = { owner, keys, watched: new Set(), woken: false, waker: undefined, ...fields };
      this.requests.set(owner, request);
    }
    return request;
  }

  /** Makes (or finds) the request's nodes, then looks where they stand; true when first everywhere. */
  private async attempt(session: LiveSession, request: LineRequest, willWait: boolean): Promise<boolean> {
    for (let round = 0; ; round++) {
      // One create at a time per request, settled before anything looks for its nodes. Attempts
      // that timed out go on: woken together when a create fails, each would otherwise make nodes
      // of its own, and those whose answers were lost too would stand in line for nobody (the
      // request itself waiting behind one of them). So this is looked at again, up to the create,
      // after every wait.
      for (;;) {
        const inFlight = request.creating;
        if (inFlight?.generation === session.generation) {
          await inFlight.settled;
          continue;
        }
        // Given up (released, or a caller that would not wait): what is left of this attempt, which
        // its caller stopped waiting for, must not make nodes again.
        if (this.requests.get(request.owner) !== request) return false;
        if (request.nodes && request.generation !== session.generation) request.nodes = undefined;
        if (request.nodes || !request.uncertain) break;
        const found = await findNodes(session.client, this.paths, request);
        // Another attempt sent a create, or found them, meanwhile.
        if (request.creating?.generation === session.generation || !request.uncertain) continue;
        request.uncertain = false;
        // Made in an earlier session (see LineRequest.createdIn), they go: they would stand in line
        // for nobody until the server ends that session.
        const ours = request.createdIn === session.generation && found.every((nodes) => nodes.length > 0);
        // The earliest of each line is its place (one create made one node in every line); any
        // later ones stand behind it for nobody.
        const earliest = found.map((nodes) => nodes[0]);
        if (ours) this.adopt(request, session, earliest);
        const others = ours ? found.flatMap((nodes) => nodes.slice(1)) : found.flat();
        if (others.length > 0) await removeNodes(session.client, others);
      }
      const created = !request.nodes;
      if (created) {
        request.createdIn = session.generation;
        const creating = createNodes(session, this.paths, request, this.parents.known);
        // Runs before the await below resumes: an answer that comes after the caller gave up on
        // it still tells where the nodes are.
        const inFlight = {
          generation: session.generation,
          settled: creating
            .then(
              (nodes) => this.created(request, session, nodes),
              (error: unknown) => this.createFailed(request, error),
            )
            .finally(() => {
              if (request.creating === inFlight) request.creating = undefined;
            }),
        };
        request.creating = inFlight;
        await creating;
        // The caller gave up meanwhile (its wait ended): the nodes went again.
        if (!request.nodes) return false;
      }
      const [where, stat] = await Promise.all([
        position(session.client, this.paths, request),
        request.czxid === undefined ? session.client.exists(request.nodes![0]) : undefined,
      ]);
      if (stat) request.czxid = stat.czxid;
      if ('gone' in where) {
        request.nodes = undefined;
        request.czxid = undefined;
        if (round < 3) continue;
        return false;
      }
      if (where.first) {
        // Reads alone could come from a follower cut off from the leader, which may have ended our
        // session already; nodes made by this attempt were a write, else one is made now.
        if (!created && !(await this.stillThere(session, request.nodes!))) {
          request.nodes = undefined;
          request.czxid = undefined;
          continue;
        }
        request.held = true;
        return true;
      }
      if (!willWait) {
        this.requests.delete(request.owner);
        await removeNodes(session.client, request.nodes!);
        return false;
      }
      // A predecessor went while we looked: look again, a few times (the caller retries later).
      if (!(await this.watchPredecessors(session, request, where.predecessors)) || round >= 10) return false;
    }
  }

  /**
   * Watches the node just before ours in each line where we are not first; false once every
   * watch is set on a node that is still there. True means one went meanwhile: look again.
   */
  private async watchPredecessors(session: LiveSession, request: LineRequest, predecessors: string[]): Promise<boolean> {
    const stats = await Promise.all(
      predecessors.map(async (path) => {
        if (request.watched.has(path)) return session.client.exists(path);
        request.watched.add(path);
        // Counted as watched only once ZooKeeper set the watch: a request that failed (a dropped
        // connection) set none, and the next attempt asks again instead of waiting for nothing.
        const stat = await session.client
          .exists(path, () => {
            request.watched.delete(path);
            this.wake(request);
          })
          .catch((error: unknown) => {
            request.watched.delete(path);
            throw error;
          });
        if (!stat) request.watched.delete(path);
        return stat;
      }),
    );
    return stats.some((stat) => stat === undefined);
  }

  /** A write that fails unless every node is still there: the leader itself answers for the session. */
  private async stillThere(session: LiveSession, nodes: readonly string[]): Promise<boolean> {
    try {
      await session.client.multi(nodes.map((path) => ({ op: 'check', path }) as const));
      return true;
    } catch (error) {
      if (isNoNode(error)) return false;
      throw error;
    }
  }

  /** A create answered: its nodes are the request's place, or go when the request has one, or was given up. */
  private created(request: LineRequest, session: LiveSession, nodes: string[]): void {
    if (this.requests.get(request.owner) === request && !request.nodes) {
      this.adopt(request, session, nodes);
      request.uncertain = false;
    } else if (request.nodes?.join('\n') !== nodes.join('\n')) {
      // Not the ones already found by name after a lost answer: they would stand in line for
      // nobody, for as long as the session lives.
      const leftover = { ...request, nodes, uncertain: false };
      removeNodes(session.client, nodes).catch(() => this.removeLater(leftover));
    }
  }

  /**
   * A create that failed without an answer (a dropped connection) may have been applied: the
   * request's next attempt looks for its nodes by name; a request given up meanwhile has no next
   * attempt, so they are looked for and deleted as soon as ZooKeeper answers.
   */
  private createFailed(request: LineRequest, error: unknown): void {
    if (request.nodes || !outcomeUnknown(error)) return;
    request.uncertain = true;
    if (this.requests.get(request.owner) !== request) this.removeLater(request);
  }

  private adopt(request: LineRequest, session: LiveSession, nodes: string[]): void {
    request.nodes = nodes;
    request.generation = session.generation;
    request.czxid = undefined;
    request.watched.clear();
  }

  private wake(request: LineRequest): void {
    if (this.requests.get(request.owner) !== request) return;
    if (request.waker) request.waker();
    else request.woken = true;
  }

  /**
   * Certain for the ttl, and for at most two thirds of the session timeout: the server ends a
   * session one session timeout after it last heard of it, and a third is left for a follower's
   * report of our requests to reach the leader (it sends one every half tick; a session lasts at
   * least two ticks).
   */
  private validity(ttlMs: number): number {
    const session = this.session.timeout;
    return session > 0 ? Math.min(ttlMs, Math.floor((session * 2) / 3)) : ttlMs;
  }

  private armExpiry(request: LineRequest, at: number): void {
    clearTimeout(this.expiries.get(request.owner));
    const timer = setTimeout(
      () => {
        if (this.requests.get(request.owner) !== request) return;
        this.release(request.keys, request.owner).catch(() => undefined);
      },
      Math.max(0, at - performance.now()),
    );
    timer.unref();
    (timer as unknown as { at: number }).at = at;
    this.expiries.set(request.owner, timer);
  }

  private remaining(owner: string): number {
    const timer = this.expiries.get(owner) as unknown as { at: number } | undefined;
    return timer ? Math.max(0, Math.round(timer.at - performance.now())) : 0;
  }

  private forget(request: LineRequest): void {
    if (this.requests.get(request.owner) === request) this.requests.delete(request.owner);
    clearTimeout(this.expiries.get(request.owner));
    this.expiries.delete(request.owner);
    request.waker = undefined;
  }
}

/** Whether a failed request may still have been applied: it was sent, and no answer came. */
function outcomeUnknown(error: unknown): boolean {
  return !(error instanceof ZooKeeperError) || error.code === 'CONNECTION_LOSS' || error.code === 'OPERATION_TIMEOUT';
}
