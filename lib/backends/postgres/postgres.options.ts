import type { ClientConfig, Pool, PoolConfig } from 'pg';
import { BackendOptionChecks } from '../backend-options.checks.js';
import { redactUrl, show } from '../../option-value.js';

/**
 * How the backend reaches PostgreSQL:
 * - a `pg.Pool`: used as is and left open on shutdown, since it is yours;
 * - a connection string (`'postgres://user:password@host:5432/db'`) or `pg.Pool` settings
 *   (`{ host, port, user, database, max }`): the backend creates the pool on first use and closes
 *   it on shutdown.
 */
export type PostgresLockConnection = Pool | string | PoolConfig;

export interface PostgresLockBackendOptions {
  /** The PostgreSQL schema (namespace) of the lock tables. Default `'public'`. */
  schema?: string;
  /**
   * The lock table's name; its companions take it as a prefix (`<table>_waiters`,
   * `<table>_acquire`, ...). Lower-case letters, digits and `_`, at most 48 characters. Default
   * `'distributed_locks'`.
   */
  table?: string;
  /**
   * Create the tables, sequences and functions on first use when they are missing (behind an
   * advisory lock, so instances starting together do not race). `false` when your migrations
   * create them: run the SQL of `postgresLockTablesSql()` in one. Default true.
   */
  createTables?: boolean;
  /**
   * The connection that LISTENs for releases, so a waiter wakes when the lock is released instead
   * of polling. Default: the pool's own settings, on a connection of its own. Give a direct
   * connection string (or client settings) when the pool goes through a pooler in transaction
   * mode (pgbouncer, RDS Proxy), where LISTEN delivers nothing; `false` to poll. When LISTEN
   * delivers nothing, the backend logs a warning once and its waiters poll.
   */
  listenConnection?: string | ClientConfig | false;
  /**
   * Longest wait for PostgreSQL to answer one lock operation before it counts as failed, in ms.
   * Keeps a paused server or a statement stuck behind another transaction's lock from hanging an
   * acquire or an extension; the service retries within its wait. Default 2 000.
   */
  commandTimeout?: number;
  /**
   * How long a waiter keeps its place in the line of a busy lock without asking again, in ms.
   * Waiters ask on every release and at least every `pollInterval`, so keep it well above that
   * (a LockService whose pollInterval is not below it refuses to start); a waiter that crashed
   * holds up the others for at most this long. Whole ms (a fraction is rounded up). Default 3 000.
   */
  waiterTimeout?: number;
}

export interface ResolvedPostgresOptions {
  schema: string;
  table: string;
  createTables: boolean;
  /** undefined: the pool's own settings. */
  listenConnection: string | ClientConfig | false | undefined;
  commandTimeout: number;
  waiterTimeout: number;
}

export type CheckedConnection = { kind: 'pool'; pool: Pool } | { kind: 'config'; config: PoolConfig };

// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks('PostgresLockBackend');

const HOW_TO =
  "Pass a pg.Pool (new Pool(...)), a connection string ('postgres://user:password@host:5432/db') or pool settings ({ host, port, user, database }).";

/** Checks what the constructor got, with a message that says what to pass instead. */
export function checkConnection(connection: unknown): CheckedConnection {
  if (typeof connection === 'string') return { kind: 'config', config: { connectionString: checkUrl('connection', connection) } };
  if (typeof connection !== 'object' || connection === null || Array.isArray(connection)) {
    return checks.fail('connection', `expected a connection, got ${show(connection)}. ${HOW_TO}`);
  }
  const candidate = connection as Record<string, unknown>;
  if (typeof candidate.query === 'function' && typeof candidate.connect === 'function') {
    if (!('totalCount' in candidate)) {
      checks.fail(
        'connection',
        `got a single pg.Client; lock operations would queue behind each other on its one connection. ` +
          `Pass a pg.Pool (new Pool(...)) instead, or a connection string.`,
      );
    }
    if (candidate.ending === true || candidate.ended === true)
      checks.fail('connection', 'the pg.Pool given is closed (end() was called on it).');
    return { kind: 'pool', pool: connection as Pool };
  }
  checks.plainSettings('connection', connection, 'a pg.Pool', HOW_TO);
  checkClientConfig('connection', candidate);
  return { kind: 'config', config: connection as PoolConfig };
}

/**
 * The options with their defaults; `waiterTimeout` reaches PostgreSQL, which is told whole
 * milliseconds here, so a fraction is rounded up, as the service does with a lock's ttl.
 */
export function resolveBackendOptions(options: unknown): ResolvedPostgresOptions {
  const resolved: ResolvedPostgresOptions = {
    schema: 'public',
    table: 'distributed_locks',
    createTables: true,
    listenConnection: undefined,
    commandTimeout: 2_000,
    waiterTimeout: 3_000,
  };
  const example = "{ table: 'distributed_locks', commandTimeout: 2000 }";
  for (const [name, value] of checks.given(options, Object.keys(resolved), example)) {
    switch (name) {
      case 'schema':
        resolved.schema = checkIdentifier(name, value, 63);
        break;
      case 'table':
        resolved.table = checkIdentifier(name, value, MAX_TABLE_NAME);
        break;
      case 'createTables':
        if (typeof value !== 'boolean') checks.fail(name, `option 'createTables' must be true or false, got ${show(value)}.`);
        resolved.createTables = value;
        break;
      case 'listenConnection':
        resolved.listenConnection = checkListenConnection(value);
        break;
      default:
        resolved[name as 'commandTimeout' | 'waiterTimeout'] = checks.milliseconds(name, value);
    }
  }
  return resolved;
}

/** The longest companion suffix is `_fencing_tokens` (15); PostgreSQL names have 63 bytes. */
const MAX_TABLE_NAME = 48;

function checkIdentifier(option: string, value: unknown, max: number): string {
  if (typeof value !== 'string' || !/^[a-z_][a-z0-9_]*$/.test(value) || value.length > max) {
    checks.fail(
      option,
      `option '${option}' must be a PostgreSQL name of lower-case letters, digits and '_', starting with a letter or '_', ` +
        `at most ${max} characters, got ${show(value)}. (Names are used unquoted in your own SQL too, so no upper case.)`,
    );
  }
  return value;
}

function checkListenConnection(value: unknown): string | ClientConfig | false {
  if (value === false) return false;
  if (typeof value === 'string') return checkUrl('listenConnection', value);
  if (typeof value !== 'object' || value === null || Array.isArray(value) || Object.getPrototypeOf(value) !== Object.prototype) {
    checks.fail(
      'listenConnection',
      `option 'listenConnection' must be a connection string, client settings ({ host, port, ... }) or false, got ${show(value)}.`,
    );
  }
  checkClientConfig('listenConnection', value as Record<string, unknown>);
  return value as ClientConfig;
}

function checkUrl(option: string, text: string): string {
  let url: URL | undefined;
  try {
    url = new URL(text);
  } catch {
    checks.fail(option, `'${redactUrl(text)}' is not a URL. ${HOW_TO}`);
  }
  if (url!.protocol !== 'postgres:' && url!.protocol !== 'postgresql:') {
    checks.fail(option, `the connection string must start with postgres:// or postgresql://, got '${url!.protocol}//'.`);
  }
  return text;
}

function checkClientConfig(option: string, config: Record<string, unknown>): void {
  const { host, port, connectionString } = config;
  if (connectionString !== undefined) {
    if (typeof connectionString !== 'string') checks.fail(option, `'connectionString' must be a string, got ${show(connectionString)}.`);
    checkUrl(option, connectionString);
  }
  if (host !== undefined && (typeof host !== 'string' || host === ''))
    checks.fail(option, `'host' must be a non-empty string, got ${show(host)}.`);
  if (port !== undefined && !(Number.isInteger(port) && (port as number) > 0 && (port as number) < 65_536)) {
    checks.fail(option, `'port' must be an integer from 1 to 65535, got ${show(port)}.`);
  }
}
