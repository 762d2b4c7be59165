import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import { refusalFix, refusalOf } from './redis.refusals.js';
import { CREATED_CLIENT_DEFAULTS, CREATED_SENTINEL_CLIENT_DEFAULTS, type CheckedConnection } from './redis.options.js';
import { withTimeout } from '../bounded-wait.js';
import { InFlight } from '../in-flight.js';

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
  /** The client was closed (closeClient()): not even a release goes out. */
  private ended = false;
  /** Calls under way, and the clean-up their late answers start: closeClient() comes after them. */
  private readonly requests = new InFlight();
  /** The last connection error of a client we created, to say why an operation failed. */
  private lastError: Error | undefined;
  /**
   * Set while the server refuses this client for good (no such database, credentials refused):
   * operations fail at once with it instead of after their whole wait. See refusalOf.
   */
  private refused: LockBackendError | undefined;
  /**
   * A database the server does not have: kept apart from `refused`, which a 'ready' clears, since
   * ioredis may still report ready after the failed SELECT (ready check off) of a client it closed.
   */
  private wrongDatabase: LockBackendError | undefined;
  /**
   * Whether the server has answered a lock script of ours: a READONLY after that is the master
   * demoted under us (see readOnlyForGood), not a backend pointed at a replica.
   */
  private masterSeen = false;
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
    return this.stopped || this.awaitingClient > 0 || this.refusal ? undefined : this.client;
  }

  /** The client, also while the server refuses it (a failed release is sent again once it is ready). */
  get current(): Redis | Cluster | undefined {
    return this.stopped ? undefined : this.client;
  }

  /** What the server refuses for good, if anything: see `refused`. */
  get refusal(): LockBackendError | undefined {
    return this.wrongDatabase ?? this.refused;
  }

  /** Whether a READONLY answer may heal by waiting: behind Sentinel it is a failover in progress. */
  get readOnlyHeals(): boolean {
    const client = this.client;
    if (client) return client.isCluster || Boolean((client as Redis).options.sentinels);
    return this.connection.kind === 'cluster' || (this.connection.kind === 'options' && Boolean(this.connection.options.sentinels));
  }

  /** A lock script was answered: the server took our writes, so it has been a master. */
  answered(): void {
    this.masterSeen = true;
  }

  /**
   * Whether a READONLY answer of a standalone server is for good. Behind one name for the master
   * (a managed service's primary endpoint, a Kubernetes Service) a failover demotes the server
   * our connection is on, and Redis does not close a normal client's connection then: a client
   * of ours reconnects on READONLY (see createClient), which finds the new master. So it is for
   * good only for a backend that never had a master and whose fresh connection still finds a
   * replica: one pointed at a replica by mistake.
   */
  async readOnlyForGood(client: Redis | Cluster, timeoutMs: number): Promise<boolean> {
    if (this.readOnlyHeals || this.masterSeen) return false;
    return (await this.freshRole(client as Redis, timeoutMs)) === 'slave';
  }

  /** The server's role as a new connection finds it (a name may point elsewhere by now). */
  async freshRole(client: Redis, timeoutMs: number): Promise<string | undefined> {
    const probe = client.duplicate({ lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: timeoutMs });
    probe.on('error', () => undefined);
    try {
      const info = await withTimeout(
        probe.connect().then(() => probe.info('replication')),
        timeoutMs,
      );
      return info === undefined ? undefined : /^role:(\S+)/m.exec(info)?.[1];
    } catch {
      return undefined;
    } finally {
      probe.disconnect();
    }
  }

  /** Where the client points, for messages: never its URL, which may hold a password. */
  where(client: Redis | Cluster | undefined = this.client): string {
    if (!client) return 'Redis';
    if (client.isCluster) return 'the Redis Cluster';
    const { host, port, path, sentinels, name } = (client as Redis).options;
    if (sentinels) return `the Redis master '${name}' (through Sentinel)`;
    return `Redis at ${path ?? `${host ?? 'localhost'}:${port ?? 6379}`}`;
  }

  /**
   * The client, once created. Requests must reach Redis in the order they were made (a waiter's
   * place in Redis's line is the order of its process's queue), so while earlier callers still
   * wait to resume with the new client, later ones wait behind them instead of sending first.
   */
  async connected(op: string, keys: readonly string[]): Promise<Redis | Cluster> {
    // Releases still go out after stop(), until the client is closed: a late answer's clean-up.
    if (this.ended || (this.stopped && op !== 'release')) throw this.closedError(op, keys);
    const refusal = this.refusal;
    if (refusal) throw refusal;
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

  /** Counts a call until it settles, and returns it (see InFlight). */
  track<T>(request: Promise<T>): Promise<T> {
    return this.requests.track(request);
  }

  /**
   * Resolves once the calls under way are answered, and the releases those answers started (a
   * late win given back, the whole release of a key someone waits for), or after `boundMs`:
   * QUIT goes out behind what was sent, and anything sent after it is lost.
   */
  requestsSettled(boundMs: number): Promise<void> {
    return this.requests.settled(boundMs);
  }

  /** Closes the client if the backend created it (after stop() and requestsSettled()). */
  async closeClient(): Promise<void> {
    this.ended = true;
    if (!this.owned) return;
    const client = this.client ?? (await this.creating?.catch(() => undefined));
    if (!client) return;
    if (client.status === 'ready') await withTimeout(client.quit(), 1_000).catch(() => undefined);
    client.disconnect();
  }

  /** Why the connection is down, for an error message; empty while it is ready. */
  describeState(client: Redis | Cluster): string {
    if (client.status === 'ready') return '';
    return ` Connection to Redis is '${client.status}'${this.lastError ? `: ${this.unreachable(client)}` : '.'}`;
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
    if (connection.kind === 'url') {
      client = new Redis(connection.url, CREATED_CLIENT_DEFAULTS);
      reconnectOnReadOnly(client);
    } else if (connection.kind === 'options') {
      const sentinel = connection.options.sentinels ? CREATED_SENTINEL_CLIENT_DEFAULTS : {};
      client = new Redis({ ...CREATED_CLIENT_DEFAULTS, ...sentinel, ...connection.options });
      if (!connection.options.sentinels) reconnectOnReadOnly(client);
    } else if (connection.kind === 'cluster') {
      const options = connection.options ?? {};
      client = new Cluster(connection.nodes, { ...options, redisOptions: { ...CREATED_CLIENT_DEFAULTS, ...options.redisOptions } });
    } else throw new Error('unreachable: a client needs no creating');
    // No lock may reach the server before its SELECT is answered: without the ready check, ioredis
    // sends the queued commands right behind a SELECT that may fail, and they run in database 0.
    if (!client.isCluster && ((client as Redis).options.db ?? 0) !== 0) (client as Redis).options.enableReadyCheck = true;
    let down = false;
    client.on('error', (error: Error) => {
      this.lastError = error;
      const refusal = refusalOf(error);
      if (refusal === 'database') return this.refuseDatabase(client as Redis, error);
      if (refusal === 'credentials') {
        // ioredis keeps trying (an operator may fix the user); operations fail at once meanwhile.
        const message = `${withoutStop(error.message)}: ${refusalFix(refusal, this.where(client))}`;
        if (!this.refused) logger.error(`Redis connection refused: ${message}`);
        this.refused = new LockBackendError(this.backendName, message, error, { permanent: true });
        down = true;
        return;
      }
      // Once per outage, not once per reconnection attempt.
      if (!down) logger.warn(`${this.unreachable(client)} Reconnecting; lock operations fail until it is back.`);
      down = true;
    });
    client.on('ready', () => {
      this.lastError = undefined;
      this.refused = undefined;
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
   * Why the client is not connected, in words about the user's server rather than ioredis's (its
   * "max retries per request" names a client option of a client the user did not create).
   */
  unreachable(client: Redis | Cluster | undefined = this.client): string {
    const cause = this.lastError;
    const code = (cause as { code?: string } | undefined)?.code;
    const why =
      code === 'ECONNREFUSED'
        ? 'refused the connection (is it running, on this host and port?)'
        : code === 'ENOTFOUND' || code === 'EAI_AGAIN'
          ? 'cannot be reached: its host name does not resolve'
          : `cannot be reached${cause ? ` (${withoutStop(cause.message)})` : ''}`;
    return `${this.where(client)} ${why}.`;
  }

  /**
   * A URL or options naming a database the server does not have: ioredis reports the failed
   * SELECT and goes on in database 0, where the locks would not be where the user put them (and
   * would not exclude processes that use the right one). The client is closed before it sends
   * anything (SELECT is answered before ioredis's ready check, ahead of every queued command), and
   * every operation fails with an error that names the database and the server's limit.
   */
  private refuseDatabase(client: Redis, error: Error): void {
    if (this.wrongDatabase) return;
    const db = client.options.db ?? 0;
    const message = (limit?: number) =>
      `${this.where(client)} has no database ${db}: ` +
      (limit === undefined
        ? `its 'databases' setting (16 by default) is lower. `
        : `it has ${limit} (0 to ${limit - 1}, its 'databases' setting). `) +
      `Name a database it has in the URL ('redis://host:6379/0') or the 'db' option, or raise 'databases' in its redis.conf. ` +
      `No lock was taken in another database.`;
    let refusal = new LockBackendError(this.backendName, message(), error, { permanent: true });
    this.wrongDatabase = refusal;
    client.disconnect();
    // The limit, from a connection to database 0, for the log and later errors.
    const probe = client.duplicate({ db: 0, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => undefined);
    void probe
      .connect()
      .then(() => probe.config('GET', 'databases'))
      .then(
        (reply) => Number((reply as string[])[1]),
        () => undefined,
      )
      .then((limit) => {
        probe.disconnect();
        if (limit !== undefined && Number.isInteger(limit)) {
          this.wrongDatabase = refusal = new LockBackendError(this.backendName, message(limit), error, { permanent: true });
        }
        logger.error(refusal.message);
      });
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

/**
 * A client of ours that meets READONLY reconnects (the failed command is not sent again): after a
 * failover behind one name for the master, its connection stays on the demoted server, which
 * Redis does not close. The user's own reconnectOnError, if any, decides instead.
 */
function reconnectOnReadOnly(client: Redis): void {
  client.options.reconnectOnError ??= (error: Error) => (/^READONLY\b/.test(error.message) ? 1 : false);
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
