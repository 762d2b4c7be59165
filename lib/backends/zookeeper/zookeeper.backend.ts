import { performance } from 'node:perf_hooks';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import { listZooKeeper } from './zookeeper.listing.js';
import { inspect } from 'node:util';
import type { AcquireResult, BackendHealth, ExtendResult, LockBackend, LockState, TryAcquireOptions } from '../lock-backend.interface.js';
import { nodeZooKeeperClients, type ZooKeeperClient } from './zookeeper.client.js';
import { LinePaths, position, removeNodes, type LineRequest } from './zookeeper.line.js';
import { stillThere, writeLook } from './zookeeper.writes.js';
import { parseEntry } from './zookeeper.kinds.js';
import { pendingData } from './zookeeper.pending.js';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { checkConnectionString, redactConnection, resolveOptions, type ZooKeeperLockBackendOptions } from './zookeeper.options.js';
import { ParentNodes } from './zookeeper.parents.js';
import { LinePlaces } from './zookeeper.places.js';
import { LineRequests } from './zookeeper.requests.js';
import { ZooKeeperSession, type LiveSession } from './zookeeper.session.js';
import { verifyRoot } from './zookeeper.verify.js';
import { identityBytes } from '../../lock-identity.js';
import { inspectZooKeeper } from './zookeeper.inspection.js';
import { releaseElsewhere } from './zookeeper.forced-release.js';

/**
 * Locks as ZooKeeper's lock recipe: a request creates an ephemeral sequential node per key,
 * `<root>/<key>/<owner>-<sequence>`, all in one multi(), and holds its keys when its nodes are
 * first in every line. Its nodes after the first line that keeps it out are pending, and keep
 * nobody out (zookeeper.pending.ts). A waiter watches only the node just before its own, so a
 * release wakes one waiter (no herd), and waiters are served in the order their requests reached
 * ZooKeeper.
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
  readonly sharedHolders = true;
  readonly storesIdentity = true;

  private readonly session: ZooKeeperSession;
  private readonly paths: LinePaths;
  private readonly requests: LineRequests;
  private readonly places: LinePlaces;
  private readonly parents: ParentNodes;
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
    const { servers, auth: inConnection } = checkConnectionString(connection);
    const resolved = resolveOptions(options);
    if (inConnection && resolved.auth) {
      throw new InvalidLockOptionsError(
        'auth',
        `ZooKeeperLockBackend: credentials were given twice, in the connection string '${redactConnection(connection)}' and ` +
          `in the auth option. Give them once.`,
      );
    }
    const auth = inConnection ?? resolved.auth;
    this.paths = new LinePaths(resolved.root);
    const digest = auth && `${auth.username}:${auth.password}`;
    const create = newClient ?? nodeZooKeeperClients(servers, resolved.sessionTimeout, digest);
    this.session = new ZooKeeperSession(create, resolved.commandTimeout, this.name);
    this.parents = new ParentNodes(this.session);
    this.requests = new LineRequests(this.session, this.paths);
    this.places = new LinePlaces(this.requests, this.paths, this.parents);
    // A lost session took this process's places in line and their watches: every waiter asks again.
    // Nodes left to delete go once ZooKeeper answers again (see LineRequests.removeLater).
    this.session.onAnswer = () => this.requests.sendLeftovers();
    this.stopListening = this.session.onState((state) => {
      if (state === 'connected') this.requests.sendLeftovers();
      if (state !== 'lost') return;
      this.parents.known.clear();
      for (const request of this.requests.all()) this.requests.wake(request);
    });
  }

  /** Curator's names: 'connected', 'suspended' (no connection, the session may live on), 'lost'. */
  get state(): string {
    return this.session.state;
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    const willWait = options?.willWait ?? true;
    if (this.closed) throw this.session.error('acquire', keys, 'the backend is closed (the application shut down).');
    const data = identityBytes(options?.holder, this.name);
    // A node after the first key carries PENDING before who asks (zookeeper.pending.ts).
    this.paths.checkSize(keys, owner, keys.length > 1 ? pendingData(data).length : data?.length);
    const sentAt = performance.now();
    const request = this.requests.open(keys, owner);
    // Opened by watch() before the first attempt, or by an earlier attempt: the kind (and who asks)
    // is this call's until nodes carry it.
    if (!request.nodes && !request.uncertain && !request.creating) {
      request.limits = options?.limits ?? [];
      request.data = data;
    }
    this.parents.inUse(keys.map((key) => this.paths.parent(key)));
    const current = request;
    current.woken = false;
    try {
      const outcome = await this.session.run('acquire', keys, (session) => this.attempt(session, current, willWait, ttlMs));
      if (outcome !== true) return outcome ? { acquired: false, limitMismatch: outcome } : { acquired: false };
      // From this attempt's write, or from an earlier one when it took the key on the event alone.
      const certifiedAt = await this.certify(current, sentAt, Math.min(sentAt, current.certifiedAt ?? sentAt), ttlMs);
      // Its nodes are given up (or gone): the key may be free, and nothing would wake the caller,
      // whose place in line this was, before its next poll. It tries again at once.
      if (certifiedAt === undefined) return { acquired: false, retryAfterMs: 0 };
      this.armExpiry(current, sentAt + ttlMs);
      // Counted from this request: the time to the last write, then what that write certifies.
      return { acquired: true, fencingToken: current.czxid, validityMs: Math.min(ttlMs, certifiedAt - sentAt + this.validity(ttlMs)) };
    } catch (error) {
      if (this.requests.isCurrent(current)) {
        // Whether the nodes were made is unknown; the next attempt looks for them. (A refusal is an
        // answer: what it refused was not made, and the caller makes no next attempt.)
        const refused = error instanceof LockBackendError && error.permanent;
        if (!refused) current.uncertain = current.nodes === undefined;
        current.woken = true;
        if (refused && !current.nodes && !current.uncertain) this.requests.forget(current);
        else if (!willWait) {
          // No next attempt, and no release, will come for them: they go now, or as soon as
          // ZooKeeper answers. A create applied whose answer was lost would otherwise stand first
          // in line for as long as the session lives, the key held by nobody.
          this.requests.forget(current);
          this.requests.removeLater(current);
        }
      }
      throw error;
    }
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const sentAt = performance.now();
    const request = this.requests.get(owner);
    if (!request?.held || !request.nodes || request.nodes !== request.heldWith) return { extended: false };
    const nodes = request.nodes;
    // A write, so the leader itself says the session is alive: a follower cut off from it could
    // still answer a read for a session the leader already ended. A node gone is 'taken'.
    const ok = await this.session.run('extend', keys, (session) =>
      session.generation === request.generation ? stillThere(session.client, nodes) : Promise.resolve(false),
    );
    if (ok) request.certifiedAt = sentAt;
    if (!ok || !this.requests.isCurrent(request)) {
      this.requests.forget(request);
      // A node gone (an operator deleted one, or the session went): the request's others go too,
      // without holding the holder's signal back for it.
      if (!ok) void this.discard(request, nodes);
      return { extended: false };
    }
    this.armExpiry(request, sentAt + ttlMs);
    return { extended: true, validityMs: this.validity(ttlMs) };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    const request = this.requests.get(owner);
    // Not an owner of this process: another instance's, released by an operator.
    if (!request) return this.session.run('release', keys, ({ client }) => releaseElsewhere(client, this.paths, keys, owner));
    this.requests.forget(request);
    this.parents.maybeEmpty(keys.map((key) => this.paths.parent(key)));
    const held = request.held;
    await this.requests.remove(request).catch((error: unknown) => {
      // Kept to send again whatever the answer, a refusal too: left there, the node would stand
      // first in its line for nobody for as long as the session lives. A refusal may be one of a
      // request the server read before the credentials (see ZooKeeperSession.run), and a refused
      // identity that an admin grants the rights later frees it then. It is sent again at each
      // answer and reconnection (the session's pings answer at least every third of its timeout).
      this.requests.removeLater(request, false);
      throw error;
    });
    return held;
  }

  /** The key's line: who is in, who waits, with who they are (see inspectZooKeeper). Read-only. */
  async inspect(key: string): Promise<LockState | undefined> {
    this.paths.checkSize([key], '');
    // Another process's lease is known to last at most one session timeout once its holder goes.
    const ttlOf = (owner: string) => (this.requests.get(owner)?.held ? this.requests.remaining(owner) : this.session.timeout);
    return this.session.run('inspect', [key], ({ client }) => inspectZooKeeper(client, this.paths, key, ttlOf));
  }

  /** The root's children in key order, then each one's line (see listZooKeeper). Read-only. */
  list(options: LockListOptions): Promise<LockListPage> {
    return this.session.run('list', [], ({ client }) => listZooKeeper(client, this.paths, options));
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.closed) throw this.session.error('watch', keys, 'the backend is closed (the application shut down).');
    if (owner === undefined) return () => undefined;
    // A caller may watch before its first attempt (it queued behind others of this process): the
    // attempt then finds its waker here.
    const request = this.requests.open(keys, owner);
    request.waker = onRelease;
    if (request.woken) {
      request.woken = false;
      onRelease();
    }
    return () => {
      if (request.waker === onRelease) request.waker = undefined;
      if (!request.nodes && !request.uncertain && !request.creating && this.requests.isCurrent(request)) this.requests.drop(owner);
    };
  }

  /** A failed attempt already watches the node it waits for, and a wake-up is kept until watched. */
  watching(): boolean {
    return !this.closed;
  }

  /**
   * When the lock is certain from, as a performance.now() time: `certifiedAt` (when the last write
   * of its nodes was sent), or the moment a later check of the nodes was sent. An answer that
   * comes after the lease it certifies ran out (an event loop stalled, an ensemble slow under
   * load) is useless to the caller, who takes it as lost, while the nodes stay first in line,
   * waking nobody, until the ttl ends them: so the session is certified again with a write (the
   * check) before the lock is reported. (Once the ttl itself ran out there is nothing to certify:
   * the expiry deletes the nodes at once.) Undefined, and the nodes given up, when the lock could
   * not be certified (gone, or every check late too).
   */
  private async certify(request: LineRequest, sentAt: number, certifiedAt: number, ttlMs: number): Promise<number | undefined> {
    for (let check = 0; ; check++) {
      const now = performance.now();
      if (now < certifiedAt + this.validity(ttlMs) || now >= sentAt + ttlMs) return certifiedAt;
      const nodes = request.nodes;
      if (check >= 3 || !nodes || !this.requests.isCurrent(request)) {
        await this.release(request.keys, request.owner).catch(() => undefined);
        return undefined;
      }
      certifiedAt = performance.now();
      const generation = request.generation;
      const still = await this.session.run('acquire', request.keys, (session) =>
        session.generation === generation ? stillThere(session.client, nodes) : Promise.resolve(false),
      );
      if (!still) {
        request.held = false;
        void this.discard(request, nodes);
        return undefined;
      }
      request.certifiedAt = certifiedAt;
    }
  }

  /**
   * The start-up check: that this identity may create and delete under the lock root (see
   * verifyRoot). Resolves when the ensemble does not answer within the command timeout.
   */
  verify(): Promise<void> {
    return verifyRoot(this.session, this.paths.root);
  }

  /**
   * For health checks: the session's state after a read the server connected to answers (a
   * session is made if there is none). Whether locks can be taken is the health check's probe
   * lock; this adds what the session says: its state and the timeout the server granted.
   */
  async health(): Promise<BackendHealth> {
    await this.session.run('health check', [], ({ client }) => client.exists('/'));
    const state = this.session.state;
    return {
      up: state === 'connected',
      details: { session: state, sessionTimeoutMs: this.session.timeout },
      ...(state === 'connected' ? {} : { message: `the ZooKeeper session is ${state}` }),
    };
  }

  /** Ends the session: ZooKeeper deletes its nodes (locks and places in line) at once. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopListening();
    this.requests.close();
    // Before the session ends: the parents this process emptied would otherwise stay, one per key.
    await this.parents.close();
    this.requests.clear();
    this.session.close();
  }

  toJSON(): { name: string; root: string } {
    return { name: this.name, root: this.paths.root };
  }

  [inspect.custom](depth: number, options: object): string {
    return `ZooKeeperLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  /**
   * Makes (or finds) the request's nodes, then looks where they stand: true when in every line; the
   * key and limit of the holders when they disagree with the request on its limit (its nodes go:
   * waiting cannot heal that); false otherwise.
   */
  private async attempt(
    session: LiveSession,
    request: LineRequest,
    willWait: boolean,
    ttlMs: number,
  ): Promise<boolean | { key: string; limit: number }> {
    for (let round = 0; ; round++) {
      // One create at a time per request, settled before anything looks for its nodes.
      if (!(await this.places.settle(session, request))) return false;
      const created = !request.nodes;
      // Its create's answer gives the czxid, and the lines come right behind it (see createNodes).
      const made = created ? await this.places.create(session, request) : {};
      if (made === false) return false;
      // The first node of its line, just ahead of it, went: first now, without a look.
      const ahead = request.firstAhead;
      request.firstAhead = undefined;
      const clear = !created && ahead?.gone === true && ahead.node === request.nodes![0] && request.czxid !== undefined;
      const [where, stat] = clear
        ? [{ first: true as const, marks: [], flips: [], passed: [] }, undefined]
        : await Promise.all([
            position(session.client, this.paths, request, made.lines),
            // Nodes found by name after a create's answer was lost: their czxid is read.
            request.czxid === undefined ? session.client.exists(request.nodes![0]) : undefined,
          ]);
      if (stat) request.czxid = stat.czxid;
      if ('gone' in where) {
        await this.discard(request, request.nodes!);
        if (round < 3) continue;
        return false;
      }
      if ('mismatch' in where) {
        this.requests.forget(request);
        await this.requests.remove(request).catch(() => this.requests.removeLater(request, false));
        return where.mismatch;
      }
      if (where.first) {
        // Told by the event alone, its node there all along and its session certified lately: in
        // now, the write that marks it goes out behind (see certifiedLately).
        if (clear && this.certifiedLately(request, ttlMs)) {
          request.held = true;
          request.heldWith = request.nodes;
          if (request.data) this.markLater(session, request);
          return true;
        }
        // Reads alone could come from a follower cut off from the leader, which may have ended our
        // session already; nodes made by this attempt were a write, else one is made now. Nodes to
        // mark as in are marked by that write (or one made for them), pending ones turn held and
        // pending nodes ahead go with it. Nodes that carry who asks are all written by it, so their
        // mtime tells inspect when they went in (see zookeeper.inspection.ts).
        const written = !created && request.data ? request.nodes! : where.marks;
        const writes = where.marks.length + where.flips.length + where.passed.length;
        if (!created || writes > 0) {
          const next = await this.writeLook(session, request, { ...where, marks: written }, round);
          if (next === 'look again') continue;
          if (next === 'later') return false;
        }
        request.held = true;
        request.heldWith = request.nodes;
        return true;
      }
      if (!willWait) {
        this.requests.drop(request.owner);
        await removeNodes(session.client, request.nodes!);
        return false;
      }
      // In on some keys while it waits for others: marked there now, once, so that a permit caller
      // right behind it that waits for its mark starts watching the holders (its turn may be due).
      // Its pending nodes up to the line that keeps it out turn waiting, and the pending nodes
      // ahead of it in the lines it is in on go, in the same write.
      const unmarked = where.marks.filter((path) => !request.marked?.has(path));
      if (unmarked.length + where.flips.length + where.passed.length > 0) {
        const next = await this.writeLook(session, request, { ...where, marks: unmarked }, round);
        if (next === 'look again') continue;
        if (next === 'later') return false;
        request.marked ??= new Set();
        for (const path of unmarked) request.marked.add(path);
      }
      if (where.firstAhead) request.firstAhead = { path: where.firstAhead, node: request.nodes![0], gone: false };
      request.adjacent = where.adjacent;
      // A node we wait for went while we looked: look again, a few times (the caller retries later).
      const [moved] = await Promise.all([
        this.watchNodes(session, request, where.waitFor),
        where.adjacent && this.watchOwn(session, request),
      ]);
      if (!moved || round >= 10) return false;
    }
  }

  /**
   * Watches the nodes the request waits for (zookeeper.kinds.ts says which); false once every
   * watch is set on a node that is still there and not marked yet where a mark counts. True means
   * one went (or went in) meanwhile: look again.
   */
  private async watchNodes(
    session: LiveSession,
    request: LineRequest,
    waitFor: { path: string; marks: boolean; version: number }[],
  ): Promise<boolean> {
    const stats = await Promise.all(
      waitFor.map(async ({ path, marks }) => {
        const known = request.watched.has(path);
        request.watched.set(path, marks);
        if (known) return session.client.exists(path);
        // Counted as watched only once ZooKeeper set the watch: a request that failed (a dropped
        // connection) set none, and the next attempt asks again instead of waiting for nothing.
        const stat = await session.client
          .exists(path, (event) => this.watched(request, path, event))
          .catch((error: unknown) => {
            request.watched.delete(path);
            throw error;
          });
        if (!stat) request.watched.delete(path);
        return stat;
      }),
    );
    // Marked since the look: its data was set after the version read then (a node that counts is
    // written only as it goes in; it may have been written before, as it turned from pending).
    return stats.some((stat, i) => stat === undefined || (waitFor[i].marks && stat.version > waitFor[i].version));
  }

  /**
   * Sets the watch on the request's own node (see LineRequest.ownWatch), unless one set on this
   * connection is still there. A watch that could not be set counts as one that fired.
   */
  private async watchOwn(session: LiveSession, request: LineRequest): Promise<void> {
    const node = request.nodes![0];
    const armed = request.ownWatch;
    const connection = this.session.connectedOn;
    if (connection === undefined || (armed?.node === node && armed.connection === connection && !armed.gone)) return;
    const watch = { node, connection, set: false, gone: false };
    request.ownWatch = watch;
    const stat = await session.client.exists(node, () => (watch.gone = true)).catch(() => undefined);
    if (stat) watch.set = true;
    else watch.gone = true;
  }

  /**
   * Whether a request that the deletion of the node just ahead made first (LineRequest.firstAhead)
   * may take the key without a write of its own. It may when:
   * - its own node was there when the one ahead went. Its watch on it stayed quiet on the
   *   connection it was set on, and one connection delivers events in the order ZooKeeper applied
   *   the changes: a deletion of its node before the one ahead (another process releasing it by
   *   force, or its session ending) would have come first. On a later connection the events of the
   *   watches the client sets again come in no order. One transaction that deletes both nodes, the
   *   one ahead first (an operator's deleteall), may bring the two events in two reads, and the
   *   request in: to it that is a forced release right after the hand-over, which its next
   *   extension tells it of, as it does any holder's (docs/zookeeper.md);
   * - and its session is certain for a while yet: a write of its nodes (the create, most often)
   *   was answered less than half the validity ago, so the lease counted from that write (see
   *   certify) leaves the caller at least the other half.
   * Else the write is sent first, as for any look.
   */
  private certifiedLately(request: LineRequest, ttlMs: number): boolean {
    const own = request.ownWatch;
    const certifiedAt = request.certifiedAt;
    return (
      own !== undefined &&
      own.set &&
      !own.gone &&
      own.node === request.nodes![0] &&
      own.connection === this.session.connectedOn &&
      certifiedAt !== undefined &&
      performance.now() - certifiedAt < this.validity(ttlMs) / 2
    );
  }

  /**
   * The write a request that took the key on the event alone still owes: its node marked as in,
   * so inspect tells when it went in and the request just behind it hears that it is first (see
   * LineRequest.firstAhead). Sent without waiting: the session answers it before the release that
   * may follow. A node found gone means the lock was taken from it since; its next extension
   * tells the holder.
   */
  private markLater(session: LiveSession, request: LineRequest): void {
    const nodes = request.nodes!;
    const sentAt = performance.now();
    writeLook(session.client, nodes, { marks: nodes, flips: [], passed: [] }, request.data).then(
      (wrote) => {
        if (wrote === 'done' && request.nodes === nodes) request.certifiedAt = sentAt;
      },
      () => undefined,
    );
  }

  /**
   * A watched node went, or was marked as in. A mark wakes the caller only when it waits for that
   * mark (its turn at watching the holders); otherwise the watch is set again, and only the
   * node's deletion wakes it, or a failure to watch it (the caller looks again).
   */
  private watched(request: LineRequest, path: string, event: 'deleted' | 'changed'): void {
    if (event === 'changed' && request.watched.get(path) === false && this.requests.isCurrent(request)) {
      // An exclusive node just ahead of an exclusive request of one key, and not pending when it
      // looked, is written only as it goes in: it is first in the line now (see LineRequest.firstAhead).
      const node = request.nodes?.[0];
      if (
        node &&
        request.adjacent === path &&
        request.keys.length === 1 &&
        (request.limits[0] ?? 1) === 1 &&
        parseEntry(path.slice(path.lastIndexOf('/') + 1))?.limit === 1
      )
        request.firstAhead = { path, node, gone: false };
      this.session
        .run('acquire', request.keys, ({ client }) => client.exists(path, (next) => this.watched(request, path, next)))
        .then(
          (stat) => stat === undefined && this.wake(request, path, true),
          () => this.wake(request, path),
        );
      return;
    }
    this.wake(request, path, event === 'deleted');
  }

  /** `deleted`: the node is known to be gone (not a watch that failed). */
  private wake(request: LineRequest, path: string, deleted = false): void {
    if (deleted && request.firstAhead?.path === path) request.firstAhead.gone = true;
    request.watched.delete(path);
    this.requests.wake(request);
  }

  /**
   * The write a look asks for (see writeLook): 'done'; 'look again' when a node of the request is
   * gone (it lost its place: its other nodes go, and it starts over) or a pending node it read
   * changed meanwhile (turned waiting, or went); 'later' after ten such rounds of this attempt.
   */
  private async writeLook(
    session: LiveSession,
    request: LineRequest,
    writes: Parameters<typeof writeLook>[2],
    round: number,
  ): Promise<'done' | 'look again' | 'later'> {
    const sentAt = performance.now();
    const nodes = request.nodes!;
    const wrote = await writeLook(session.client, nodes, writes, request.data);
    if (wrote === 'done' && request.nodes === nodes) request.certifiedAt = sentAt;
    if (wrote === 'gone') {
      await this.discard(request, request.nodes!);
      return 'look again';
    }
    if (wrote === 'changed') return round < 10 ? 'look again' : 'later';
    return 'done';
  }

  /**
   * Some of the request's nodes are gone (an operator deleted one, or its session ended): it
   * lost its place, and its nodes in the other lines go too. Left there, each would stand first
   * in its line for nobody for as long as the session lives (a multi-key holder told it lost one
   * key would keep the others), or stand in front of the request's own next place. Deleted now,
   * or as soon as ZooKeeper answers; resolves either way.
   */
  private async discard(request: LineRequest, nodes: readonly string[]): Promise<void> {
    if (request.nodes === nodes) {
      request.nodes = undefined;
      request.czxid = undefined;
    }
    const leftover: LineRequest = { ...request, nodes: [...nodes], uncertain: false };
    await this.requests.remove(leftover).catch(() => this.requests.removeLater(leftover, false));
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

  /** When the ttl runs out without an extension, this process deletes the nodes. */
  private armExpiry(request: LineRequest, at: number): void {
    this.requests.armExpiry(request, at, () => void this.release(request.keys, request.owner).catch(() => undefined));
  }
}
