import { Logger } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { InvalidLockKeyError, InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import type { AcquireResult, ExtendResult, LockBackend, LockState, TryAcquireOptions } from '../lock-backend.interface.js';
import { CommandDeadlines } from './command-deadlines.js';
import { RedisReleaseSubscriber } from './redis-release.subscriber.js';
import { keySlot, lockKeyLayout, type LockKeyLayout } from './redis.keys.js';
import {
  checkConnection,
  CREATED_CLIENT_DEFAULTS,
  resolveBackendOptions,
  type CheckedConnection,
  type RedisLockBackendOptions,
  type RedisLockConnection,
  type ResolvedRedisLockBackendOptions,
} from './redis.options.js';
import { ACQUIRE, EXTEND, INSPECT, RELEASE, type RedisScript } from './redis.scripts.js';

const logger = new Logger('DistributedLock');

class CommandTimeoutError extends Error {}

/**
 * An owner of this process that is trying for a lock or waiting in its line in Redis: what is
 * needed to accept a lock the release script hands it (see RELEASE).
 */
interface LineEntry {
  /** The keys it wants, joined by newlines. */
  keys: string;
  /** When its last failed attempt was sent (performance.now()), and the key's last token then. */
  sentAt?: number;
  lastToken?: number;
  /** A hand-over announced before the answer to the attempt in flight came back. */
  early?: Handover;
  /** A hand-over it may take without asking Redis again. */
  granted?: { fencingToken: number; leaseMs: number; deadline: number };
  /** A wake-up that came before the waiter listened for one. */
  woken?: boolean;
}

interface Handover {
  fencingToken: number;
  leaseMs: number;
}

/**
 * Leases in one Redis (standalone, Sentinel or Cluster) through ioredis. Every operation is one
 * round trip: one Lua script (see redis.scripts.ts). Fencing tokens are strictly increasing per
 * key. Waiters stand in a fair line in Redis; a release hands the lock to the first of them and
 * tells its process by pub/sub, over one shared subscriber connection per backend.
 *
 * Exclusive while Redis keeps its data: a failover to a replica that had not yet received a lock
 * (replication is asynchronous) can grant it twice. Use fencing tokens where that matters.
 */
export class RedisLockBackend implements LockBackend {
  readonly name = 'redis';
  readonly fencing = true;
  readonly waiterTimeout: number;

  private readonly options: ResolvedRedisLockBackendOptions;
  private readonly connection: CheckedConnection;
  /** Whether we created the client, and so close it. */
  private readonly owned: boolean;
  private readonly cluster: boolean;
  /** The ioredis package, loaded when the backend must create its client. */
  private readonly ioredis: IoredisPackage | undefined;
  private client: Redis | Cluster | undefined;
  private creating: Promise<Redis | Cluster> | undefined;
  /** Callers waiting for the client to be created: see connected(). */
  private awaitingClient = 0;
  private readonly subscriber: RedisReleaseSubscriber;
  private readonly deadlines: CommandDeadlines;
  private closed = false;
  /** Owners of this process that are trying for a lock and may be in its line in Redis. */
  private readonly line = new Map<string, LineEntry>();
  /** Names this backend's wake-up channel: releases tell the first waiter in line through it. */
  private readonly id = randomBytes(9).toString('base64url');
  /** How to wake each waiting owner of this process. */
  private readonly wakers = new Map<string, () => void>();
  /** Outside Cluster one channel serves every key, subscribed at the first wait until close. */
  private processChannel: Promise<unknown> | undefined;
  /** That channel is confirmed: what `watching()` reports. */
  private listening = false;
  /**
   * Holders of this process that did not take a free key of the usual case (a hand-over, or a key
   * with a line): others are likely waiting, so their release is sent behind a PING (see release).
   */
  private readonly contended = new Set<string>();
  /** The last connection error of a client we created, to say why an operation failed. */
  private connectionError: Error | undefined;

  /**
   * `new RedisLockBackend(redis)` uses your ioredis client (Redis, Sentinel or Cluster) and leaves
   * it open; `new RedisLockBackend('redis://host:6379')` or `new RedisLockBackend({ host, port })`
   * creates one (ioredis must be installed) and closes it on application shutdown.
   */
  constructor(connection: RedisLockConnection, options?: RedisLockBackendOptions) {
    this.connection = checkConnection(connection);
    this.options = resolveBackendOptions(options);
    this.waiterTimeout = this.options.waiterTimeout;
    if (this.connection.kind === 'client') {
      this.client = this.connection.client;
      this.owned = false;
      this.cluster = this.connection.client.isCluster;
    } else {
      this.owned = true;
      this.cluster = this.connection.kind === 'cluster';
      this.ioredis = loadIoredis();
    }
    this.subscriber = new RedisReleaseSubscriber(() => this.createSubscriber(), this.cluster, this.options.commandTimeout);
    this.deadlines = new CommandDeadlines(this.options.commandTimeout);
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    const willWait = options?.willWait ?? true;
    let entry = this.line.get(owner);
    if (entry?.granted) {
      const granted = entry.granted;
      entry.granted = undefined;
      // Counted from a moment before Redis handed it over, so it never outlasts the real lease.
      // With too little of it left, asking Redis again (it finds the lock ours) renews it.
      const validityMs = granted.deadline - performance.now();
      if (validityMs > granted.leaseMs / 2) {
        this.line.delete(owner);
        this.holdsContended(owner);
        return { acquired: true, fencingToken: granted.fencingToken, validityMs };
      }
    }
    if (willWait && !entry) this.line.set(owner, (entry = { keys: keys.join('\n') }));
    const client = this.openClient() ?? (await this.connected('acquire', keys));
    const redisKeys = this.lineKeys(keys, client);
    const sentAt = performance.now();
    const ttl = Math.ceil(ttlMs);
    // The third value: on success, 1 if the key had a line; on failure, the key's last token.
    const [acquired, value, third] = (await this.run(client, 'acquire', keys, ACQUIRE, redisKeys, [owner, ttl, this.options.waiterTimeout, willWait ? 1 : 0, this.id], (late) => {
      // It answered after we reported a failure. Freeing the keys here would be wrong when the
      // same owner tries again (a later attempt, queued behind this one, finds the lock its own)
      // or holds the lock by now: the caller decides.
      if ((late as number[])[0] !== 1) return;
      if (options?.onLateAcquire) options.onLateAcquire();
      else this.release(keys, owner).catch(() => undefined);
    })) as [number, number, number?];
    if (acquired === 1) {
      this.line.delete(owner);
      if (third === 1) this.holdsContended(owner);
      return { acquired: true, fencingToken: value };
    }
    if (entry && keys.length === 1) {
      entry.sentAt = sentAt;
      entry.lastToken = third;
      const early = entry.early;
      entry.early = undefined;
      if (early) this.handOver(entry, early);
    }
    return { acquired: false, retryAfterMs: value >= 0 ? value : undefined };
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const client = this.openClient() ?? (await this.connected('extend', keys));
    const locks = this.layouts(keys, client).map((l) => l.lock);
    const extended = await this.run(client, 'extend', keys, EXTEND, locks, [owner, Math.ceil(ttlMs)]);
    return extended === 1 ? { extended: true } : { extended: false };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    this.line.delete(owner);
    const client = this.openClient() ?? (await this.connected('release', keys));
    // Redis writes pending replies newest client first (a client joins its write queue at the
    // head). A PING in the same write as the release gives us a pending reply before the script
    // publishes, so the waiter's message is written before our answer: its process hears sooner,
    // and when that is this process, the waiter enters before our caller goes on. Only for a key
    // that had a line, and not when a waiter of this process is next (its LockService sends its
    // attempt right behind the release, and that answer is the one it waits for): otherwise the
    // PING costs time for nothing. Not measured on Cluster.
    const behindPing = this.contended.delete(owner) && !this.waitsHere(keys);
    const released = await this.run(
      client,
      'release',
      keys,
      RELEASE,
      this.lineKeys(keys, client),
      [owner, this.cluster ? 'SPUBLISH' : 'PUBLISH', this.options.waiterTimeout],
      undefined,
      behindPing,
    );
    return (released as number) > 0;
  }

  async inspect(key: string): Promise<LockState | undefined> {
    const client = this.openClient() ?? (await this.connected('inspect', [key]));
    const [layout] = this.layouts([key], client);
    const [owner, pttl, token] = (await this.run(client, 'inspect', [key], INSPECT, [layout.lock, layout.fence], [])) as [string | null, number, string | null];
    if (owner === null) return undefined;
    return { key, owner, ttlMs: pttl >= 0 ? pttl : Number.POSITIVE_INFINITY, fencingToken: token === null ? undefined : Number(token) };
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.closed) throw this.closedError('watch', keys);
    // Releases name the waiter whose turn it is (see RELEASE): without the owner, nothing here
    // would answer to that name, and the caller polls.
    if (owner === undefined) return () => undefined;
    this.wakers.set(owner, onRelease);
    let unsubscribe: (() => void) | undefined;
    const stop = () => {
      unsubscribe?.();
      if (this.wakers.get(owner) === onRelease) this.wakers.delete(owner);
    };
    try {
      unsubscribe = await this.subscribe(keys, owner);
    } catch (error) {
      stop();
      throw error;
    }
    const entry = this.line.get(owner);
    if (entry?.woken) {
      entry.woken = false;
      onRelease();
    }
    return stop;
  }

  /**
   * Outside Cluster, once this process listens on its channel: a release that names one of its
   * waiters reaches it from then on, and is kept (see onMessage) until that waiter watches.
   */
  watching(): boolean {
    return this.listening && !this.closed;
  }

  /** Makes sure this process hears the releases that name `owner`; returns how to stop, if needed. */
  private async subscribe(keys: readonly string[], owner: string): Promise<(() => void) | undefined> {
    const client = await this.connected('watch', keys);
    if (!this.cluster) {
      this.processChannel ??= this.subscriber.watch([`nest-distributed-lock:${this.id}`], this.onMessage).then(
        () => (this.listening = true),
        (error: unknown) => {
          this.processChannel = undefined;
          throw error;
        },
      );
      await this.processChannel;
      return undefined;
    }
    // Sharded channels live in a slot, so there is one per lock (its line key as Redis sees it,
    // client key prefix included), shared by this process's waiters on it.
    const prefix = keyPrefixOf(client);
    return this.subscriber.watch(
      this.layouts(keys, client).map((layout) => `${prefix}${layout.queue}:${this.id}`),
      (message) => {
        if (message === owner || message.startsWith(`${owner} `)) this.onMessage(message);
      },
    );
  }

  /** A release told one of our waiters that it is its turn, maybe handing it the lock. */
  private readonly onMessage = (message: string): void => {
    const [owner, token, lease] = message.split(' ');
    const entry = this.line.get(owner);
    if (!entry) return;
    if (lease !== undefined) this.handOver(entry, { fencingToken: Number(token), leaseMs: Number(lease) });
    const wake = this.wakers.get(owner);
    if (wake) wake();
    else entry.woken = true;
  };

  /** Closes the subscriber connection, and the client if the backend created it. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.subscriber.close();
    if (!this.owned) return;
    const client = this.client ?? (await this.creating?.catch(() => undefined));
    if (!client) return;
    if (client.status === 'ready') await withTimeout(client.quit(), 1_000).catch(() => undefined);
    client.disconnect();
  }

  /** The client once it exists, without awaiting anything: an await per operation adds up. */
  private openClient(): Redis | Cluster | undefined {
    return this.closed || this.awaitingClient > 0 ? undefined : this.client;
  }

  /**
   * The client, once created. Requests must reach Redis in the order they were made (a waiter's
   * place in Redis's line is the order of its process's queue), so while earlier callers still
   * wait to resume with the new client, later ones wait behind them instead of sending first.
   */
  private async connected(op: string, keys: readonly string[]): Promise<Redis | Cluster> {
    if (this.closed) throw this.closedError(op, keys);
    if (this.client && this.awaitingClient === 0) return this.client;
    this.awaitingClient++;
    try {
      this.creating ??= this.createClient();
      return await this.creating;
    } finally {
      this.awaitingClient--;
    }
  }

  private async createClient(): Promise<Redis | Cluster> {
    const { Redis, Cluster } = this.ioredis!;
    const connection = this.connection;
    let client: Redis | Cluster;
    if (connection.kind === 'url') client = new Redis(connection.url, CREATED_CLIENT_DEFAULTS);
    else if (connection.kind === 'options') client = new Redis({ ...CREATED_CLIENT_DEFAULTS, ...connection.options });
    else if (connection.kind === 'cluster') {
      const options = connection.options ?? {};
      client = new Cluster(connection.nodes, { ...options, redisOptions: { ...CREATED_CLIENT_DEFAULTS, ...options.redisOptions } });
    } else throw new Error('unreachable: a client needs no creating');
    let down = false;
    client.on('error', (error: Error) => {
      this.connectionError = error;
      // Once per outage, not once per reconnection attempt.
      if (!down) logger.warn(`Redis connection failed: ${withoutStop(error.message)}. Reconnecting; lock operations fail until it is back.`);
      down = true;
    });
    client.on('ready', () => {
      this.connectionError = undefined;
      if (down) logger.log('Redis connection is back.');
      down = false;
    });
    if (this.closed) {
      client.disconnect();
      throw this.closedError('connect', []);
    }
    this.client = client;
    return client;
  }

  /** The shared subscriber: a copy of the client's settings, on a connection of its own. */
  private async createSubscriber(): Promise<Redis | Cluster> {
    const client = await this.connected('watch', []);
    // Channels are named in full (see subscribe), so the copy must not prefix them again.
    const subscriber = client.isCluster
      ? (client as Cluster).duplicate([], {
          shardedSubscribers: true,
          keyPrefix: '',
          redisOptions: { ...(client as Cluster).options.redisOptions, keyPrefix: '' },
        })
      : (client as Redis).duplicate({ keyPrefix: '' });
    // Its failures show as failed subscriptions (the waiter then polls), not as unhandled events.
    subscriber.on('error', () => undefined);
    if (client.isCluster) this.recoverAfterSlotMove(subscriber as Cluster);
    else this.recoverAfterReconnect(subscriber as Redis);
    if (this.closed) subscriber.disconnect();
    return subscriber;
  }

  /**
   * Releases published while the subscriber reconnects are lost. Until the process channel is
   * confirmed again, `watching()` says no, so a new waiter tries again after it subscribes; once it
   * is, every waiter of this process tries again, as a release meant for it may have been lost.
   */
  private recoverAfterReconnect(subscriber: Redis): void {
    let lost = false;
    subscriber.on('close', () => {
      lost ||= this.listening;
      this.listening = false;
    });
    subscriber.on('ready', () => {
      if (!lost || this.closed) return;
      // ioredis subscribes again by itself; ours goes out after it, so its answer covers both.
      subscriber.subscribe(`nest-distributed-lock:${this.id}`).then(
        () => {
          lost = false;
          this.listening = true;
          this.wakeAllWaiters();
        },
        () => undefined, // still lost: the next reconnection tries again
      );
    });
  }

  /**
   * On Cluster a slot that moves to another master takes its sharded subscriptions along: the old
   * master drops them (an SUNSUBSCRIBE nobody asked for, which ioredis reports as a node error),
   * and ioredis subscribes them again on the new master only once it reloads its slot map. So a
   * node error reloads the map; when ioredis reports its subscriptions ready again, every waiter
   * of this process tries again, as a release meant for it may have been lost meanwhile.
   */
  private recoverAfterSlotMove(subscriber: Cluster): void {
    subscriber.on('nodeError', () => {
      if (!this.closed) subscriber.refreshSlotsCache();
    });
    subscriber.on('subscribersReady', () => {
      if (!this.closed) this.wakeAllWaiters();
    });
  }

  /** Every waiter of this process tries again: a release meant for one of them may be lost. */
  private wakeAllWaiters(): void {
    for (const wake of [...this.wakers.values()]) wake();
  }

  private waitsHere(keys: readonly string[]): boolean {
    const id = keys.join('\n');
    for (const entry of this.line.values()) if (entry.keys === id) return true;
    return false;
  }

  private holdsContended(owner: string): void {
    if (this.cluster) return; // no PING there (see release)
    // Bounded for callers of the backend that never release (LockService always does).
    if (this.contended.size >= 10_000) this.contended.clear();
    this.contended.add(owner);
  }

  /**
   * Takes a hand-over for a waiter if it came after the waiter's last failed attempt (its token is
   * greater than the one that attempt saw). Then the lock was handed over after that attempt was
   * sent, so the lease counted from the send time is certainly within the real one.
   */
  private handOver(entry: LineEntry, handover: Handover): void {
    if (entry.sentAt === undefined || entry.lastToken === undefined) {
      entry.early = handover;
    } else if (handover.fencingToken > entry.lastToken) {
      entry.granted = { ...handover, deadline: entry.sentAt + handover.leaseMs };
    }
  }

  /** The keys of the scripts that keep the line: locks, fencing counters, lines, waiter records. */
  private lineKeys(keys: readonly string[], client: Redis | Cluster): string[] {
    const layouts = this.layouts(keys, client);
    if (layouts.length === 1) {
      const [{ lock, fence, queue, waiters }] = layouts;
      return [lock, fence, queue, waiters];
    }
    return [...layouts.map((l) => l.lock), ...layouts.map((l) => l.fence), ...layouts.map((l) => l.queue), ...layouts.map((l) => l.waiters)];
  }

  private layouts(keys: readonly string[], client: Redis | Cluster): LockKeyLayout[] {
    const prefix = keyPrefixOf(client);
    if (this.cluster && keys.length > 1) {
      const slot = keySlot(prefix + keys[0]);
      const other = keys.find((key) => keySlot(prefix + key) !== slot);
      if (other !== undefined) {
        throw new InvalidLockKeyError(
          `Keys ${keys.join(', ')} cannot be locked together on Redis Cluster: '${keys[0]}' and '${other}' are in different slots, and one ` +
            `script can only touch one slot. Give them a common hash tag, e.g. 'order:{42}:payment' and 'order:{42}:stock'.`,
        );
      }
    }
    return keys.map((key) => lockKeyLayout(key, prefix));
  }

  /**
   * One script call, bounded by commandTimeout, with failures turned into LockBackendError. It
   * runs by SHA; on NOSCRIPT (a restarted or flushed Redis) it sends the script whole once.
   */
  private run(
    client: Redis | Cluster,
    op: string,
    keys: readonly string[],
    script: RedisScript,
    redisKeys: readonly string[],
    args: readonly (string | number)[],
    onLateAnswer?: (reply: unknown) => void,
    behindPing = false,
  ): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const command = this.deadlines.track(() =>
        reject(this.failure(op, keys, client, new CommandTimeoutError(`Redis did not answer within ${this.options.commandTimeout} ms (commandTimeout); is it paused or overloaded?`))),
      );
      const answered = (reply: unknown) => {
        if (this.deadlines.answered(command)) resolve(reply);
        else onLateAnswer?.(reply);
      };
      const failed = (error: unknown) => {
        if (this.deadlines.answered(command)) reject(this.failure(op, keys, client, error));
      };
      const sent = behindPing
        ? (client as Redis)
            .pipeline()
            .ping()
            .evalsha(script.sha, redisKeys.length, ...redisKeys, ...args)
            .exec()
            .then((replies) => {
              const [error, reply] = replies![1];
              if (error) throw error;
              return reply;
            })
        : client.evalsha(script.sha, redisKeys.length, ...redisKeys, ...args);
      sent.then(answered, (error: unknown) => {
        if (error instanceof Error && error.message.startsWith('NOSCRIPT')) client.eval(script.lua, redisKeys.length, ...redisKeys, ...args).then(answered, failed);
        else failed(error);
      });
    });
  }

  private failure(op: string, keys: readonly string[], client: Redis | Cluster, error: unknown): LockBackendError {
    const message = sentence(error instanceof Error ? error.message : String(error));
    const connection = client.status === 'ready' ? '' : ` Connection to Redis is '${client.status}'${this.connectionError ? ` (${withoutStop(this.connectionError.message)})` : ''}.`;
    return new LockBackendError(this.name, `${op} of ${keys.join(', ')} failed: ${message}${connection}`, error);
  }

  private closedError(op: string, keys: readonly string[]): LockBackendError {
    return new LockBackendError(this.name, `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: the backend is closed (the application shut down).`);
  }
}

/** Messages from ioredis and our own may end in '.' or '?' already; no 'cache..' or 'overloaded?.'. */
function sentence(text: string): string {
  return /[.?!]$/.test(text) ? text : `${text}.`;
}

function withoutStop(text: string): string {
  return text.replace(/\.+$/, '');
}

function keyPrefixOf(client: Redis | Cluster): string {
  return client.options.keyPrefix ?? '';
}

type IoredisPackage = { Redis: typeof Redis; Cluster: typeof Cluster };

/**
 * ioredis is an optional peer, needed only when the backend creates its client: loaded then, at
 * construction, so a missing package stops the application at start-up, not at its first lock.
 */
function loadIoredis(): IoredisPackage {
  try {
    return requirePeer('ioredis') as IoredisPackage;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'connection',
      `RedisLockBackend needs the 'ioredis' package to create its Redis client: npm install ioredis, or pass an ioredis client you created ` +
        `(${error instanceof Error ? error.message : String(error)})`,
    );
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([promise, new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)))]).finally(() => clearTimeout(timer));
}
