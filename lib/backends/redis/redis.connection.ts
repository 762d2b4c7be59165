import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import { CREATED_CLIENT_DEFAULTS, CREATED_SENTINEL_CLIENT_DEFAULTS, type CheckedConnection } from './redis.options.js';

const logger = new Logger('DistributedLock');

/**
 * The Redis backend's client: the user's, left open, or one it creates on first use and closes on
 * application shutdown; and the subscriber connection copied from it.
 */
export class RedisConnection {
  /** Whether we created the client, and so close it. */
  private readonly owned: boolean;
  readonly cluster: boolean;
  /** The ioredis package, loaded when the backend must create its client. */
  private readonly ioredis: IoredisPackage | undefined;
  private client: Redis | Cluster | undefined;
  private creating: Promise<Redis | Cluster> | undefined;
  /** Callers waiting for the client to be created: see connected(). */
  private awaitingClient = 0;
  private stopped = false;
  /** The last connection error of a client we created, to say why an operation failed. */
  private lastError: Error | undefined;
  /** Pending reconnections of clients of ours that ioredis gave up on: see keepConnecting(). */
  private readonly reconnections = new Set<NodeJS.Timeout>();

  constructor(
    private readonly connection: CheckedConnection,
    /** The backend's name, for errors. */
    private readonly backendName: string,
  ) {
    if (connection.kind === 'client') {
      this.client = connection.client;
      this.owned = false;
      this.cluster = connection.client.isCluster;
    } else {
      this.owned = true;
      this.cluster = connection.kind === 'cluster';
      this.ioredis = loadIoredis();
    }
  }

  /** The backend closed: no operation starts after it. */
  get closed(): boolean {
    return this.stopped;
  }

  /** The client once it exists, without awaiting anything: an await per operation adds up. */
  open(): Redis | Cluster | undefined {
    return this.stopped || this.awaitingClient > 0 ? undefined : this.client;
  }

  /**
   * The client, once created. Requests must reach Redis in the order they were made (a waiter's
   * place in Redis's line is the order of its process's queue), so while earlier callers still
   * wait to resume with the new client, later ones wait behind them instead of sending first.
   */
  async connected(op: string, keys: readonly string[]): Promise<Redis | Cluster> {
    if (this.stopped) throw this.closedError(op, keys);
    if (this.client && this.awaitingClient === 0) return this.client;
    this.awaitingClient++;
    try {
      this.creating ??= this.createClient();
      return await this.creating;
    } finally {
      this.awaitingClient--;
    }
  }

  /**
   * The subscriber: a copy of the client's settings, on a connection of its own. `watchOver`
   * attaches what must happen when it reconnects or its slots move.
   */
  async createSubscriber(watchOver: (subscriber: Redis | Cluster) => void): Promise<Redis | Cluster> {
    const client = await this.connected('watch', []);
    // Channels are named in full (see RedisWaiterLine), so the copy must not prefix them again.
    const subscriber = client.isCluster
      ? (client as Cluster).duplicate([], {
          shardedSubscribers: true,
          keyPrefix: '',
          redisOptions: { ...(client as Cluster).options.redisOptions, keyPrefix: '' },
        })
      : (client as Redis).duplicate({ keyPrefix: '' });
    // Its failures show as failed subscriptions (the waiter then polls), not as unhandled events.
    subscriber.on('error', () => undefined);
    if (!subscriber.isCluster) this.keepConnecting(subscriber as Redis);
    watchOver(subscriber);
    if (this.stopped) subscriber.disconnect();
    return subscriber;
  }

  /** Refuses operations from now on; false if it was already closed. */
  stop(): boolean {
    if (this.stopped) return false;
    this.stopped = true;
    for (const timer of this.reconnections) clearTimeout(timer);
    this.reconnections.clear();
    return true;
  }

  /** Closes the client if the backend created it (after stop()). */
  async closeClient(): Promise<void> {
    if (!this.owned) return;
    const client = this.client ?? (await this.creating?.catch(() => undefined));
    if (!client) return;
    if (client.status === 'ready') await withTimeout(client.quit(), 1_000).catch(() => undefined);
    client.disconnect();
  }

  /** Why the connection is down, for an error message; empty while it is ready. */
  describeState(client: Redis | Cluster): string {
    if (client.status === 'ready') return '';
    return ` Connection to Redis is '${client.status}'${this.lastError ? ` (${withoutStop(this.lastError.message)})` : ''}.`;
  }

  closedError(op: string, keys: readonly string[]): LockBackendError {
    return new LockBackendError(
      this.backendName,
      `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: the backend is closed (the application shut down).`,
    );
  }

  private async createClient(): Promise<Redis | Cluster> {
    const { Redis, Cluster } = this.ioredis!;
    const connection = this.connection;
    let client: Redis | Cluster;
    if (connection.kind === 'url') client = new Redis(connection.url, CREATED_CLIENT_DEFAULTS);
    else if (connection.kind === 'options') {
      const sentinel = connection.options.sentinels ? CREATED_SENTINEL_CLIENT_DEFAULTS : {};
      client = new Redis({ ...CREATED_CLIENT_DEFAULTS, ...sentinel, ...connection.options });
    } else if (connection.kind === 'cluster') {
      const options = connection.options ?? {};
      client = new Cluster(connection.nodes, { ...options, redisOptions: { ...CREATED_CLIENT_DEFAULTS, ...options.redisOptions } });
    } else throw new Error('unreachable: a client needs no creating');
    let down = false;
    client.on('error', (error: Error) => {
      this.lastError = error;
      // Once per outage, not once per reconnection attempt.
      if (!down)
        logger.warn(`Redis connection failed: ${withoutStop(error.message)}. Reconnecting; lock operations fail until it is back.`);
      down = true;
    });
    client.on('ready', () => {
      this.lastError = undefined;
      if (down) logger.log('Redis connection is back.');
      down = false;
    });
    if (!client.isCluster) this.keepConnecting(client as Redis);
    if (this.stopped) {
      client.disconnect();
      throw this.closedError('connect', []);
    }
    this.client = client;
    return client;
  }

  /**
   * ioredis gives up on a Sentinel client for good (status 'end', every command "Connection is
   * closed.") when its failover detector closes the connector while a reconnection is still asking
   * a sentinel where the master is: the +switch-master of the very failover it reconnects after
   * cancels that attempt, and ioredis retries a connection that closed, not one that never opened.
   * The window is the sentinel's answer time, wide on a loaded machine. So a client of ours whose
   * attempt to connect ends so, while the backend is open, tries again after its retryStrategy's
   * delay. An end that follows a close is ioredis's own choice (its retryStrategy said stop): kept.
   */
  private keepConnecting(client: Redis): void {
    let attempting = false;
    let attempts = 0;
    client.on('connecting', () => (attempting = true));
    client.on('close', () => (attempting = false));
    client.on('ready', () => (attempts = 0));
    client.on('end', () => {
      if (this.stopped || !attempting) return;
      const delay = client.options.retryStrategy?.(++attempts);
      if (typeof delay !== 'number') return;
      const timer = setTimeout(() => {
        this.reconnections.delete(timer);
        if (!this.stopped && client.status === 'end') client.connect().catch(() => undefined);
      }, delay);
      this.reconnections.add(timer);
    });
  }
}

function withoutStop(text: string): string {
  return text.replace(/\.+$/, '');
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
  return Promise.race([promise, new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)))]).finally(() =>
    clearTimeout(timer),
  );
}
