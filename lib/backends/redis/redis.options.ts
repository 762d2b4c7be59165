import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from 'ioredis';
import { InvalidLockOptionsError } from '../../lock.errors.js';
import { BackendOptionChecks } from '../backend-options.checks.js';
import { redactUrl, show } from '../../option-value.js';

/** Cluster nodes for a Cluster client the backend creates: `{ clusterNodes: [{ host, port }] }`. */
export interface RedisClusterConnectionOptions {
  clusterNodes: ClusterNode[];
  clusterOptions?: ClusterOptions;
}

/**
 * How the backend reaches Redis:
 * - an ioredis client (`new Redis(...)`, Sentinel through `new Redis({ sentinels, name })`, or
 *   `new Cluster(...)`): used as is and left open on shutdown, since it is yours;
 * - a URL (`'redis://:password@host:6379/0'`, `'rediss://...'`), ioredis options
 *   (`{ host, port }`, `{ sentinels, name }`), or `{ clusterNodes, clusterOptions }`: the backend
 *   creates the client, with the fail-fast defaults below, and closes it on shutdown.
 */
export type RedisLockConnection = Redis | Cluster | string | RedisOptions | RedisClusterConnectionOptions;

export interface RedisLockBackendOptions {
  /**
   * Longest wait for Redis to answer one lock operation before it counts as failed, in ms. Keeps a
   * paused or unreachable Redis from hanging an acquire; the service retries within its wait.
   * Default 2 000.
   */
  commandTimeout?: number;
  /**
   * How long a waiter keeps its place in the line of a busy lock without asking again, in ms.
   * Waiters ask on every release and at least every `pollInterval`, so keep it well above that
   * (a LockService whose pollInterval is not below it refuses to start); a waiter that crashed
   * holds up the others for at most this long. Whole ms (a fraction is rounded up). Default 3 000.
   */
  waiterTimeout?: number;
  /**
   * How many times in a row a released lock may go to a waiter of this process (this backend)
   * although a waiter of another process stood before it in the line, as cohort locks do: a
   * hand-over inside one process costs one round trip, one between processes a message through
   * Redis more. 0 keeps strict arrival order across processes. A waiter of another process waits
   * at most this many extra lock holds per process it meets. Default 0.
   */
  localHandoffs?: number;
}

export type ResolvedRedisLockBackendOptions = Required<RedisLockBackendOptions>;

/**
 * For clients the backend creates: a lock request must fail quickly while Redis is down (the
 * service retries within the caller's wait) rather than sit in ioredis's offline queue through
 * 20 reconnections, and reconnection keeps trying, often, for as long as the app runs. On close,
 * ioredis waits `disconnectTimeout` for a socket to report it closed, on a timer that keeps the
 * process alive; a socket Redis already dropped never reports it, so an app shutting down while
 * Redis is down would exit 2 s late (ioredis's default). The backend has quit by then anyway.
 */
export const CREATED_CLIENT_DEFAULTS = {
  maxRetriesPerRequest: 1,
  connectTimeout: 2_000,
  disconnectTimeout: 100,
  retryStrategy: (attempt: number) => Math.min(attempt * 100, 1_000),
} satisfies RedisOptions;

/**
 * Added for a Sentinel client the backend creates: ioredis listens for the sentinels'
 * `+switch-master` and reconnects (asking them for the new master) as soon as a failover ends.
 * Without it a connection stays on the old master for as long as that server still acts as one:
 * Sentinel reconfigures it as a replica only seconds later (or once it is reachable again), and
 * meanwhile it grants locks to the processes still connected to it while the others, asking the
 * sentinels, lock on the new master: two holders of one lock for all that time. Costs a
 * connection to each sentinel (up to ioredis's `sentinelMaxConnections`) per client.
 * `failoverDetector: false` in the options turns it off.
 *
 * And a sentinel must answer where the master is within `sentinelCommandTimeout`, else the client
 * asks the next one: ioredis waits for that answer without a limit by default, so a request lost
 * on a connection that stays up (a frozen sentinel, a partition) kept a reconnecting client
 * 'connecting' for good, never trying another sentinel nor the same one again.
 */
export const CREATED_SENTINEL_CLIENT_DEFAULTS = { failoverDetector: true, sentinelCommandTimeout: 2_000 } satisfies RedisOptions;

const HOW_TO =
  "Pass an ioredis client (new Redis(...) or new Cluster(...)), a URL ('redis://host:6379'), ioredis options ({ host, port }) or { clusterNodes: [{ host, port }] }.";

export type CheckedConnection =
  | { kind: 'client'; client: Redis | Cluster }
  | { kind: 'url'; url: string }
  | { kind: 'options'; options: RedisOptions }
  | { kind: 'cluster'; nodes: ClusterNode[]; options: ClusterOptions | undefined };

// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks('RedisLockBackend');

/** Checks what the constructor got, with a message that says what to pass instead. */
export function checkConnection(connection: unknown): CheckedConnection {
  const fail = (what: string): never => {
    throw new InvalidLockOptionsError('connection', `RedisLockBackend: ${what}. ${HOW_TO}`);
  };
  if (typeof connection === 'string') {
    // 'localhost:6379' parses as a URL of scheme 'localhost:': say what was written, and the fix.
    if (!connection.includes('://')) {
      fail(`'${redactUrl(connection)}' has no scheme: write it as 'redis://${redactUrl(connection)}' ('rediss://' for TLS)`);
    }
    let url: URL | undefined;
    try {
      url = new URL(connection);
    } catch {
      fail(`'${redactUrl(connection)}' is not a URL`);
    }
    if (url!.protocol !== 'redis:' && url!.protocol !== 'rediss:') {
      fail(`the URL must start with redis:// or rediss://, got '${redactUrl(connection)}'`);
    }
    return { kind: 'url', url: connection };
  }
  if (typeof connection !== 'object' || connection === null || Array.isArray(connection)) {
    return fail(`expected a connection, got ${connection === null ? 'null' : Array.isArray(connection) ? 'an array' : String(connection)}`);
  }
  const candidate = connection as Record<string, unknown>;
  if (typeof candidate.evalsha === 'function' && typeof candidate.duplicate === 'function') {
    if (candidate.status === 'end') fail('the ioredis client given is closed (quit() or disconnect() was called on it)');
    return { kind: 'client', client: connection as Redis | Cluster };
  }
  checks.plainSettings('connection', connection, 'an ioredis client', HOW_TO);
  if ('clusterNodes' in candidate) {
    const nodes = candidate.clusterNodes;
    if (!Array.isArray(nodes) || nodes.length === 0) fail('clusterNodes must be a non-empty array of { host, port } or URLs');
    if (candidate.clusterOptions !== undefined && (typeof candidate.clusterOptions !== 'object' || candidate.clusterOptions === null)) {
      fail('clusterOptions must be an object of ioredis Cluster options');
    }
    return { kind: 'cluster', nodes: nodes as ClusterNode[], options: candidate.clusterOptions as ClusterOptions | undefined };
  }
  const { host, port, sentinels, name } = candidate;
  if (host !== undefined && (typeof host !== 'string' || host === '')) fail(`option 'host' must be a non-empty string, got ${show(host)}`);
  if (port !== undefined && !(Number.isInteger(port) && (port as number) > 0 && (port as number) < 65_536)) {
    fail(`option 'port' must be an integer from 1 to 65535, got ${show(port)}`);
  }
  if (sentinels !== undefined) {
    if (!Array.isArray(sentinels) || sentinels.length === 0) fail("option 'sentinels' must be a non-empty array of { host, port }");
    if (typeof name !== 'string' || name === '') fail("Sentinel needs option 'name', the master group name (e.g. 'mymaster')");
  }
  return { kind: 'options', options: connection as RedisOptions };
}

/**
 * Both options are milliseconds; waiterTimeout reaches Redis (PEXPIRE, a lease's PX), which takes
 * whole milliseconds only, so fractions are rounded up, as the backends do with a lock's ttl.
 */
export function resolveBackendOptions(options: unknown): ResolvedRedisLockBackendOptions {
  const resolved: ResolvedRedisLockBackendOptions = { commandTimeout: 2_000, waiterTimeout: 3_000, localHandoffs: 0 };
  for (const [name, value] of checks.given(options, Object.keys(resolved), '{ commandTimeout: 2000 }')) {
    if (name === 'localHandoffs') {
      if (!Number.isInteger(value) || (value as number) < 0 || (value as number) > 1_000) {
        checks.fail(name, `option 'localHandoffs' must be a whole number from 0 to 1000 (hand-overs in a row), got ${show(value)}.`);
      }
      resolved.localHandoffs = value as number;
    } else {
      resolved[name as 'commandTimeout' | 'waiterTimeout'] = checks.milliseconds(name, value);
    }
  }
  return resolved;
}
