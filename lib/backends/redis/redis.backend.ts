import { performance } from 'node:perf_hooks';
import { inspect } from 'node:util';
import type { Cluster, Redis } from 'ioredis';
import { FailedReleases } from '../failed-releases.js';
import {
  SHARED,
  type AcquireResult,
  type BackendHealth,
  type ExtendResult,
  type LockBackend,
  type LockListOptions,
  type LockListPage,
  type LockState,
  type TryAcquireOptions,
} from '../lock-backend.interface.js';
import { RedisConnection } from './redis.connection.js';
import { lineScriptKeys, lockKeyLayouts, type LockKeyLayout } from './redis.keys.js';
import { RedisWaiterLine } from './redis.line.js';
import { checkConnection, resolveBackendOptions, type RedisLockBackendOptions, type RedisLockConnection } from './redis.options.js';
import { ACQUIRE, EXTEND, EXTEND_HOLDERS, INSPECT, RELEASE } from './redis.scripts.js';
import { RedisScriptRunner } from './redis.script-runner.js';
import { verifyRedis } from './redis.verify.js';
import { inspectReply, type InspectReply } from './redis.inspection.js';
import { listRedisKeys } from './redis.listing.js';
import { encodeIdentity } from '../../lock-identity.js';
import { LockBackendError } from '../../lock.errors.js';

/**
 * Leases in one Redis (standalone, Sentinel or Cluster) through ioredis. Every operation is one
 * round trip: one Lua script (see redis.scripts.ts). Fencing tokens are strictly increasing per
 * key. Waiters stand in a fair line in Redis; a release hands the lock to the first of them and
 * tells its process by pub/sub, over one shared subscriber connection per backend.
 *
 * Shared locks and semaphores use the same line, counter and hand-over: a key with several holders
 * keeps a lease per holder, by the Redis server's clock (see HOLDERS in redis.script-prelude.ts).
 *
 * Exclusive while Redis keeps its data: a failover to a replica that had not yet received a lock
 * (replication is asynchronous) can grant it twice. Use fencing tokens where that matters.
 */
export class RedisLockBackend implements LockBackend {
  readonly name = 'redis';
  readonly fencing = true;
  readonly sharedHolders = true;
  readonly storesIdentity = true;
  readonly waiterTimeout: number;
  /** How many times in a row a released lock may go to a waiter of this process before earlier ones of others. */
  readonly localHandoffs: number;

  private readonly commandTimeout: number;
  private readonly connection: RedisConnection;
  private readonly scripts: RedisScriptRunner;
  private readonly line: RedisWaiterLine;
  // Counted from the start: a release waits for the client before its call goes out.
  private readonly failedReleases = new FailedReleases((keys, owner) => this.connection.track(this.release(keys, owner)));
  /** The client whose 'ready' sends failed releases again. */
  private readyClient: Redis | Cluster | undefined;
  /** ACQUIRE's last argument for an owner that will wait, and for one that will not (see ACQUIRE). */
  private readonly waitingArgs: string;
  private readonly tryingArgs: string;
  /**
   * Owners that hold a key beside others (shared, or a permit): their extensions and releases need
   * the holder sets. Only a shortcut: a script that meets such a key without them says so, and the
   * call is sent again with them.
   */
  private readonly besideOthers = new Set<string>();

  /**
   * `new RedisLockBackend(redis)` uses your ioredis client (Redis, Sentinel or Cluster) and leaves
   * it open; `new RedisLockBackend('redis://host:6379')` or `new RedisLockBackend({ host, port })`
   * creates one (ioredis must be installed) and closes it on application shutdown.
   */
  constructor(connection: RedisLockConnection, options?: RedisLockBackendOptions) {
    const checked = checkConnection(connection);
    const { waiterTimeout, commandTimeout, localHandoffs } = resolveBackendOptions(options);
    this.waiterTimeout = waiterTimeout;
    this.localHandoffs = localHandoffs;
    this.commandTimeout = commandTimeout;
    this.connection = new RedisConnection(checked, this.name);
    this.scripts = new RedisScriptRunner(this.connection, this.name, commandTimeout);
    this.line = new RedisWaiterLine(this.connection, commandTimeout, localHandoffs);
    const publish = this.connection.cluster ? 'SPUBLISH' : 'PUBLISH';
    this.waitingArgs = `${waiterTimeout} 1 ${this.line.id} ${publish}`;
    this.tryingArgs = `${waiterTimeout} 0 ${this.line.id} ${publish}`;
  }

  /**
   * What logs show of the backend (`util.inspect`, `JSON.stringify`): not its connection, whose
   * URL or options hold the password, nor its waiters' owner tokens.
   */
  toJSON(): { name: string; waiterTimeout: number; localHandoffs: number } {
    return { name: this.name, waiterTimeout: this.waiterTimeout, localHandoffs: this.localHandoffs };
  }

  [inspect.custom](depth: number, options: object): string {
    return `RedisLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    const willWait = options?.willWait ?? true;
    // A release of this process that may hand this owner the lock is out: its answer says.
    const inFlight = this.line.handoffInFlight(owner);
    if (inFlight) await inFlight;
    this.failedReleases.forget(owner);
    const handedOver = this.line.takeHandover(owner);
    if (handedOver) return { acquired: true, ...handedOver };
    const client = this.connection.open() ?? (await this.connection.connected('acquire', keys));
    // Keys a Cluster cannot lock together are refused here, before the owner gets a line entry
    // that nothing would remove (the caller gives up on such a mistake at once).
    const limits = limitArgument(options?.limits);
    const redisKeys = lineScriptKeys(this.layouts(keys, client), limits !== undefined);
    const entry = this.line.attemptStarting(owner, keys, willWait);
    const sentAt = performance.now();
    const args = [owner, Math.ceil(ttlMs), willWait ? this.waitingArgs : this.tryingArgs, encodeIdentity(options?.holder)];
    if (limits !== undefined) {
      args.push(limits);
      this.holdsBesideOthers(owner);
    }
    const reply = await this.scripts.run(client, {
      op: 'acquire',
      keys,
      script: ACQUIRE,
      redisKeys,
      args,
      onLateAnswer: (late) => {
        // It answered after we reported a failure. Freeing the keys here would be wrong when the
        // same owner tries again (a later attempt, queued behind this one, finds the lock its own)
        // or holds the lock by now: the caller decides.
        if (typeof late !== 'number' && (late as number[])[0] !== 1) return;
        return options?.onLateAcquire ? options.onLateAcquire() : this.release(keys, owner).catch(() => undefined);
      },
    });
    // The usual case answers with the token alone. Otherwise the third value: on success, 1 if the
    // key had a line; on failure, the key's last token.
    if (typeof reply === 'number') {
      this.line.acquired(owner, false);
      return { acquired: true, fencingToken: reply };
    }
    const [acquired, value, third] = reply as [number, number, number | string | undefined];
    if (acquired === 2) {
      // Holders of another limit: key `value` (1-based) and theirs, `shared` or the permits.
      return { acquired: false, limitMismatch: { key: keys[value - 1], limit: third === 'shared' ? SHARED : Number(third) } };
    }
    if (acquired === 1) {
      this.line.acquired(owner, third === 1);
      return { acquired: true, fencingToken: value };
    }
    this.line.attemptFailed(entry, keys, sentAt, third as number);
    return { acquired: false, retryAfterMs: value >= 0 ? value : undefined };
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const client = this.connection.open() ?? (await this.connection.connected('extend', keys));
    const layouts = this.layouts(keys, client);
    const locks = layouts.map((l) => l.lock);
    const holderStrings = layouts.map((l) => l.holder);
    const args = [owner, Math.ceil(ttlMs)];
    // -1: a key has holders beside each other, whose sets EXTEND does not have.
    let extended = this.besideOthers.has(owner)
      ? -1
      : await this.scripts.run(client, {
          op: 'extend',
          keys,
          script: EXTEND,
          redisKeys: [...locks, ...holderStrings, ...layouts.map((l) => l.fence)],
          args,
        });
    if (extended === -1) {
      const redisKeys = [...locks, ...layouts.map((l) => l.holders), ...holderStrings, ...layouts.map((l) => l.who)];
      extended = await this.scripts.run(client, { op: 'extend', keys, script: EXTEND_HOLDERS, redisKeys, args });
    }
    return extended === 1 ? { extended: true } : { extended: false };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    try {
      return await this.releaseOnce(keys, owner);
    } catch (error) {
      // Sent again once Redis is reachable (see FailedReleases); the caller still hears of it.
      const client = this.connection.current;
      if (client) {
        this.failedReleases.add(keys, owner);
        this.sendAgainWhenReady(client);
      }
      throw error;
    }
  }

  /**
   * ioredis fails what it queued while Redis was unreachable (after `maxRetriesPerRequest`
   * reconnection attempts) but sends again what was on the connection when it broke, whatever
   * became of its callers: an acquire or extension Redis may then apply again. 'ready' is emitted
   * after ioredis wrote those, so failed releases go out behind them.
   */
  private sendAgainWhenReady(client: Redis | Cluster): void {
    if (this.readyClient === client) return;
    this.readyClient?.off('ready', this.failedReleases.sendAgain);
    this.readyClient = client;
    client.on('ready', this.failedReleases.sendAgain);
  }

  private async releaseOnce(keys: readonly string[], owner: string): Promise<boolean> {
    // Sent in the usual case's short form when nothing here says that anyone waits for the key
    // (see RELEASE): two keys and one argument cost Redis less than four keys and two arguments. If
    // someone joined the line meanwhile, Redis says so, and the whole call follows.
    const { usual: alone, behindPing } = this.line.releasing(owner, keys);
    const usual = !this.besideOthers.delete(owner) && alone;
    const client = this.connection.open() ?? (await this.connection.connected('release', keys));
    const layouts = this.layouts(keys, client);
    if (usual) {
      const [{ lock, line }] = layouts;
      const reply = await this.scripts.run(client, {
        op: 'release',
        keys,
        script: RELEASE,
        redisKeys: [lock, line],
        args: [owner],
        // Reported as failed, it found a line and did nothing: the whole call frees the lock now.
        onLateAnswer: (late) => (late === -1 ? this.releaseWhole(client, keys, owner, layouts, false).catch(() => undefined) : undefined),
      });
      if (reply !== -1) return reply === 1;
    }
    return this.releaseWhole(client, keys, owner, layouts, behindPing);
  }

  /**
   * Redis writes pending replies newest client first (a client joins its write queue at the head).
   * A PING in the same write as the release gives us a pending reply before the script publishes,
   * so the waiter's message is written before our answer: its process hears sooner, and when that
   * is this process, the waiter enters before our caller goes on. Only for a key that had a line,
   * and not when a waiter of this process is next (its LockService sends its attempt right behind
   * the release, and that answer is the one it waits for): otherwise the PING costs time for
   * nothing. Not measured on Cluster.
   */
  private releaseWhole(
    client: Redis | Cluster,
    keys: readonly string[],
    owner: string,
    layouts: LockKeyLayout[],
    behindPing: boolean,
  ): Promise<boolean> {
    const handoff = this.line.handoffStarting(keys);
    const sentAt = performance.now();
    // A number, or the lock handed to a waiter of this process: [released, waiter, token, lease, passed].
    const answer = (reply: unknown): boolean => {
      if (!Array.isArray(reply)) return (reply as number) > 0;
      const [released, waiter, token, leaseMs, passed] = reply as [number, string, number, number, number];
      this.line.handedHere(keys, waiter, { fencingToken: token, leaseMs, notBefore: sentAt }, passed === 1);
      return released > 0;
    };
    const publish = this.connection.cluster ? 'SPUBLISH' : 'PUBLISH';
    const answered = this.scripts
      .run(client, {
        op: 'release',
        keys,
        script: RELEASE,
        redisKeys: lineScriptKeys(layouts, true),
        args: [owner, `${publish} ${this.waiterTimeout} ${this.line.id} ${handoff?.mayPass ? 1 : 0}`],
        behindPing,
        // Reported as failed, it still ran: a waiter of ours it handed the lock to takes it now,
        // rather than sleeping until its next poll with the lock its own.
        onLateAnswer: answer,
      })
      .then(answer);
    handoff?.sent(answered);
    return answered;
  }

  /**
   * The server's role: locks need a master (a replica refuses their writes). A Cluster routes each
   * key to its own master, so it has no one role. Read from INFO, which the documented ACL rule
   * allows (ROLE it does not); a user whose ACL leaves INFO out gets the role as unknown rather
   * than a health check that fails.
   */
  async health(): Promise<BackendHealth> {
    if (this.connection.cluster) return { up: true, details: { role: 'cluster' } };
    const client = (this.connection.open() ?? (await this.connection.connected('health', []))) as Redis;
    const info = await client.info('replication').catch((error: unknown) => {
      if (error instanceof Error && error.message.startsWith('NOPERM')) return 'role:unknown';
      if (this.connection.refusal) throw this.connection.refusal;
      // Not connected: said of the user's server, not in ioredis's words about its own retries.
      if (client.status !== 'ready') throw new LockBackendError(this.name, this.connection.unreachable(client), error);
      throw error;
    });
    const role = /^role:(\S+)/m.exec(info)?.[1] ?? 'unknown';
    if (role === 'master' || role === 'unknown') return { up: true, details: { role } };
    return { up: false, details: { role }, message: `Redis is a ${role}: locks need a master, which takes writes.` };
  }

  /**
   * At start-up: no such database, credentials refused, or a replica outside Sentinel reject with
   * a permanent LockBackendError; a Redis that cannot be reached resolves (see verifyRedis).
   */
  verify(): Promise<void> {
    return verifyRedis(this.connection, this.name, this.commandTimeout);
  }

  async inspect(key: string): Promise<LockState | undefined> {
    const client = this.connection.open() ?? (await this.connection.connected('inspect', [key]));
    const [layout] = this.layouts([key], client);
    const reply = await this.scripts.run(client, {
      op: 'inspect',
      keys: [key],
      script: INSPECT,
      redisKeys: [layout.lock, layout.fence, layout.holders, layout.line, layout.records, layout.holder, layout.who],
      args: [],
    });
    return inspectReply(key, reply as InspectReply);
  }

  /** SCAN on each master (see listRedisKeys). Read-only. */
  async list(options: LockListOptions): Promise<LockListPage> {
    const client = this.connection.open() ?? (await this.connection.connected('list', []));
    return listRedisKeys(client, this.connection.cluster, options, this.commandTimeout);
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.connection.closed) throw this.connection.closedError('watch', keys);
    // Releases name the waiter whose turn it is (see RELEASE): without the owner, nothing here
    // would answer to that name, and the caller polls.
    if (owner === undefined) return () => undefined;
    return this.line.watch(keys, onRelease, owner);
  }

  /**
   * Outside Cluster, once this process listens on its channel: a release that names one of its
   * waiters reaches it from then on, and is kept until that waiter watches.
   */
  watching(): boolean {
    return this.line.watching();
  }

  /** Closes the subscriber connection, and the client if the backend created it. */
  async close(): Promise<void> {
    if (!this.connection.stop()) return;
    this.failedReleases.close();
    this.readyClient?.off('ready', this.failedReleases.sendAgain);
    await this.line.close();
    await this.connection.requestsSettled(this.commandTimeout);
    await this.connection.closeClient();
  }

  private holdsBesideOthers(owner: string): void {
    // Bounded for callers of the backend that never release; forgetting one only costs a retry.
    if (this.besideOthers.size >= 10_000) this.besideOthers.clear();
    this.besideOthers.add(owner);
  }

  private layouts(keys: readonly string[], client: Redis | Cluster): LockKeyLayout[] {
    return lockKeyLayouts(keys, client.options.keyPrefix ?? '', this.connection.cluster);
  }
}

/**
 * ACQUIRE's limits argument (see ACQUIRE): each key's `1`, `<permits>` or `shared`, or undefined
 * when every key is exclusive (the usual case, sent without it).
 */
function limitArgument(limits: readonly number[] | undefined): string | undefined {
  if (limits === undefined || limits.every((limit) => limit === 1)) return undefined;
  return limits.map((limit) => (limit === SHARED ? 'shared' : String(limit))).join(' ');
}
