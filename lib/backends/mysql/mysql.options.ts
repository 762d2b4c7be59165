import type { Pool, PoolOptions } from 'mysql2';
import { BackendOptionChecks } from '../backend-options.checks.js';
import { redactUrl, show } from '../../option-value.js';

/**
 * How the backend reaches MySQL or MariaDB:
 * - a `mysql2` pool (`mysql.createPool(...)`, or the promise pool of `mysql2/promise`): used as
 *   is and left open on shutdown, since it is yours;
 * - a connection string (`'mysql://user:password@host:3306/db'`) or `mysql2` pool settings
 *   (`{ host, port, user, password, database, connectionLimit }`): the backend creates the pool on
 *   first use and closes it on shutdown.
 */
export type MysqlLockConnection = Pool | { pool: Pool } | string | PoolOptions;

export interface MysqlLockBackendOptions {
  /**
   * The lock table's name, in the connection's database; its companions take it as a prefix
   * (`<table>_waiters`, `<table>_acquire`, ...). Lower-case letters, digits and `_`, at most 48
   * characters. Default `'distributed_locks'`.
   */
  table?: string;
  /**
   * Create the tables and procedures on first use when they are missing (behind a GET_LOCK, so
   * instances starting together do not race). `false` when your migrations create them: run the
   * statements of `mysqlLockTablesSql()` in one. Default true.
   */
  createTables?: boolean;
  /**
   * Longest wait for the server to answer one lock operation before it counts as failed, in ms.
   * Keeps a paused server or a statement stuck behind another transaction's lock from hanging an
   * acquire or an extension; the service retries within its wait. Default 2 000.
   */
  commandTimeout?: number;
  /**
   * How long a waiter keeps its place in the line of a busy lock without asking again, in ms.
   * Waiters ask on every wake-up and at least every `pollInterval`, so keep it well above that
   * (a LockService whose pollInterval is not below it refuses to start); a waiter that crashed
   * holds up the others for at most this long. Whole ms. Default 3 000.
   */
  waiterTimeout?: number;
  /**
   * How often a process with waiters asks the server, in one statement for all of them, whether
   * a release handed one of them its lock or left a key free for it, in ms. MySQL has no
   * notifications; this is the wake-up. Default 25.
   */
  wakeUpInterval?: number;
}

export interface ResolvedMysqlOptions {
  table: string;
  createTables: boolean;
  commandTimeout: number;
  waiterTimeout: number;
  wakeUpInterval: number;
}

export type CheckedMysqlConnection = { kind: 'pool'; pool: Pool } | { kind: 'config'; config: PoolOptions };

// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks('MysqlLockBackend');

const HOW_TO =
  "Pass a mysql2 pool (mysql.createPool(...)), a connection string ('mysql://user:password@host:3306/db') or pool settings " +
  '({ host, port, user, password, database }).';

/** Checks what the constructor got, with a message that says what to pass instead. */
export function checkMysqlConnection(connection: unknown): CheckedMysqlConnection {
  if (typeof connection === 'string') return { kind: 'config', config: { uri: checkUrl('connection', connection) } };
  if (typeof connection !== 'object' || connection === null || Array.isArray(connection)) {
    return checks.fail('connection', `expected a connection, got ${show(connection)}. ${HOW_TO}`);
  }
  const candidate = connection as Record<string, unknown>;
  // mysql2/promise's pool wraps the callback pool, which the backend uses.
  const inner = candidate.pool as Record<string, unknown> | undefined;
  const pool = typeof inner?.getConnection === 'function' ? inner : candidate;
  if (typeof pool.getConnection === 'function' && typeof pool.query === 'function') {
    if (pool._closed === true) checks.fail('connection', 'the mysql2 pool given is closed (end() was called on it).');
    return { kind: 'pool', pool: pool as unknown as Pool };
  }
  if (typeof candidate.query === 'function') {
    checks.fail(
      'connection',
      'got a single mysql2 connection; lock operations would queue behind each other on it. Pass a pool ' +
        '(mysql.createPool(...)) instead, or a connection string.',
    );
  }
  checks.plainSettings('connection', connection, 'a mysql2 pool', HOW_TO);
  return { kind: 'config', config: checkPoolOptions(candidate) };
}

/** The options with their defaults; times reach the server in whole milliseconds (rounded up). */
export function resolveMysqlOptions(options: unknown): ResolvedMysqlOptions {
  const resolved: ResolvedMysqlOptions = {
    table: 'distributed_locks',
    createTables: true,
    commandTimeout: 2_000,
    waiterTimeout: 3_000,
    wakeUpInterval: 25,
  };
  const example = "{ table: 'distributed_locks', commandTimeout: 2000 }";
  for (const [name, value] of checks.given(options, Object.keys(resolved), example)) {
    switch (name) {
      case 'table':
        if (typeof value !== 'string' || !/^[a-z_][a-z0-9_]*$/.test(value) || value.length > MAX_TABLE_NAME) {
          checks.fail(
            name,
            `option 'table' must be a name of lower-case letters, digits and '_', starting with a letter or '_', at most ` +
              `${MAX_TABLE_NAME} characters, got ${show(value)}. (Table names are case-sensitive on some servers and not on ` +
              `others, so no upper case.)`,
          );
        }
        resolved.table = value;
        break;
      case 'createTables':
        if (typeof value !== 'boolean') checks.fail(name, `option 'createTables' must be true or false, got ${show(value)}.`);
        resolved.createTables = value;
        break;
      default:
        resolved[name as 'commandTimeout' | 'waiterTimeout' | 'wakeUpInterval'] = checks.milliseconds(name, value);
    }
  }
  return resolved;
}

/** The longest companion suffix is `_fencing_tokens` (15); MySQL names have 64 characters. */
const MAX_TABLE_NAME = 48;

function checkUrl(option: string, text: string): string {
  let url: URL | undefined;
  try {
    url = new URL(text);
  } catch {
    checks.fail(option, `'${redactUrl(text)}' is not a URL. ${HOW_TO}`);
  }
  if (url!.protocol !== 'mysql:' && url!.protocol !== 'mariadb:') {
    checks.fail(option, `the connection string must start with mysql:// or mariadb://, got '${url!.protocol}//'.`);
  }
  if (url!.pathname.length <= 1) {
    checks.fail(option, `the connection string '${redactUrl(text)}' names no database: add it as the path (mysql://user@host:3306/db).`);
  }
  // mysql2 reads only mysql:// URLs; a mariadb:// one is the same server protocol.
  return url!.protocol === 'mariadb:' ? `mysql:${text.slice('mariadb:'.length)}` : text;
}

function checkPoolOptions(config: Record<string, unknown>): PoolOptions {
  const { host, port, uri, database } = config;
  let checked = config as PoolOptions;
  if (uri !== undefined) {
    if (typeof uri !== 'string') checks.fail('connection', `'uri' must be a string, got ${show(uri)}.`);
    checked = { ...checked, uri: checkUrl('connection', uri) };
  } else if (typeof database !== 'string' || database === '') {
    checks.fail('connection', `'database' must name the database of the lock tables, got ${show(database)}.`);
  }
  if (host !== undefined && (typeof host !== 'string' || host === '')) {
    checks.fail('connection', `'host' must be a non-empty string, got ${show(host)}.`);
  }
  if (port !== undefined && !(Number.isInteger(port) && (port as number) > 0 && (port as number) < 65_536)) {
    checks.fail('connection', `'port' must be an integer from 1 to 65535, got ${show(port)}.`);
  }
  return checked;
}
