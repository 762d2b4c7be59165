import { FUNCTIONS_REVISION } from './postgres.functions.js';
import { Logger } from '@nestjs/common';
import type { Client, ClientConfig, Pool, PoolConfig } from 'pg';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import { CommandDeadlines, GIVE_UP_CONNECTION_AFTER_MS, giveUpLater, type Seat } from '../command-deadlines.js';
import { PoolStarvationWatch } from './postgres.pool-watch.js';
import { PreparedStatements, type QueryConfig } from './postgres.prepared.js';
import {
  createTablesFix,
  IN_RECOVERY_NOTE,
  permanentCause,
  READ_ONLY_SQL_TRANSACTION,
  type ConnectionIdentity,
} from './postgres.errors.js';
import type { CheckedConnection, ResolvedPostgresOptions } from './postgres.options.js';
import {
  acquireSignature,
  lockNames,
  newerLayoutRefusal,
  postgresLockTablesSql,
  IDENTITY_COLUMN,
  SCHEMA_LAYOUT,
  SCHEMA_VERSION,
  schemaLayout,
  type PostgresLockNames,
} from './postgres.schema.js';
import { sentence } from '../backend-message.js';
import { withTimeout } from '../bounded-wait.js';
import { InFlight } from '../in-flight.js';

const logger = new Logger('DistributedLock');

/** What createTables finds of tables at this version made by a release before IDENTITY_COLUMN. */
const WITHOUT_IDENTITY = 'version 4 without the columns of who holds';

/** What createTables finds of tables at this version whose functions are of an earlier revision. */
const OLDER_FUNCTIONS = 'version 4 with functions of an earlier revision';

/**
 * For pools the backend creates: TCP keep-alive, so a connection to a server that vanished is
 * found. (Connecting is also bounded by the command timeout below: pg waits forever by default.)
 */
const CREATED_POOL_DEFAULTS = { keepAlive: true } satisfies PoolConfig;

/** One statement the backend sends: what it is for (for errors) and the SQL. */
export interface Statement {
  /** The operation and the lock keys it is for, as error messages name them. */
  op: string;
  keys: readonly string[];
  text: string;
  values: readonly unknown[];
  /** Sent as a named prepared statement (see PreparedStatements): the lock operations. */
  prepared?: boolean;
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
 * The PostgreSQL backend's pool: the user's, left open, or one it creates on first use and closes
 * on application shutdown. Makes sure the lock tables exist before the first statement, and bounds
 * every statement by the command timeout.
 */
export class PostgresConnection {
  readonly names: PostgresLockNames;
  private readonly owned: boolean;
  /** The pg package, loaded when the backend must create its pool or its LISTEN connection. */
  private readonly pg: PgPackage | undefined;
  private pool: Pool | undefined;
  /** Resolves once the lock tables are there; reset after a failure, so the next call tries again. */
  private tables: Promise<void> | undefined;
  private tablesReady = false;
  private readonly deadlines: CommandDeadlines;
  private stopped = false;
  /** The pool ended (closePool()). */
  private ended = false;
  private readonly requests = new InFlight();
  /** The last connection error of a pool we created, to say why an operation failed. */
  private lastError: Error | undefined;
  /** For the app's own pool: warns when lock statements wait long for one of its connections. */
  private readonly poolWatch: PoolStarvationWatch | undefined;
  /** For read-only errors (25006): whether the server said it was in recovery (see readOnlyCheck()). */
  private readonly recovery = new WeakMap<object, boolean | undefined>();
  /** Called after each statement answered in time: PostgreSQL is reachable (see FailedReleases). */
  onAnswer: (() => void) | undefined;
  private readonly prepared: PreparedStatements;

  constructor(
    private readonly connection: CheckedConnection,
    private readonly options: ResolvedPostgresOptions,
    /** The backend's name, for errors. */
    private readonly backendName: string,
  ) {
    this.names = lockNames(options.schema, options.table);
    this.prepared = new PreparedStatements(this.names.qualified);
    this.deadlines = new CommandDeadlines(options.commandTimeout);
    this.owned = connection.kind === 'config';
    if (connection.kind === 'pool') {
      this.pool = connection.pool;
      this.poolWatch = new PoolStarvationWatch(connection.pool, Math.min(1_000, options.commandTimeout / 2));
    } else this.pg = loadPg('connection');
    const listen = options.listenConnection;
    if (this.pg === undefined && listen !== undefined && listen !== false) this.pg = loadPg('listenConnection');
  }

  get closed(): boolean {
    return this.stopped;
  }

  /**
   * Runs one statement, bounded by the command timeout, and returns its rows; failures become a
   * LockBackendError that names the operation and the keys.
   */
  run(statement: Statement): Promise<Record<string, unknown>[]> {
    if (this.refuses(statement.op)) return Promise.reject(this.closedError(statement.op, statement.keys));
    return new Promise((resolve, reject) => {
      const seat: Seat = {};
      const command = this.deadlines.track(() => {
        reject(
          this.failure(
            statement,
            new Error(
              `PostgreSQL did not answer within ${this.options.commandTimeout} ms (commandTimeout); is it paused, overloaded, ` +
                `or is the statement waiting for a lock another transaction holds on the lock table?`,
            ),
          ),
        );
        giveUpLater(seat);
      });
      const sent = (this.tablesReady ? this.query(statement, seat) : this.ensureTables().then(() => this.query(statement, seat))).catch(
        (error: unknown) => this.readOnlyCheck(error),
      );
      // Until its answer is handled: a late one starts a release, which close() waits for too.
      this.requests.track(
        sent.then(
          (rows) => {
            if (!this.deadlines.answered(command)) return statement.onLateAnswer?.(rows);
            resolve(rows);
            this.onAnswer?.();
          },
          (error: unknown) => {
            if (this.deadlines.answered(command)) return reject(error instanceof LockBackendError ? error : this.failure(statement, error));
            if (leavesDoubt(error)) return statement.onLateDoubt?.();
          },
        ),
      );
    });
  }

  /**
   * A new connection of its own, for LISTEN: to `listenConnection` if given, else with the pool's
   * settings. Not connected yet; the caller connects it and owns it.
   */
  newListenClient(): Client {
    const listen = this.options.listenConnection;
    if (listen !== undefined && listen !== false) {
      const config: ClientConfig = typeof listen === 'string' ? { connectionString: listen } : listen;
      return new this.pg!.Client({ keepAlive: true, ...config });
    }
    const pool = this.openPool();
    // The pool's own settings object, as it passes it to its clients: a copy would lose the
    // password, which pg-pool keeps in a non-enumerable property.
    const PoolClient = (pool as unknown as { Client: new (config: unknown) => Client }).Client;
    return new PoolClient(pool.options);
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
    // pool.end() waits for every checked-out connection: one stuck on a paused server would hold up
    // the shutdown, so it gets a second, and its sockets go with the process.
    await withTimeout(pool.end(), 1_000).catch(() => undefined);
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
    const hint = error instanceof Error && 'hint' in error && typeof error.hint === 'string' ? ` ${sentence(error.hint)}` : '';
    const down =
      this.lastError && this.lastError !== error ? ` (The pool's last connection error: ${sentence(this.lastError.message)})` : '';
    const inRecovery = typeof error === 'object' && error !== null ? this.recovery.get(error) : undefined;
    const cause = permanentCause(error, this.names, this.identity(), inRecovery);
    const note = !cause && isReadOnly(error) ? ` ${IN_RECOVERY_NOTE}` : '';
    return new LockBackendError(
      this.backendName,
      `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: ${message}${hint}${note}${cause ? ` ${cause}` : down}`,
      error,
      { permanent: cause !== undefined },
    );
  }

  /**
   * A write refused as read-only (25006) is either a server in recovery, which a failover ends in
   * seconds, or a read-only role or database, which waiting never heals: the server says which.
   * Asked on this error only; unknown (no answer) counts as one that may pass. Rethrows `error`.
   */
  private async readOnlyCheck(error: unknown): Promise<never> {
    if (isReadOnly(error) && !this.recovery.has(error as object)) {
      const inRecovery = await this.openPool()
        .query<{ in_recovery: boolean }>('SELECT pg_is_in_recovery() AS in_recovery')
        .then(({ rows }) => rows[0]?.in_recovery === true)
        .catch(() => undefined);
      this.recovery.set(error as object, inRecovery);
    }
    throw error;
  }

  /** Whether a failure is a read-only error (25006) the server said came from recovery. */
  inRecovery(error: unknown): boolean {
    const cause = error instanceof LockBackendError ? error.cause : error;
    return typeof cause === 'object' && cause !== null && this.recovery.get(cause) === true;
  }

  /** The role and database the settings name, for fixes (never the password). */
  identity(): ConnectionIdentity {
    const settings = (this.connection.kind === 'pool' ? this.connection.pool.options : this.connection.config) as PoolConfig;
    let role = settings.user;
    let database = settings.database;
    if (typeof settings.connectionString === 'string') {
      try {
        const url = new URL(settings.connectionString);
        role ??= url.username ? decodeURIComponent(url.username) : undefined;
        database ??= url.pathname.length > 1 ? decodeURIComponent(url.pathname.slice(1)) : undefined;
      } catch {
        // Checked at construction; a pool of the app's own may hold anything.
      }
    }
    return { role: typeof role === 'string' ? role : undefined, database: typeof database === 'string' ? database : undefined };
  }

  private async query(statement: Statement, seat: Seat = {}): Promise<Record<string, unknown>[]> {
    const config = this.prepared.config(statement.text, statement.values, statement.prepared ? statement.op : undefined);
    try {
      return await this.queryOnce(config, seat);
    } catch (error) {
      // Refused before it ran: sent again, unnamed.
      if (!this.prepared.refused(config, error)) throw error;
      return this.queryOnce(this.prepared.config(statement.text, statement.values, undefined), seat);
    }
  }

  /** As pool.query() does, on a connection `seat` can give up; the wait for a connection of the app's pool is watched. */
  private async queryOnce(config: QueryConfig, seat: Seat): Promise<Record<string, unknown>[]> {
    const pool = this.openPool();
    const client = this.poolWatch ? await this.poolWatch.connect() : await pool.connect();
    // pg-pool takes its own 'error' listener off a checked-out connection, and pg emits 'error' on
    // it when the connection ends unexpectedly: without this one, an uncaught exception. Whichever
    // comes first, the error or the answer, gives the connection back, once (an error: closed
    // rather than reused).
    let released = false;
    const giveBack = (error?: unknown) => {
      if (released) return;
      released = true;
      client.removeListener('error', onError);
      client.release(error === undefined ? undefined : error instanceof Error ? error : new Error(String(error)));
    };
    const onError = (error: Error) => giveBack(error);
    client.once('error', onError);
    // Released with an error, pg-pool closes it and opens another: unless its session is still at
    // work on the server (waiting behind a migration's lock on the table), which a client-side
    // close would not stop, and the pool would open more beside it.
    seat.giveUp = () => {
      if (released) return;
      void this.sessionBusy(client).then((busy) =>
        busy ? giveUpLater(seat) : giveBack(new Error(`no answer ${GIVE_UP_CONNECTION_AFTER_MS} ms after the command timeout`)),
      );
    };
    try {
      const result = await client.query(config);
      giveBack();
      return result.rows as Record<string, unknown>[];
    } catch (error) {
      giveBack(error);
      throw error;
    }
  }

  /**
   * Whether the server session behind a pooled connection is still running a statement, asked on
   * a connection of its own; false when that cannot be told within the command timeout (the
   * server unreachable on that path too, or a pooler's session ids).
   */
  private async sessionBusy(client: Client): Promise<boolean> {
    const pid = (client as unknown as { processID?: unknown }).processID;
    // Closed: no new connection; the pool has ended or is ending.
    if (typeof pid !== 'number' || this.stopped) return false;
    const probe = this.newListenClient();
    probe.on('error', () => undefined);
    const asked = (async () => {
      await probe.connect();
      const { rows } = await probe.query<{ state: string | null }>('SELECT state FROM pg_stat_activity WHERE pid = $1', [pid]);
      return rows[0]?.state === 'active';
    })().catch(() => false);
    const busy = (await withTimeout(asked, this.options.commandTimeout)) ?? false;
    probe.end().catch(() => undefined);
    return busy;
  }

  private openPool(): Pool {
    if (this.pool) return this.pool;
    const config = (this.connection as { config: PoolConfig }).config;
    const pool = new this.pg!.Pool({ ...CREATED_POOL_DEFAULTS, connectionTimeoutMillis: this.options.commandTimeout, ...config });
    let down = false;
    // An idle connection that breaks (a server restart) is reported here; without a listener it
    // would crash the process.
    pool.on('error', (error: Error) => {
      this.lastError = error;
      if (!down) logger.warn(`PostgreSQL connection failed: ${sentence(error.message)} Lock operations fail until it is back.`);
      down = true;
    });
    pool.on('connect', () => {
      this.lastError = undefined;
      if (down) logger.log('PostgreSQL connection is back.');
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
   * The lock tables at the version this code expects, created if missing (when allowed). Instances
   * that start together take turns on a transaction advisory lock; the first creates, the others
   * find the tables there.
   */
  private async createTables(): Promise<void> {
    const refuse = (comment: unknown) => {
      const why = newerLayoutRefusal(comment, this.names.qualified);
      if (why) throw new LockBackendError(this.backendName, why, undefined, { permanent: true });
    };
    const pool = this.openPool();
    // The version comment, or (without the columns of who holds, see IDENTITY_COLUMN, or with
    // functions of an earlier revision) less than it.
    const version = async (client: Pool | { query: Pool['query'] }) => {
      const { rows } = await client.query(
        `SELECT obj_description(to_regclass($1), 'pg_class') AS version, EXISTS (SELECT 1 FROM pg_attribute a ` +
          `WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped) AS current, ` +
          `COALESCE((SELECT position($4 IN p.prosrc) > 0 FROM pg_proc p WHERE p.oid = to_regprocedure($3)), false) AS revised`,
        [this.names.qualified, IDENTITY_COLUMN, acquireSignature(this.names), FUNCTIONS_REVISION],
      );
      const { version: comment, current, revised } = rows[0] ?? {};
      if (comment !== SCHEMA_VERSION) return comment;
      return !current ? WITHOUT_IDENTITY : !revised ? OLDER_FUNCTIONS : comment;
    };
    const found = await version(pool);
    if (found === SCHEMA_VERSION) return;
    refuse(found);
    const { schema, table, createTables } = this.options;
    // The tables work as they are, only a rule of the later functions is missing: said, never
    // refused (a role that may not replace them, or createTables off, must still lock).
    const olderFunctions = (why: string) =>
      logger.warn(
        `The functions of the lock table ${this.names.qualified} are of an earlier release (${why}): a waiter for several ` +
          `keys keeps a place in the line of each, and may keep the holder of its first key out of the next one until a ` +
          `wait runs out. Run the SQL of postgresLockTablesSql({ schema: '${schema}', table: '${table}' }) in a migration to replace them.`,
      );
    if (!createTables && found === OLDER_FUNCTIONS) return olderFunctions('createTables is false');
    if (!createTables) {
      throw new LockBackendError(
        this.backendName,
        `the lock table ${this.names.qualified} (version '${SCHEMA_VERSION}') is ` +
          `${found === WITHOUT_IDENTITY ? `at version ${SCHEMA_LAYOUT} without the columns of who holds (made by an earlier release)` : schemaLayout(found) === undefined ? 'missing' : `at version ${schemaLayout(found)}`} and createTables is false: run the SQL of ` +
          `postgresLockTablesSql({ schema: '${schema}', table: '${table}' }) in a migration, or leave createTables on.`,
        undefined,
        { permanent: true },
      );
    }
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SET LOCAL client_min_messages = warning');
      await client.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-distributed-lock:create:${this.names.qualified}`]);
      const locked = await version(client);
      refuse(locked);
      if (locked !== SCHEMA_VERSION) await client.query(postgresLockTablesSql({ schema, table }));
      await client.query('COMMIT');
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      if (error instanceof LockBackendError) throw error;
      if (found === OLDER_FUNCTIONS)
        return olderFunctions(sentence(error instanceof Error ? error.message : String(error)).replace(/\.$/, ''));
      // 42501: insufficient privilege.
      const denied = (error as { code?: unknown }).code === '42501';
      if (isReadOnly(error)) await this.readOnlyCheck(error).catch(() => undefined);
      const inRecovery = isReadOnly(error) ? this.recovery.get(error as object) : undefined;
      const fix = denied
        ? await createTablesFix(client, this.options, this.identity())
        : permanentCause(error, this.names, this.identity(), inRecovery);
      throw new LockBackendError(
        this.backendName,
        `could not create the lock table ${this.names.qualified}: ${sentence(error instanceof Error ? error.message : String(error))}` +
          (fix ? ` ${fix}` : ''),
        error,
        { permanent: fix !== undefined },
      );
    } finally {
      client.release();
    }
  }
}

type PgPackage = { Pool: typeof Pool; Client: typeof Client };

/**
 * pg is an optional peer, needed only when the backend creates a connection: loaded then, at
 * construction, so a missing package stops the application at start-up, not at its first lock.
 */
function loadPg(option: string): PgPackage {
  try {
    return requirePeer('pg') as PgPackage;
  } catch (error) {
    throw new InvalidLockOptionsError(
      option,
      `PostgresLockBackend needs the 'pg' package to connect to PostgreSQL: npm install pg, or pass a pg.Pool you created ` +
        `(${error instanceof Error ? error.message : String(error)})`,
    );
  }
}

function isReadOnly(error: unknown): boolean {
  return typeof error === 'object' && error !== null && (error as { code?: unknown }).code === READ_ONLY_SQL_TRANSACTION;
}

/**
 * Whether a statement's failure leaves open whether the server ran it: its connection was lost or
 * given up, where an error of the server's own (a SQLSTATE code) says it did not commit.
 */
function leavesDoubt(error: unknown): boolean {
  // Ours (the tables refused, a connection not to be had): the statement was never sent.
  if (error instanceof LockBackendError) return false;
  const code = (error as { code?: unknown } | undefined)?.code;
  return !(typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code));
}
