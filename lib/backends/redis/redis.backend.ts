import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { InvalidLockKeyError, LockBackendError } from '../../lock.errors.js';
import type { AcquireResult, ExtendResult, LockBackend, LockState, TryAcquireOptions } from '../lock-backend.interface.js';
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
import { ACQUIRE, EXTEND, INSPECT, RELEASE, runScript, type RedisScript } from './redis.scripts.js';

/**
 * How long a key's fencing counter outlives its last lease. Tokens stay increasing without it
 * (they start from the server clock), so this only bounds the memory of keys nobody locks anymore.
 */
const FENCE_RETENTION_MS = 24 * 60 * 60 * 1000;

const logger = new Logger('DistributedLock');

class CommandTimeoutError extends Error {}

/**
 * Leases in one Redis (standalone, Sentinel or Cluster) through ioredis. Every operation is one
 * round trip: one Lua script (see redis.scripts.ts). Fencing tokens are strictly increasing per
 * key. Waiters are woken by a pub/sub message on release, over one shared subscriber connection.
 *
 * Exclusive while Redis keeps its data: a failover to a replica that had not yet received a lock
 * (replication is asynchronous) can grant it twice. Use fencing tokens where that matters.
 */
export class RedisLockBackend implements LockBackend {
  readonly name = 'redis';
  readonly fencing = true;

  private readonly options: ResolvedRedisLockBackendOptions;
  private readonly connection: CheckedConnection;
  /** Whether we created the client, and so close it. */
  private readonly owned: boolean;
  private readonly cluster: boolean;
  private client: Redis | Cluster | undefined;
  private creating: Promise<Redis | Cluster> | undefined;
  private readonly subscriber: RedisReleaseSubscriber;
  private closed = false;
  /** Owners of this backend that failed an attempt and may be in a line in Redis. */
  private readonly inLine = new Set<string>();
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
    if (this.connection.kind === 'client') {
      this.client = this.connection.client;
      this.owned = false;
      this.cluster = this.connection.client.isCluster;
    } else {
      this.owned = true;
      this.cluster = this.connection.kind === 'cluster';
    }
    this.subscriber = new RedisReleaseSubscriber(() => this.createSubscriber(), this.cluster, this.options.commandTimeout);
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    const willWait = options?.willWait ?? true;
    const client = await this.connected('acquire', keys);
    const layouts = this.layouts(keys, client);
    const ttl = Math.ceil(ttlMs);
    const redisKeys = [...layouts.map((l) => l.lock), ...layouts.map((l) => l.fence), ...layouts.map((l) => l.queue), ...layouts.map((l) => l.queueDeadlines)];
    const [acquired, value] = (await this.run(client, 'acquire', keys, ACQUIRE, redisKeys, [owner, ttl, this.options.waiterTimeout, ttl + FENCE_RETENTION_MS, willWait ? 1 : 0], (late) => {
      // It answered after we gave up on it: nobody uses this lease, so free it for the others.
      if ((late as number[])[0] === 1) this.release(keys, owner).catch(() => undefined);
    })) as [number, number];
    if (acquired === 1) {
      this.inLine.delete(owner);
      return { acquired: true, fencingToken: value };
    }
    if (willWait) this.inLine.add(owner);
    return { acquired: false, retryAfterMs: value >= 0 ? value : undefined };
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const client = await this.connected('extend', keys);
    const layouts = this.layouts(keys, client);
    const ttl = Math.ceil(ttlMs);
    const redisKeys = [...layouts.map((l) => l.lock), ...layouts.map((l) => l.fence)];
    const extended = await this.run(client, 'extend', keys, EXTEND, redisKeys, [owner, ttl, ttl + FENCE_RETENTION_MS]);
    return extended === 1 ? { extended: true } : { extended: false };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    this.inLine.delete(owner);
    const client = await this.connected('release', keys);
    const layouts = this.layouts(keys, client);
    const redisKeys = [...layouts.map((l) => l.lock), ...layouts.map((l) => l.queue), ...layouts.map((l) => l.queueDeadlines)];
    const released = await this.run(client, 'release', keys, RELEASE, redisKeys, [owner, this.cluster ? 'SPUBLISH' : 'PUBLISH']);
    return (released as number) > 0;
  }

  async inspect(key: string): Promise<LockState | undefined> {
    const client = await this.connected('inspect', [key]);
    const [layout] = this.layouts([key], client);
    const [owner, pttl, token] = (await this.run(client, 'inspect', [key], INSPECT, [layout.lock, layout.fence], [])) as [string | null, number, string | null];
    if (owner === null) return undefined;
    return { key, owner, ttlMs: pttl >= 0 ? pttl : Number.POSITIVE_INFINITY, fencingToken: token === null ? undefined : Number(token) };
  }

  async watch(keys: readonly string[], onRelease: () => void): Promise<() => void> {
    if (this.closed) throw this.closedError('watch', keys);
    const prefix = keyPrefixOf(await this.connected('watch', keys));
    // The release script publishes on the lock key as Redis sees it, client key prefix included.
    // A release names the waiter first in line: only the process it belongs to needs to try.
    return this.subscriber.watch(
      keys.map((key) => prefix + key),
      (next) => {
        if (next === '' || this.inLine.has(next)) onRelease();
      },
    );
  }

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

  private async connected(op: string, keys: readonly string[]): Promise<Redis | Cluster> {
    if (this.closed) throw this.closedError(op, keys);
    if (this.client) return this.client;
    this.creating ??= this.createClient();
    return this.creating;
  }

  private async createClient(): Promise<Redis | Cluster> {
    const { Redis, Cluster } = await loadIoredis();
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
    // Channels are named in full (see watch), so the copy must not prefix them again.
    const subscriber = client.isCluster
      ? (client as Cluster).duplicate([], {
          shardedSubscribers: true,
          keyPrefix: '',
          redisOptions: { ...(client as Cluster).options.redisOptions, keyPrefix: '' },
        })
      : (client as Redis).duplicate({ keyPrefix: '' });
    // Its failures show as failed subscriptions (the waiter then polls), not as unhandled events.
    subscriber.on('error', () => undefined);
    if (this.closed) subscriber.disconnect();
    return subscriber;
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

  /** One script call, bounded by commandTimeout, with failures turned into LockBackendError. */
  private async run(
    client: Redis | Cluster,
    op: string,
    keys: readonly string[],
    script: RedisScript,
    redisKeys: readonly string[],
    args: readonly (string | number)[],
    onLateAnswer?: (reply: unknown) => void,
  ): Promise<unknown> {
    const reply = runScript(client, script, redisKeys, args);
    let timer: NodeJS.Timeout | undefined;
    try {
      return await new Promise((resolve, reject) => {
        timer = setTimeout(() => {
          if (onLateAnswer) reply.then(onLateAnswer, () => undefined);
          else reply.catch(() => undefined);
          reject(new CommandTimeoutError(`Redis did not answer within ${this.options.commandTimeout} ms (commandTimeout); is it paused or overloaded?`));
        }, this.options.commandTimeout);
        reply.then(resolve, reject);
      });
    } catch (error) {
      throw this.failure(op, keys, client, error);
    } finally {
      clearTimeout(timer);
    }
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

/** ioredis is an optional peer: loaded only when the backend creates a client itself. */
async function loadIoredis(): Promise<{ Redis: typeof Redis; Cluster: typeof Cluster }> {
  try {
    const { Redis, Cluster } = await import('ioredis');
    return { Redis, Cluster };
  } catch (error) {
    throw new LockBackendError('redis', "the 'ioredis' package is not installed. Run `npm install ioredis`, or pass an ioredis client you created.", error);
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([promise, new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)))]).finally(() => clearTimeout(timer));
}
