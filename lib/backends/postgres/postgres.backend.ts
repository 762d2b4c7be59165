import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { inspect } from 'node:util';
import type {
  AcquireResult,
  BackendHealth,
  ExtendResult,
  LockBackend,
  LockListOptions,
  LockListPage,
  LockState,
  TryAcquireOptions,
} from '../lock-backend.interface.js';
import { encodeIdentity } from '../../lock-identity.js';
import { inspectPostgres, listPostgres } from './postgres.inspection.js';
import { InvalidLockKeyError, InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { FailedReleases } from '../failed-releases.js';
import { PostgresConnection } from './postgres.connection.js';
import { PostgresWaiterLine } from './postgres.line.js';
import {
  checkConnection,
  resolveBackendOptions,
  type PostgresLockBackendOptions,
  type PostgresLockConnection,
} from './postgres.options.js';

/**
 * The longest key, in UTF-8 bytes, that every statement of the backend can index, whoever holds
 * or waits for it: a waiter's row is indexed on (key, owner), and a B-tree entry holds at most
 * 2 704 bytes on PostgreSQL's 8 kB pages (measured with keys that do not compress and owners of
 * MAX_OWNER_BYTES: 2 659 bytes fit, 2 660 do not).
 */
export const POSTGRES_MAX_KEY_BYTES = 2_659;
/**
 * The longest owner the bound above holds for: LockService's owner tokens (32 hex characters).
 * A longer owner would make a key that fits fail for its waiters.
 */
const MAX_OWNER_BYTES = 32;

/** How often a backend deletes leases and places in line that ran out long ago (see sweep()). */
const SWEEP_EVERY_MS = 5 * 60_000;

/**
 * Leases in a PostgreSQL table, through `pg`. Every operation is one statement, one round trip:
 * a function call (see postgres.functions.ts). A key has a lease per holder (one, or several for a
 * shared lock or a semaphore), expiring by the server's clock; fencing tokens come from one
 * sequence for every kind, so they increase per key across restarts. Waiters stand in a fair line
 * in the database; a release hands the key to every waiter at the head that can now enter (or, for
 * several keys, tells it to ask again), telling only their processes, by NOTIFY on a channel each
 * process LISTENs on.
 *
 * Exclusive while PostgreSQL keeps its committed data: a failover to an asynchronous replica that
 * had not received a lease can grant it twice, and hand out tokens again. Synchronous replication
 * keeps both.
 */
export class PostgresLockBackend implements LockBackend {
  readonly name = 'postgres';
  readonly fencing = true;
  readonly sharedHolders = true;
  readonly storesIdentity = true;
  readonly waiterTimeout: number;

  private readonly connection: PostgresConnection;
  private readonly line: PostgresWaiterLine;
  private readonly failedReleases = new FailedReleases((keys, owner) => this.release(keys, owner));
  private lastSweep = performance.now();
  private sweeping: Promise<void> | undefined;

  /**
   * `new PostgresLockBackend(pool)` uses your `pg.Pool` and leaves it open;
   * `new PostgresLockBackend('postgres://user:password@host:5432/db')` or
   * `new PostgresLockBackend({ host, database, ... })` creates a pool (pg must be installed) and
   * closes it on application shutdown. The LISTEN connection is always the backend's own.
   */
  constructor(connection: PostgresLockConnection, options?: PostgresLockBackendOptions) {
    const checked = checkConnection(connection);
    const resolved = resolveBackendOptions(options);
    this.waiterTimeout = resolved.waiterTimeout;
    this.connection = new PostgresConnection(checked, resolved, this.name);
    this.line = new PostgresWaiterLine(this.connection, resolved.commandTimeout, resolved.listenConnection !== false);
    // pg never says when a broken connection is back: a statement answered says PostgreSQL is.
    this.connection.onAnswer = this.failedReleases.sendAgain;
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    checkKeySizes(keys, owner);
    const willWait = options?.willWait ?? true;
    this.failedReleases.forget(owner);
    const handedOver = this.line.takeHandover(owner);
    if (handedOver) return { acquired: true, ...handedOver };
    const entry = this.line.attemptStarting(owner, willWait);
    this.sweepNowAndThen();
    const sentAt = performance.now();
    // It answered after we reported a failure, or may have run without an answer. Freeing the keys
    // here would be wrong when the same owner tries again (its next attempt finds the lock its own)
    // or holds the lock by now: the caller decides.
    const lateWin = () => (options?.onLateAcquire ? options.onLateAcquire() : this.release(keys, owner).catch(() => undefined));
    const [row] = await this.connection.run({
      op: 'acquire',
      keys,
      prepared: true,
      text:
        `SELECT acquired, token, retry_after_ms, mismatch_key, mismatch_limit ` +
        `FROM ${this.connection.names.acquire}($1, $2, $3, $4, $5, $6, $7, $8)`,
      values: [
        keys,
        owner,
        Math.ceil(ttlMs),
        this.waiterTimeout,
        willWait,
        this.line.channel,
        options?.limits ?? null,
        options?.holder ? encodeIdentity(options.holder) : null,
      ],
      onLateAnswer: ([late]) => (late?.acquired === true ? lateWin() : undefined),
      onLateDoubt: lateWin,
    });
    if (row.acquired === true) {
      this.line.leave(owner);
      return { acquired: true, fencingToken: Number(row.token) };
    }
    if (row.mismatch_key !== null) {
      return { acquired: false, limitMismatch: { key: row.mismatch_key as string, limit: row.mismatch_limit as number } };
    }
    // Failed: the token is the last one handed out when it ran.
    this.line.attemptFailed(entry, sentAt, Number(row.token));
    return { acquired: false, retryAfterMs: row.retry_after_ms === null ? undefined : Math.max(0, Number(row.retry_after_ms)) };
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const [row] = await this.connection.run({
      op: 'extend',
      keys,
      prepared: true,
      text: `SELECT ${this.connection.names.extend}($1, $2, $3) AS extended`,
      values: [keys, owner, Math.ceil(ttlMs)],
    });
    return row.extended === true ? { extended: true } : { extended: false };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    this.line.leave(owner);
    let rows;
    try {
      rows = await this.connection.run({
        op: 'release',
        keys,
        prepared: true,
        text: `SELECT ${this.connection.names.release}($1, $2) AS released`,
        values: [keys, owner],
      });
    } catch (error) {
      // Sent again once a statement is answered (see FailedReleases); the caller still hears of it.
      if (!this.connection.closed) this.failedReleases.add(keys, owner);
      throw error;
    }
    return (rows[0].released as number) > 0;
  }

  /** Two reads, the holders then the line (see postgres.inspection.ts). */
  async inspect(key: string): Promise<LockState | undefined> {
    return inspectPostgres(this.connection, key);
  }

  /** An index range on the lock table's primary key, after the cursor's key. Read-only. */
  async list(options: LockListOptions): Promise<LockListPage> {
    return listPostgres(this.connection, options);
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.connection.closed) throw this.connection.closedError('watch', keys);
    // Releases name the waiter whose turn it is: without the owner, nothing here would answer to
    // that name, and the caller polls.
    if (owner === undefined) return () => undefined;
    return this.line.watch(onRelease, owner);
  }

  /**
   * Once this process listens on its channel: a release that names one of its waiters reaches it
   * from then on, and is kept until that waiter watches.
   */
  watching(): boolean {
    return this.line.watching();
  }

  /**
   * At start-up: the database exists, the credentials and the role's rights are accepted, the lock
   * tables exist or were created, and a lock can be written (not a hot standby, not a read-only
   * role). A hot standby is refused here, while lock operations retry on one (a failover). It runs the release of a key nobody holds, by an owner that never held it: the
   * statements of a real release, which change nothing. Resolves when PostgreSQL cannot be
   * reached: lock operations fail until it is back.
   */
  async verify(): Promise<void> {
    const { names } = this.connection;
    let row;
    try {
      [row] = await this.connection.run({
        op: 'verify',
        keys: [],
        text:
          `SELECT ${names.release}($1, $2) AS released, has_table_privilege($3, 'SELECT, INSERT, UPDATE, DELETE') ` +
          `AND has_table_privilege($4, 'SELECT, INSERT, UPDATE, DELETE') AND has_sequence_privilege($5, 'USAGE') ` +
          `AND has_sequence_privilege($6, 'USAGE') AS writable`,
        values: [
          ['nest-distributed-lock:verify'],
          `verify-${randomBytes(16).toString('hex')}`,
          names.locks,
          names.waiters,
          names.tokens,
          names.places,
        ],
      });
    } catch (error) {
      if (error instanceof LockBackendError && error.permanent) throw error;
      // A server in recovery: locks retry there (a failover ends it), but an application that
      // starts on a hot standby was most likely given the replica's address by mistake.
      if (this.connection.inRecovery(error)) {
        throw new LockBackendError(
          this.name,
          'verify failed: PostgreSQL is a hot standby (in recovery), where no lock can be taken: connect to the primary. ' +
            '(During a failover, a server being promoted answers so for a few seconds: start again once it is done.)',
          error,
          { permanent: true },
        );
      }
      return;
    }
    if (row.writable !== true) {
      throw this.connection.failure(
        { op: 'verify', keys: [] },
        Object.assign(new Error('the role lacks rights on the lock tables.'), { code: '42501' }),
      );
    }
  }

  /**
   * For health checks: whether PostgreSQL takes writes, which a lock needs. A hot standby, or a
   * session that is read-only (default_transaction_read_only for the role or the database),
   * answers a SELECT while every lock fails.
   */
  async health(): Promise<BackendHealth> {
    const [row] = await this.connection.run({
      op: 'health check',
      keys: [],
      text: `SELECT pg_is_in_recovery() AS in_recovery, current_setting('transaction_read_only') = 'on' AS read_only`,
      values: [],
    });
    const inRecovery = row.in_recovery === true;
    const readOnly = row.read_only === true;
    const details = { inRecovery, readOnly };
    if (inRecovery) {
      return {
        up: false,
        details,
        message:
          'PostgreSQL is a hot standby (in recovery): no lock can be taken there until it is promoted (a failover). ' +
          'Connect to the primary.',
      };
    }
    if (readOnly) {
      return {
        up: false,
        details,
        message:
          'PostgreSQL sessions of this role are read-only (default_transaction_read_only is on for the role or the database): ' +
          'no lock can be taken. Turn it off for this role, or use one that may write.',
      };
    }
    return { up: true, details };
  }

  /** Closes the LISTEN connection, and the pool if the backend created it. */
  async close(): Promise<void> {
    if (!this.connection.stop()) return;
    this.failedReleases.close();
    await this.line.close();
    await this.sweeping;
    await this.connection.requestsSettled();
    await this.connection.closePool();
  }

  /**
   * What logs show of the backend: its table, not its connection settings (a connection string
   * holds the password) nor its waiters' owner tokens.
   */
  toJSON(): { name: string; table: string; waiterTimeout: number } {
    return { name: this.name, table: this.connection.names.qualified, waiterTimeout: this.waiterTimeout };
  }

  [inspect.custom](depth: number, options: object): string {
    return `PostgresLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  /** @internal For tests: the channel releases NOTIFY to reach this backend's waiters. */
  get channel(): string {
    return this.line.channel;
  }

  /**
   * A lease that ran out stays in its row until the key is locked again, and a waiter that died
   * keeps its rows until someone looks at its line: for keys nobody locks again (one per order id,
   * say), now and then, in the background, rows that ran out more than a minute ago are deleted.
   * Without a key lock: a row that is that far gone cannot be extended, and a call that takes
   * the key meanwhile writes a new row version, which the delete then leaves alone.
   */
  private sweepNowAndThen(): void {
    const now = performance.now();
    if (now - this.lastSweep < SWEEP_EVERY_MS || this.sweeping) return;
    this.lastSweep = now;
    const { locks, waiters } = this.connection.names;
    const sweep = (table: string, column: string) =>
      this.connection.run({
        op: 'clean-up',
        keys: [],
        text: `DELETE FROM ${table} WHERE ${column} < clock_timestamp() - interval '1 minute'`,
        values: [],
      });
    this.sweeping = Promise.all([sweep(locks, 'expires_at'), sweep(waiters, 'deadline')]).then(
      () => undefined,
      () => undefined,
    );
    void this.sweeping.finally(() => (this.sweeping = undefined));
  }
}

/**
 * Refuses, before anything is sent, a key PostgreSQL could not index: it would be taken while
 * free, and its waiters would fail (their (key, owner) entry is longer than the lock's own). The
 * bound is on the key alone, so a key one caller may take, every other may wait for.
 */
function checkKeySizes(keys: readonly string[], owner: string): void {
  if (Buffer.byteLength(owner) > MAX_OWNER_BYTES) {
    throw new InvalidLockOptionsError(
      'owner',
      `PostgresLockBackend takes owners of at most ${MAX_OWNER_BYTES} bytes (LockService's owner tokens), got ` +
        `${Buffer.byteLength(owner)}: lock through LockService, or pass a token of at most ${MAX_OWNER_BYTES} bytes.`,
    );
  }
  for (const key of keys) {
    const bytes = Buffer.byteLength(key);
    if (bytes <= POSTGRES_MAX_KEY_BYTES) continue;
    throw new InvalidLockKeyError(
      `Lock key '${key.slice(0, 60)}…' is ${bytes} bytes long in UTF-8, over the ${POSTGRES_MAX_KEY_BYTES} that ` +
        `the PostgreSQL backend can index (a B-tree entry holds at most 2 704 bytes). Lock an identifier rather than a payload ` +
        `(or a hash of a long one), and set maxKeyLength in DistributedLockModule.forRoot() to refuse longer keys.`,
    );
  }
}
