import { Logger } from '@nestjs/common';
import type { Connection, Pool, PoolOptions } from 'mysql2';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import { CommandDeadlines, GIVE_UP_CONNECTION_AFTER_MS, giveUpLater, type Seat } from '../command-deadlines.js';
import {
  errnoOf,
  isReadOnly,
  isRetryable,
  NO_SUCH_PROCEDURE,
  permanentCause,
  READ_ONLY_NOTE,
  READ_ONLY_SERVER,
  serverError,
  type MysqlIdentity,
} from './mysql.errors.js';
import type { CheckedMysqlConnection, ResolvedMysqlOptions } from './mysql.options.js';
import { procedureNames } from './mysql.procedures.js';
import {
  lockNames,
  mysqlLockTablesSql,
  mysqlSchemaLayout,
  MYSQL_SCHEMA_LAYOUT,
  MYSQL_PROCEDURES_REVISION,
  MYSQL_SCHEMA_VERSION,
  newerMysqlLayoutRefusal,
  type MysqlLockNames,
} from './mysql.schema.js';
import { sentence } from '../backend-message.js';
import { withTimeout } from '../bounded-wait.js';
import { InFlight } from '../in-flight.js';

const logger = new Logger('DistributedLock');

/** One statement the backend sends: what it is for (for errors) and the SQL. */
export interface MysqlStatement {
  /** The operation and the lock keys it is for, as error messages name them. */
  op: string;
  keys: readonly string[];
  sql: string;
  values: readonly unknown[];
  /** The answer that came after the statement was reported as failed (timed out); what it returns (the release it starts) is waited for by close(). */
  onLateAnswer?: (rows: Record<string, unknown>[]) => unknown;
  /**
   * It failed after it was reported as failed, in a way that does not say whether the server ran
   * it (its connection lost, or given up): treated as a late answer that may have won. Waited for
   * by close() too.
   */
  onLateDoubt?: () => unknown;
}

/**
 * The MySQL backend's pool: the user's, left open, or one it creates on first use and closes on
 * application shutdown. Makes sure the lock tables exist before the first statement, bounds every
 * statement by the command timeout, and sends again, within that time, a call InnoDB rolled back
 * for a deadlock or a lock wait timeout (nothing of it was applied).
 */
export class MysqlConnection {
  readonly names: MysqlLockNames;
  private readonly owned: boolean;
  private pool: Pool | undefined;
  /** The settings of the pool the backend created: a connection of its own asks about its sessions (sessionBusy()). */
  private probeSettings: PoolOptions | undefined;
  private readonly mysql: Mysql2Package | undefined;
  /** Resolves once the lock tables are there; reset after a failure, so the next call tries again. */
  private tables: Promise<void> | undefined;
  private tablesReady = false;
  private readonly deadlines: CommandDeadlines;
  private stopped = false;
  /** The pool ended (closePool()). */
  private ended = false;
  private readonly requests = new InFlight();
  /** Called after each statement answered in time: the server is reachable (see FailedReleases). */
  onAnswer: (() => void) | undefined;

  constructor(
    private readonly connection: CheckedMysqlConnection,
    private readonly options: ResolvedMysqlOptions,
    /** The backend's name, for errors. */
    private readonly backendName: string,
  ) {
    this.names = lockNames(options.table);
    this.deadlines = new CommandDeadlines(options.commandTimeout);
    this.owned = connection.kind === 'config';
    if (connection.kind === 'pool') this.pool = connection.pool;
    else this.mysql = loadMysql2();
  }

  get closed(): boolean {
    return this.stopped;
  }

  /**
   * Runs one statement, bounded by the command timeout, and returns the rows of its first result
   * set; failures become a LockBackendError that names the operation and the keys.
   */
  run(statement: MysqlStatement): Promise<Record<string, unknown>[]> {
    if (this.refuses(statement.op)) return Promise.reject(this.closedError(statement.op, statement.keys));
    return new Promise((resolve, reject) => {
      let expired = false;
      const seat: Seat = {};
      const command = this.deadlines.track(() => {
        expired = true;
        giveUpLater(seat);
        reject(
          this.failure(
            statement,
            new Error(
              `the server did not answer within ${this.options.commandTimeout} ms (commandTimeout); is it paused, overloaded, ` +
                `or is the statement waiting for a lock another transaction holds on the lock table?`,
            ),
          ),
        );
      });
      const send = async (): Promise<Record<string, unknown>[]> => {
        if (!this.tablesReady) await this.ensureTables();
        for (;;) {
          try {
            return await this.query(statement.sql, statement.values, seat);
          } catch (error) {
            // Rolled back whole by the procedure's handler: sent again while the caller still waits.
            if (!isRetryable(error) || expired || this.refuses(statement.op)) throw error;
          }
        }
      };
      // Until its answer is handled: a late one starts a release, which close() waits for too.
      this.requests.track(
        send().then(
          (rows) => {
            if (!this.deadlines.answered(command)) return statement.onLateAnswer?.(rows);
            resolve(rows);
            this.onAnswer?.();
          },
          (error: unknown) => {
            // A procedure dropped behind our back (or made again by a newer version): look again next time.
            if (errnoOf(error) === NO_SUCH_PROCEDURE) {
              this.tablesReady = false;
              this.tables = undefined;
            }
            if (this.deadlines.answered(command)) return reject(error instanceof LockBackendError ? error : this.failure(statement, error));
            if (leavesDoubt(error)) return statement.onLateDoubt?.();
          },
        ),
      );
    });
  }

  /** Refuses statements other than releases from now on; false if it was already closed. */
  stop(): boolean {
    if (this.stopped) return false;
    this.stopped = true;
    return true;
  }

  /**
   * Resolves once the statements under way are answered, and the releases those answers started
   * (a kept release sent again, a late win given back), or after the command timeout: ending the
   * pool first would cut them off. Releases still go out after stop() until then.
   */
  requestsSettled(): Promise<void> {
    return this.requests.settled(this.options.commandTimeout);
  }

  /** Ends the pool if the backend created it (after stop() and requestsSettled()). */
  async closePool(): Promise<void> {
    this.ended = true;
    if (!this.owned || !this.pool) return;
    const pool = this.pool;
    // end() waits for connections in use: one stuck on a paused server would hold up the shutdown.
    await withTimeout(new Promise<void>((resolve) => pool.end(() => resolve())), 1_000);
  }

  /** Closed: nothing goes out once the pool ends, and only releases once stop() was called. */
  private refuses(op: string): boolean {
    return this.ended || (this.stopped && op !== 'release');
  }

  closedError(op: string, keys: readonly string[]): LockBackendError {
    return new LockBackendError(
      this.backendName,
      `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: the backend is closed (the application shut down).`,
    );
  }

  failure({ op, keys }: { op: string; keys: readonly string[] }, error: unknown): LockBackendError {
    const message = sentence(error instanceof Error ? error.message || String(error) : String(error));
    const cause = permanentCause(error, this.names, this.identity());
    const note = !cause && errnoOf(error) === READ_ONLY_SERVER ? ` ${READ_ONLY_NOTE}` : '';
    return new LockBackendError(
      this.backendName,
      `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: ${message}${note}${cause ? ` ${cause}` : ''}`,
      serverError(error),
      { permanent: cause !== undefined },
    );
  }

  /** The user and database the settings name, for fixes (never the password). */
  identity(): MysqlIdentity {
    const settings = (this.connection.kind === 'pool' ? poolConfig(this.connection.pool) : this.connection.config) ?? {};
    let user = settings.user;
    let database = settings.database;
    if (typeof settings.uri === 'string') {
      try {
        const url = new URL(settings.uri);
        user ??= url.username ? decodeURIComponent(url.username) : undefined;
        database ??= url.pathname.length > 1 ? decodeURIComponent(url.pathname.slice(1)) : undefined;
      } catch {
        // Checked at construction; a pool of the app's own may hold anything.
      }
    }
    return { user: typeof user === 'string' ? user : undefined, database: typeof database === 'string' ? database : undefined };
  }

  /**
   * One statement on a connection of the pool. Rows come back as objects whatever the pool's own
   * settings (rowsAsArray, nestTables); a CALL answers with its result set first.
   */
  query(sql: string, values: readonly unknown[] = [], seat: Seat = {}): Promise<Record<string, unknown>[]> {
    const pool = this.openPool();
    return new Promise((resolve, reject) => {
      pool.getConnection((error, connection) => {
        if (error) return reject(error);
        // As pool.query() does, on a connection `seat` can give up. Given back once, answered or
        // given up: closed rather than reused when its answer never came, or when the server said
        // it is read-only (a demoted primary), so the pool opens another.
        let done = false;
        const giveBack = (close: boolean): boolean => {
          if (done) return false;
          done = true;
          if (close) connection.destroy();
          else connection.release();
          return true;
        };
        // Unless its session is still at work on the server (waiting behind another transaction's
        // lock), which a client-side close would not stop, and the pool would open more beside it.
        seat.giveUp = () => {
          if (done) return;
          void this.sessionBusy(connection.threadId).then((busy) => {
            if (busy) giveUpLater(seat);
            else if (giveBack(true)) reject(new Error(`no answer ${GIVE_UP_CONNECTION_AFTER_MS} ms after the command timeout`));
          });
        };
        connection.query(
          { sql, values: values as unknown[], rowsAsArray: false, nestTables: false } as never,
          (error: unknown, result: unknown) => {
            if (!giveBack(error !== null && isReadOnly(error))) return;
            if (error) return reject(error);
            const rows = Array.isArray(result) && Array.isArray(result[0]) ? result[0] : result;
            resolve(Array.isArray(rows) ? (rows as Record<string, unknown>[]) : []);
          },
        );
      });
    });
  }

  /**
   * Whether the server session behind a pooled connection is still running a statement, asked on
   * a connection of its own; false when that cannot be told within the command timeout (the
   * server unreachable on that path too), or with the app's own pool, whose settings it cannot copy.
   */
  private async sessionBusy(threadId: number | null): Promise<boolean> {
    // Closed: no new connection; the pool has ended or is ending.
    if (threadId === null || this.probeSettings === undefined || this.stopped) return false;
    const probe = this.mysql!.createConnection(this.probeSettings);
    probe.on('error', () => undefined);
    const asked = new Promise<boolean>((resolve) =>
      probe.query('SELECT COMMAND AS command FROM information_schema.PROCESSLIST WHERE ID = ?', [threadId], (error, rows) =>
        resolve(!error && (rows as { command?: string }[])[0]?.command === 'Query'),
      ),
    );
    const busy = (await withTimeout(asked, this.options.commandTimeout)) ?? false;
    probe.destroy();
    return busy;
  }

  private openPool(): Pool {
    if (this.pool) return this.pool;
    const config = (this.connection as { config: PoolOptions }).config;
    const { uri, ...rest } = config;
    const settings: PoolOptions = {
      connectTimeout: this.options.commandTimeout,
      enableKeepAlive: true,
      charset: 'utf8mb4',
      ...rest,
    };
    const pool = uri === undefined ? this.mysql!.createPool(settings) : this.mysql!.createPool({ ...settings, uri });
    this.probeSettings = uri === undefined ? settings : { ...settings, uri };
    let down = false;
    // Errors of idle connections (a server restart): without a listener they would crash the process.
    pool.on('connection', (connection) => {
      connection.on('error', (error: Error) => {
        if (!down) logger.warn(`MySQL connection failed: ${sentence(error.message)} Lock operations fail until it is back.`);
        down = true;
      });
      if (down) logger.log('MySQL connection is back.');
      down = false;
    });
    this.pool = pool;
    return pool;
  }

  private ensureTables(): Promise<void> {
    this.tables ??= this.createTables().then(
      () => void (this.tablesReady = true),
      (error: unknown) => {
        this.tables = undefined;
        throw error;
      },
    );
    return this.tables;
  }

  /**
   * The lock tables at the version this code expects, created or brought up from an earlier one if
   * need be (when allowed), and refused when a newer release made them. Instances that start
   * together take turns on a GET_LOCK; the first creates, the others find them there.
   */
  private async createTables(): Promise<void> {
    const { table, createTables } = this.options;
    // The version is the holders table's comment; the key table's tells whether an earlier layout is
    // there; the waiters table's, the revision of the procedures (see MYSQL_PROCEDURES_REVISION).
    // And how many of this release's procedures are there: one dropped by hand is made again.
    const procedures = procedureNames(this.names);
    const versionSql =
      'SELECT MAX(IF(TABLE_NAME = ?, TABLE_COMMENT, NULL)) AS version, MAX(TABLE_NAME = ?) AS earlier, ' +
      'MAX(IF(TABLE_NAME = ?, TABLE_COMMENT, NULL)) AS revision, ' +
      `(SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' ` +
      `AND ROUTINE_NAME IN (${procedures.map(() => '?').join(', ')})) AS procedures ` +
      'FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?, ?)';
    const versionValues = [`${table}_holders`, table, `${table}_waiters`, ...procedures, `${table}_holders`, table, `${table}_waiters`];
    const complete = (found: Found | undefined): boolean => Number(found?.procedures) === procedures.length;
    const check = (found: Found | undefined): boolean => {
      if (found?.version === MYSQL_SCHEMA_VERSION && found.revision === MYSQL_PROCEDURES_REVISION && complete(found)) return true;
      const newer = newerMysqlLayoutRefusal(found?.version, table);
      if (newer) throw new LockBackendError(this.backendName, newer, undefined, { permanent: true });
      return false;
    };
    if (check((await this.query(versionSql, versionValues))[0])) return;
    if (!createTables) {
      const [found] = await this.query(versionSql, versionValues);
      const layout = mysqlSchemaLayout(found?.version) ?? (Number(found?.earlier) === 1 ? 1 : undefined);
      const now =
        found?.version === MYSQL_SCHEMA_VERSION
          ? found.revision === MYSQL_PROCEDURES_REVISION
            ? `is at version ${MYSQL_SCHEMA_LAYOUT} with procedures missing (of ${procedures.join(', ')})`
            : `is at version ${MYSQL_SCHEMA_LAYOUT} with procedures of an earlier release (not '${MYSQL_PROCEDURES_REVISION}')`
          : layout === undefined
            ? 'is missing'
            : `is at version ${layout}`;
      throw new LockBackendError(
        this.backendName,
        `the lock table ${table} (version '${MYSQL_SCHEMA_VERSION}') ${now} ` +
          `and createTables is false: run the statements of mysqlLockTablesSql({ table: '${table}' }) in a migration, or leave ` +
          `createTables on.`,
        undefined,
        { permanent: true },
      );
    }
    const pool = this.openPool();
    const connection = await new Promise<PoolConnectionLike>((resolve, reject) =>
      pool.getConnection((error, got) => (error ? reject(error) : resolve(got as unknown as PoolConnectionLike))),
    );
    const on = (sql: string, values: unknown[] = []) =>
      new Promise<unknown>((resolve, reject) => connection.query(sql, values, (error, rows) => (error ? reject(error) : resolve(rows))));
    try {
      await on('SELECT GET_LOCK(SHA1(CONCAT(DATABASE(), ?)), 30)', [`:nest-distributed-lock:create:${table}`]);
      try {
        // Asked again on this connection: a pool of one connection has no other to give.
        const [found] = (await on(versionSql, versionValues)) as Found[];
        if (!check(found)) for (const sql of mysqlLockTablesSql({ table })) await on(sql);
      } finally {
        await on('SELECT RELEASE_LOCK(SHA1(CONCAT(DATABASE(), ?)))', [`:nest-distributed-lock:create:${table}`]).catch(() => undefined);
      }
    } catch (error) {
      if (error instanceof LockBackendError) throw error;
      const cause = permanentCause(error, this.names, this.identity());
      throw new LockBackendError(
        this.backendName,
        `could not create the lock table ${table}: ${sentence(error instanceof Error ? error.message : String(error))}` +
          (cause ? ` ${cause}` : ''),
        serverError(error),
        { permanent: cause !== undefined },
      );
    } finally {
      connection.release();
    }
  }
}

/** What createTables reads of the tables' comments (see versionSql). */
interface Found {
  version?: unknown;
  earlier?: unknown;
  revision?: unknown;
  procedures?: unknown;
}

interface PoolConnectionLike {
  query(sql: string, values: unknown[], callback: (error: unknown, rows: unknown) => void): void;
  release(): void;
}

type Mysql2Package = { createPool(config: PoolOptions): Pool; createConnection(config: PoolOptions): Connection };

/** The settings a mysql2 pool was made with (its own field; not in the typings). */
function poolConfig(pool: Pool): PoolOptions | undefined {
  return (pool as unknown as { config?: { connectionConfig?: PoolOptions } }).config?.connectionConfig;
}

/**
 * mysql2 is an optional peer, needed only when the backend creates its pool: loaded then, at
 * construction, so a missing package stops the application at start-up, not at its first lock.
 */
function loadMysql2(): Mysql2Package {
  try {
    return requirePeer('mysql2') as Mysql2Package;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'connection',
      `MysqlLockBackend needs the 'mysql2' package to connect to MySQL or MariaDB: npm install mysql2, or pass a mysql2 pool ` +
        `you created (${error instanceof Error ? error.message : String(error)})`,
    );
  }
}

/**
 * Whether a statement's failure leaves open whether the server ran it: its connection was lost or
 * given up, where an error of the server's own (an errno) says the procedure rolled back.
 */
function leavesDoubt(error: unknown): boolean {
  // Ours (the tables refused): the statement was never sent.
  if (error instanceof LockBackendError) return false;
  return typeof errnoOf(error) !== 'number';
}
