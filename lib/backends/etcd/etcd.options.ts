import type { Etcd3, IOptions } from 'etcd3';
import { BackendOptionChecks } from '../backend-options.checks.js';
import { redactUrl, show } from '../../option-value.js';

/**
 * How the backend reaches etcd:
 * - an `Etcd3` client (the `etcd3` package): used as is and left open on shutdown, since it is yours;
 * - one or more member URLs (`'http://etcd-1:2379'`, or an array of them), or `etcd3` client
 *   settings (`{ hosts, credentials, auth }`): the backend creates the client and closes it on
 *   shutdown.
 */
export type EtcdLockConnection = Etcd3 | string | readonly string[] | IOptions;

export interface EtcdLockBackendOptions {
  /**
   * Where the backend keeps its keys in etcd: every lock entry is `<prefix><key>/<owner>`. Give
   * each application (or tenant) its own when they share a cluster and an ACL role per prefix.
   * Default `'nest-distributed-lock/'`.
   */
  prefix?: string;
  /**
   * Longest wait for etcd to answer one lock operation before it counts as failed, in ms. Keeps a
   * paused member, a partition or a cluster without quorum from hanging an acquire or an extension;
   * the service retries within its wait. Default 2 000.
   */
  commandTimeout?: number;
  /**
   * How long the places in line of a process outlive it, in ms: they sit on a lease that process
   * keeps alive while it has waiters, so a process that died (or lost etcd) holds up the others
   * for at most this long. etcd counts leases in whole seconds: rounded up, and at least the
   * cluster's minimum lease (2 s with etcd's default election timeout). Default 3 000.
   */
  waiterTimeout?: number;
}

export interface ResolvedEtcdOptions {
  prefix: string;
  commandTimeout: number;
  waiterTimeout: number;
}

export type CheckedEtcdConnection = { kind: 'client'; client: Etcd3 } | { kind: 'config'; config: IOptions };

// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks('EtcdLockBackend');

const HOW_TO =
  "Pass an Etcd3 client (new Etcd3({ hosts })), one member URL ('http://etcd:2379'), an array of them, or etcd3 settings ({ hosts: [...] }).";

/**
 * etcd's leases are whole seconds: the ttl rounded up. The server may grant more (its minimum);
 * the lock's own deadline stays the ttl asked, which is never longer than the lease.
 */
export function leaseSeconds(ttlMs: number): number {
  return Math.max(1, Math.ceil(ttlMs / 1000));
}

/** Checks what the constructor got, with a message that says what to pass instead. */
export function checkConnection(connection: unknown): CheckedEtcdConnection {
  if (typeof connection === 'string') return { kind: 'config', config: { hosts: [checkUrl('connection', connection)] } };
  if (Array.isArray(connection)) {
    if (connection.length === 0) checks.fail('connection', `the list of member URLs is empty. ${HOW_TO}`);
    return { kind: 'config', config: { hosts: connection.map((url: unknown) => checkUrl('connection', url)) } };
  }
  if (typeof connection !== 'object' || connection === null) {
    return checks.fail('connection', `expected a connection, got ${show(connection)}. ${HOW_TO}`);
  }
  const candidate = connection as Record<string, unknown>;
  if (typeof candidate.lease === 'function' && typeof candidate.watch === 'function' && typeof candidate.close === 'function') {
    return { kind: 'client', client: connection as Etcd3 };
  }
  checks.plainSettings('connection', connection, 'an Etcd3 client', HOW_TO);
  const hosts = candidate.hosts;
  if (typeof hosts === 'string') checkUrl('connection', hosts);
  else if (Array.isArray(hosts) && hosts.length > 0) hosts.forEach((url: unknown) => checkUrl('connection', url));
  else checks.fail('connection', `settings need 'hosts': a member URL or a non-empty array of them, got ${show(hosts)}. ${HOW_TO}`);
  return { kind: 'config', config: connection as IOptions };
}

/** The options with their defaults; times in whole milliseconds (a fraction is rounded up). */
export function resolveBackendOptions(options: unknown): ResolvedEtcdOptions {
  const resolved: ResolvedEtcdOptions = { prefix: 'nest-distributed-lock/', commandTimeout: 2_000, waiterTimeout: 3_000 };
  for (const [name, value] of checks.given(options, Object.keys(resolved), "{ prefix: 'locks/', commandTimeout: 2000 }")) {
    if (name === 'prefix') {
      if (typeof value !== 'string' || value === '')
        checks.fail(name, `option 'prefix' must be a non-empty string such as 'locks/', got ${show(value)}.`);
      resolved.prefix = value;
    } else {
      resolved[name as 'commandTimeout' | 'waiterTimeout'] = checks.milliseconds(name, value);
    }
  }
  return resolved;
}

function checkUrl(option: string, value: unknown): string {
  if (typeof value !== 'string') return checks.fail(option, `a member URL must be a string, got ${show(value)}. ${HOW_TO}`);
  let url: URL | undefined;
  try {
    url = new URL(value);
  } catch {
    checks.fail(option, `'${redactUrl(value)}' is not a URL. ${HOW_TO}`);
  }
  if (url!.protocol !== 'http:' && url!.protocol !== 'https:') {
    checks.fail(option, `a member URL must start with http:// or https://, got '${url!.protocol}//'. ${HOW_TO}`);
  }
  if (url!.username || url!.password || /[?&]password=/i.test(url!.search)) {
    checks.fail(option, `etcd takes no credentials in its URL: pass { hosts, auth: { username, password } } instead.`);
  }
  return value;
}
