import { randomBytes } from 'node:crypto';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import { listMysql } from './mysql.listing.js';
import { inspectMysql, limitOf } from './mysql.inspection.js';
import { identityBytes } from '../../lock-identity.js';
import { performance } from 'node:perf_hooks';
import { inspect } from 'node:util';
import {
  SHARED,
  type AcquireResult,
  type BackendHealth,
  type ExtendResult,
  type LockBackend,
  type LockState,
  type TryAcquireOptions,
} from '../lock-backend.interface.js';
import { InvalidLockKeyError, InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { FailedReleases } from '../failed-releases.js';
import { MysqlConnection } from './mysql.connection.js';
import { READ_ONLY_SERVER, errnoOf } from './mysql.errors.js';
import { MysqlWaiterLine } from './mysql.line.js';
import { checkMysqlConnection, resolveMysqlOptions, type MysqlLockBackendOptions, type MysqlLockConnection } from './mysql.options.js';
import { SHARED_LIMIT_SQL } from './mysql.procedures.js';
import { MYSQL_MAX_KEY_BYTES, MYSQL_MAX_OWNER_BYTES } from './mysql.schema.js';

/** How often a backend deletes leases and places in line that ran out long ago (see sweepNowAndThen()). */
const SWEEP_EVERY_MS = 5 * 60_000;

/**
 * Leases in MySQL or MariaDB (InnoDB) tables, through `mysql2`: a lease per holder, so a key can
 * be held exclusively, by readers (shared) or by a semaphore's holders. Every operation is one
 * statement, one round trip, one transaction on the server: a stored procedure (see
 * mysql.procedures.ts). Leases expire by the server's clock; fencing tokens come from an
 * AUTO_INCREMENT counter that InnoDB keeps across restarts. Waiters stand in a fair line in the
 * database; a release hands the key to every waiter at the head that can now enter, in its own
 * transaction, and each process with waiters looks for its turn in one statement every
 * `wakeUpInterval`.
 *
 * Exclusive while the server keeps its committed data: a failover to an asynchronous replica that
 * had not received a lease can grant it twice, and hand out tokens again.
 */
export class MysqlLockBackend implements LockBackend {
  readonly name = 'mysql';
  readonly fencing = true;
  readonly sharedHolders = true;
  readonly storesIdentity = true;
  readonly waiterTimeout: number;

  private readonly connection: MysqlConnection;
  private readonly line: MysqlWaiterLine;
  /**
   * Sent again after any statement answered, and every second while any is kept: a release that
   * timed out after the last answer (its answer lost) would otherwise wait for the app's next lock.
   */
  private readonly failedReleases = new FailedReleases((keys, owner) => this.release(keys, owner), { retryEveryMs: 1_000 });
  private lastSweep = performance.now();
  private sweeping: Promise<void> | undefined;

  /**
   * `new MysqlLockBackend(pool)` uses your `mysql2` pool and leaves it open;
   * `new MysqlLockBackend('mysql://user:password@host:3306/db')` or
   * `new MysqlLockBackend({ host, user, password, database })` creates a pool (mysql2 must be
   * installed) and closes it on application shutdown.
   */
  constructor(connection: MysqlLockConnection, options?: MysqlLockBackendOptions) {
    const checked = checkMysqlConnection(connection);
    const resolved = resolveMysqlOptions(options);
    this.waiterTimeout = resolved.waiterTimeout;
    this.connection = new MysqlConnection(checked, resolved, this.name);
    this.line = new MysqlWaiterLine(this.connection, resolved.wakeUpInterval);
    // mysql2 never says when a broken connection is back: a statement answered says the server is.
    this.connection.onAnswer = this.failedReleases.sendAgain;
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    const { list, limits, byHex } = keyArguments(keys, owner, options?.limits);
    this.failedReleases.forget(owner);
    this.sweepNowAndThen();
    // It answered after we reported a failure, or may have run without an answer. Freeing the keys
    // here would be wrong when the same owner tries again (its next attempt finds the lock its own)
    // or holds the lock by now: the caller decides.
    const lateWin = () => (options?.onLateAcquire ? options.onLateAcquire() : this.release(keys, owner).catch(() => undefined));
    const [row] = await this.connection.run({
      op: 'acquire',
      keys,
      sql: `CALL ${this.connection.names.takeAs}(?, ?, ?, ?, ?, ?, ?)`,
      values: [
        list,
        owner,
        Math.ceil(ttlMs),
        this.waiterTimeout,
        options?.willWait ?? true,
        limits,
        identityBytes(options?.holder, this.name) ?? null,
      ],
      onLateAnswer: ([late]) => {
        if (Number(late?.acquired) !== 1) return;
        this.wakeHanded(late.handed_to);
        return lateWin();
      },
      onLateDoubt: lateWin,
    });
    // A waiter leaving a later line may hand its key to the next: woken too when it failed.
    this.wakeHanded(row.handed_to);
    if (Number(row.acquired) === 1) {
      return { acquired: true, fencingToken: Number(row.token) };
    }
    if (row.mismatch_key !== null && row.mismatch_key !== undefined) {
      const hex = String(row.mismatch_key).toLowerCase();
      return { acquired: false, limitMismatch: { key: byHex.get(hex) ?? hex, limit: limitOf(row.mismatch_limit) } };
    }
    return { acquired: false, retryAfterMs: row.retry_after_ms === null ? undefined : Number(row.retry_after_ms) };
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const [row] = await this.connection.run({
      op: 'extend',
      keys,
      sql: `CALL ${this.connection.names.extend}(?, ?, ?)`,
      values: [keyArguments(keys, owner).list, owner, Math.ceil(ttlMs)],
    });
    return Number(row.extended) === 1 ? { extended: true } : { extended: false };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    let rows;
    try {
      rows = await this.connection.run({
        op: 'release',
        keys,
        sql: `CALL ${this.connection.names.release}(?, ?)`,
        values: [keyArguments(keys, owner).list, owner],
      });
    } catch (error) {
      // Sent again once a statement is answered (see FailedReleases); the caller still hears of it.
      if (!this.connection.closed && !(error instanceof LockBackendError && error.permanent)) this.failedReleases.add(keys, owner);
      throw error;
    }
    this.wakeHanded(rows[0].handed_to);
    return Number(rows[0].released) > 0;
  }

  /** The key's holders and line, with who they are, in one read (see inspectMysql). */
  inspect(key: string): Promise<LockState | undefined> {
    return inspectMysql(this.connection, key);
  }

  /** A range of the holders table's primary key after the cursor (see listMysql). Read-only. */
  list(options: LockListOptions): Promise<LockListPage> {
    return listMysql(this.connection, options);
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.connection.closed) throw this.connection.closedError('watch', keys);
    // A turn is found by owner: without one, the caller polls.
    if (owner === undefined) return () => undefined;
    return this.line.watch(
      keys.map((key) => Buffer.from(key)),
      onRelease,
      owner,
    );
  }

  /**
   * Always: a hand-over or a free key stays in the tables until its owner acts on it, so the first
   * look after a watch finds what a release did before it.
   */
  watching(): boolean {
    return true;
  }

  /**
   * At start-up: the database exists, the credentials and the user's rights are accepted, the lock
   * tables exist or were created, and a lock can be written (not a read-only server or session).
   * A read-only server is refused here, while lock operations retry on one (a failover). It runs
   * the release of a key nobody holds, by an owner that never held it: the statements of a real
   * release, which change nothing of anyone's. Resolves when the server cannot be reached: lock
   * operations fail until it is back.
   */
  async verify(): Promise<void> {
    try {
      await this.connection.run({
        op: 'verify',
        keys: [],
        sql: `CALL ${this.connection.names.release}(?, ?)`,
        values: [Buffer.from('nest-distributed-lock:verify').toString('hex'), randomBytes(16).toString('hex')],
      });
    } catch (error) {
      if (error instanceof LockBackendError && error.permanent) throw error;
      const cause = error instanceof LockBackendError ? error.cause : error;
      // A read-only server: locks retry there (a failover ends it), but an application that starts
      // on one was most likely given a replica's address by mistake.
      if (errnoOf(cause) === READ_ONLY_SERVER) {
        throw new LockBackendError(
          this.name,
          'verify failed: the server runs read-only (read_only is on: a replica), where no lock can be taken: connect to the ' +
            'primary, or give this user the right to write there. (During a failover, a replica being promoted answers so ' +
            'until it is: start again once it is done.)',
          cause,
          { permanent: true },
        );
      }
    }
  }

  /** For health checks: whether the server takes writes, which a lock needs. */
  async health(): Promise<BackendHealth> {
    const [row] = await this.connection.run({
      op: 'health check',
      keys: [],
      sql: 'SELECT @@global.read_only AS read_only',
      values: [],
    });
    const readOnly = Number(row.read_only) === 1;
    if (readOnly) {
      return {
        up: false,
        details: { readOnly },
        message:
          'The server runs read-only (read_only is on: a replica): no lock can be taken there until it is promoted. Connect to the primary.',
      };
    }
    return { up: true, details: { readOnly } };
  }

  /** Stops the wake-ups, and closes the pool if the backend created it. */
  async close(): Promise<void> {
    if (!this.connection.stop()) return;
    this.failedReleases.close();
    this.line.close();
    await this.sweeping;
    await this.connection.requestsSettled();
    await this.connection.closePool();
  }

  /** What logs show of the backend: its table, not its connection settings (they hold the password). */
  toJSON(): { name: string; table: string; waiterTimeout: number } {
    return { name: this.name, table: this.connection.names.table, waiterTimeout: this.waiterTimeout };
  }

  [inspect.custom](depth: number, options: object): string {
    return `MysqlLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  /** Waiters of this process a call handed a key to (comma-separated owners) take it now, not at their next look. */
  private wakeHanded(handedTo: unknown): void {
    if (handedTo === null || handedTo === undefined) return;
    for (const owner of ownerText(handedTo).split(',')) this.line.wake(owner);
  }

  /**
   * A lease that ran out stays in its row until its owner releases it, a key's row stays after its
   * last holder, and a waiter that died keeps its rows until someone looks at its line: for keys
   * nobody locks again (one per order id, say), now and then, in the background, rows that ran out
   * more than a minute ago, and key rows nobody holds or waits for, are deleted, a thousand at a
   * time, so a delete holds few row locks at once. A call on one of those keys meanwhile waits for
   * its row, then makes it again.
   */
  private sweepNowAndThen(): void {
    const now = performance.now();
    if (now - this.lastSweep < SWEEP_EVERY_MS || this.sweeping) return;
    this.lastSweep = now;
    const { locks, holders, waiters } = this.connection.names;
    const sweep = (sql: string) => this.connection.run({ op: 'clean-up', keys: [], sql, values: [] });
    this.sweeping = (async () => {
      await sweep(`DELETE FROM ${holders} WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE LIMIT 1000`);
      await sweep(`DELETE FROM ${waiters} WHERE deadline < UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE LIMIT 1000`);
      await sweep(
        `DELETE FROM ${locks} WHERE owner = '' AND NOT EXISTS (SELECT 1 FROM ${holders} h WHERE h.lock_key = ${locks}.lock_key) ` +
          `AND NOT EXISTS (SELECT 1 FROM ${waiters} w WHERE w.lock_key = ${locks}.lock_key) LIMIT 1000`,
      );
    })().catch(() => undefined);
    void this.sweeping.finally(() => (this.sweeping = undefined));
  }
}

/**
 * The keys as the procedures take them: hex of their UTF-8 bytes, sorted (one global order, so
 * calls on several keys do not deadlock), comma-separated; their limits in the same order
 * (null: all exclusive); and each hex back to its key, for answers that name one. Refuses first
 * what the tables cannot hold.
 */
function keyArguments(
  keys: readonly string[],
  owner: string,
  limits?: readonly number[],
): { list: string; limits: string | null; byHex: Map<string, string> } {
  if (Buffer.byteLength(owner) > MYSQL_MAX_OWNER_BYTES) {
    throw new InvalidLockOptionsError(
      'owner',
      `MysqlLockBackend takes owners of at most ${MYSQL_MAX_OWNER_BYTES} bytes (LockService's owner tokens), got ` +
        `${Buffer.byteLength(owner)}: lock through LockService, or pass a token of at most ${MYSQL_MAX_OWNER_BYTES} bytes.`,
    );
  }
  const entries = keys.map((key, i) => {
    const bytes = Buffer.from(key);
    if (bytes.length > MYSQL_MAX_KEY_BYTES) {
      throw new InvalidLockKeyError(
        `Lock key '${key.slice(0, 60)}…' is ${bytes.length} bytes long in UTF-8, over the ${MYSQL_MAX_KEY_BYTES} that the MySQL ` +
          `backend can index (an InnoDB index entry holds at most 3 072 bytes). Lock an identifier rather than a payload (or a ` +
          `hash of a long one), and set maxKeyLength in DistributedLockModule.forRoot() to refuse longer keys.`,
      );
    }
    return { key, hex: bytes.toString('hex'), limit: limits?.[i] ?? 1 };
  });
  entries.sort((a, b) => (a.hex < b.hex ? -1 : a.hex > b.hex ? 1 : 0));
  return {
    list: entries.map((e) => e.hex).join(','),
    limits: entries.every((e) => e.limit === 1)
      ? null
      : entries.map((e) => (e.limit === SHARED ? SHARED_LIMIT_SQL : String(e.limit))).join(','),
    byHex: new Map(entries.map((e) => [e.hex, e.key])),
  };
}

/** An owner column (VARBINARY) comes back as a Buffer. */
function ownerText(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}
