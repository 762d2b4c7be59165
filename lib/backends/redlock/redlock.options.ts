import { Logger } from '@nestjs/common';
import { MAX_TIMER_MS } from '../../distributed-lock.options.js';
import { BackendOptionChecks } from '../backend-options.checks.js';
import { redactUrl } from '../../option-value.js';
import type { RedlockMasterClient } from './redlock-master.js';

/** Options of `new RedlockLockBackend(...)`; every field but `clients` has a default. */
export interface RedlockLockBackendOptions {
  /**
   * One entry per independent Redis master (3 or 5; not replicas of each other, not a Cluster):
   * an ioredis client, which stays yours (never closed by the backend), or a `redis://` URL, for
   * which the backend opens a client and closes it on application shutdown.
   */
  clients: readonly (RedlockMasterClient | string)[];
  /**
   * Masters that must agree for a lock, extension or release to count. Default: a majority,
   * `floor(n / 2) + 1`. Raising it (n/2 + 2) trades availability for safety against masters
   * that restart without persistence; it can never be a minority (two owners could both win).
   */
  quorum?: number;
  /**
   * Clock drift allowed between masters and this process, as a fraction of the ttl. The lease the
   * handle reports is shortened by `ttl * driftFactor + 2 ms`. Default 0.01 (redlock's default).
   */
  driftFactor?: number;
  /**
   * How long one request to one master may take before it counts as a failed vote, in ms. Keep it
   * small next to the ttl: a dead or frozen master must cost an attempt this much, not a hang.
   * Default 250.
   */
  masterTimeout?: number;
  /**
   * How long `watch()` waits for a quorum of masters to confirm its subscription before it lets
   * the waiter go on with polling only, in ms. Default: `masterTimeout`.
   */
  subscribeTimeout?: number;
  /** Pub/sub channel prefix for release notifications. Default `'lock-released:'`. */
  channelPrefix?: string;
}

export interface ResolvedRedlockOptions {
  clients: readonly RedlockMasterClient[];
  /** The clients opened here from URLs: closed with the backend. */
  owned: readonly RedlockMasterClient[];
  quorum: number;
  driftFactor: number;
  masterTimeout: number;
  subscribeTimeout: number;
  channelPrefix: string;
}

const logger = new Logger('DistributedLock');

const where = 'RedlockLockBackend';
// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks(where);

const KNOWN = ['clients', 'quorum', 'driftFactor', 'masterTimeout', 'subscribeTimeout', 'channelPrefix'];

function isClient(value: unknown): value is RedlockMasterClient {
  return (
    typeof value === 'object' &&
    value !== null &&
    ['evalsha', 'eval', 'duplicate'].every((m) => typeof (value as Record<string, unknown>)[m] === 'function')
  );
}

/** Where a client points, to refuse one server counted twice. */
export function describeMaster(client: RedlockMasterClient): string {
  const { host, port, path } = client.options ?? {};
  if (path) return path;
  return `${host ?? 'localhost'}:${port ?? 6379}`;
}

/**
 * Checks the options (or a bare client array) and fills in the defaults. URLs become clients
 * through `open`, lazily connected, so a failed check leaves no connection behind.
 */
export function resolveRedlockOptions(
  input: readonly (RedlockMasterClient | string)[] | RedlockLockBackendOptions,
  open: (url: string) => RedlockMasterClient,
): ResolvedRedlockOptions {
  const options: RedlockLockBackendOptions = Array.isArray(input) ? { clients: input } : (input as RedlockLockBackendOptions);
  if (typeof options !== 'object' || options === null) {
    checks.fail(
      '(options)',
      `pass an array of ioredis clients (one per master) or { clients, quorum?, driftFactor?, ... }, got ${String(input)}.`,
    );
  }
  for (const name of Object.keys(options)) checks.known(name, KNOWN);

  const entries = options.clients;
  if (!Array.isArray(entries))
    checks.fail('clients', 'option `clients` must be an array of ioredis clients or redis:// URLs, one per independent Redis master.');
  entries.forEach((entry, i) => {
    if (typeof entry === 'string' && !/^rediss?:\/\//.test(entry)) {
      const written = redactUrl(entry);
      checks.fail(
        'clients',
        entry.includes('://')
          ? `clients[${i}] is '${written}': a master's URL must start with redis:// or rediss://.`
          : `clients[${i}] is '${written}', which has no scheme: write it as 'redis://${written}' ('rediss://' for TLS).`,
      );
    }
    if (typeof entry !== 'string' && !isClient(entry)) {
      checks.fail(
        'clients',
        `clients[${i}] is neither an ioredis client (it needs evalsha, eval and duplicate) nor a redis:// URL. Pass \`new Redis(url)\` or the URL for each master.`,
      );
    }
  });
  if (entries.length < 3) {
    checks.fail(
      'clients',
      `Redlock needs at least 3 independent masters, got ${entries.length}. With fewer, losing one master stops every lock ` +
        `(2 masters need both) or loses them all (1 master), and a single Redis gains nothing from a quorum: ` +
        `use 3 or 5 masters, or the Redis backend for one instance (it also gives fencing tokens).`,
    );
  }
  const owned: RedlockMasterClient[] = [];
  const clients = entries.map((entry) => {
    if (typeof entry !== 'string') return entry;
    const client = open(entry);
    owned.push(client);
    return client;
  });
  const seen = new Map<unknown, number>();
  const addresses = new Map<string, number>();
  clients.forEach((client, i) => {
    if (seen.has(client))
      checks.fail('clients', `clients[${i}] is the same client object as clients[${seen.get(client)}]: each master must be counted once.`);
    seen.set(client, i);
    const address = describeMaster(client);
    if (addresses.has(address)) {
      checks.fail(
        'clients',
        `clients[${i}] and clients[${addresses.get(address)}] both point at ${address}: one server would vote twice, and a quorum would not mean a majority of servers.`,
      );
    }
    addresses.set(address, i);
  });

  const n = clients.length;
  const majority = Math.floor(n / 2) + 1;
  const quorum = options.quorum ?? majority;
  if (!Number.isInteger(quorum) || quorum < majority || quorum > n) {
    checks.fail(
      'quorum',
      `option 'quorum' must be an integer from ${majority} (a majority of ${n} masters) to ${n}, got ${String(quorum)}. A minority quorum lets two owners hold the same lock.`,
    );
  }
  if (n % 2 === 0 && options.quorum === undefined) {
    logger.warn(
      `${where}: ${n} masters (an even count) tolerate no more failed masters than ${n - 1} would, at the cost of one more ` +
        `round trip per lock. Prefer an odd count (3 or 5).`,
    );
  }

  const driftFactor = options.driftFactor ?? 0.01;
  if (typeof driftFactor !== 'number' || !Number.isFinite(driftFactor) || driftFactor < 0 || driftFactor >= 0.5) {
    checks.fail(
      'driftFactor',
      `option 'driftFactor' must be a number from 0 to below 0.5 (a fraction of the ttl; 0.01 is usual), got ${String(driftFactor)}.`,
    );
  }
  const masterTimeout = options.masterTimeout ?? 250;
  // Both are timers only; a lock's ttl is what reaches Redis, and the backend rounds it up.
  if (typeof masterTimeout !== 'number' || !Number.isFinite(masterTimeout) || masterTimeout <= 0 || masterTimeout > MAX_TIMER_MS) {
    checks.fail(
      'masterTimeout',
      `option 'masterTimeout' must be a positive number of milliseconds, got ${String(masterTimeout)}. At most ${MAX_TIMER_MS} (about 24.8 days).`,
    );
  }
  const subscribeTimeout = options.subscribeTimeout ?? masterTimeout;
  if (
    typeof subscribeTimeout !== 'number' ||
    !Number.isFinite(subscribeTimeout) ||
    subscribeTimeout <= 0 ||
    subscribeTimeout > MAX_TIMER_MS
  ) {
    checks.fail(
      'subscribeTimeout',
      `option 'subscribeTimeout' must be a positive number of milliseconds, got ${String(subscribeTimeout)}. At most ${MAX_TIMER_MS} (about 24.8 days).`,
    );
  }
  const channelPrefix = options.channelPrefix ?? 'lock-released:';
  if (typeof channelPrefix !== 'string')
    checks.fail('channelPrefix', `option 'channelPrefix' must be a string, got ${String(channelPrefix)}.`);

  return { clients, owned, quorum, driftFactor, masterTimeout, subscribeTimeout, channelPrefix };
}
