import { InvalidLockOptionsError } from '../../lock.errors.js';
import { MAX_IDENTITY_BYTES } from '../../lock-identity.js';
import { resolveMysqlOptions } from './mysql.options.js';
import { proceduresSql } from './mysql.procedures.js';

/** The names the backend uses in SQL, quoted. `table` is a checked name, so quoting needs no escaping. */
export interface MysqlLockNames {
  /** The lock table's name, unquoted, as information_schema and messages take it. */
  readonly table: string;
  /** The key table: a row per key, which every call on the key locks first (see mysql.procedures.ts). */
  readonly locks: string;
  /** A row per holder of a key. */
  readonly holders: string;
  readonly waiters: string;
  readonly tokens: string;
  readonly places: string;
  readonly lockKeys: string;
  readonly admit: string;
  /** The previous release's acquire (without who asks), kept for its processes (see mysql.procedures.ts). */
  readonly take: string;
  /** Acquire, with who asks: what this release calls. */
  readonly takeAs: string;
  /** The previous layout's acquire, kept for its processes (see mysql.procedures.ts). */
  readonly acquire: string;
  readonly extend: string;
  readonly release: string;
  readonly upgrade: string;
}

export function lockNames(table: string): MysqlLockNames {
  const name = (suffix: string) => `\`${table}${suffix}\``;
  return {
    table,
    locks: name(''),
    holders: name('_holders'),
    waiters: name('_waiters'),
    tokens: name('_fencing_tokens'),
    places: name('_waiter_places'),
    lockKeys: name('_lock_keys'),
    admit: name('_admit'),
    take: name('_take'),
    takeAs: name('_take_as'),
    acquire: name('_acquire'),
    extend: name('_extend'),
    release: name('_release'),
    upgrade: name('_upgrade'),
  };
}

/** The version of the tables' layout this release reads and writes (see MYSQL_SCHEMA_VERSION). */
export const MYSQL_SCHEMA_LAYOUT = 2;

/**
 * Stored as the comment of the waiters table (`<table>_waiters`), set after everything else: the
 * procedures and the columns they use change within a version of the tables when their rules do
 * (revision 2: who holds and waits, in nullable columns; a waiter for several keys stands in line
 * only up to the first key that keeps it out). Releases before a revision run on tables of a later
 * one (they neither read nor write the new columns, and call the procedures by names that stay),
 * so a revision does not change the version, which those releases would take for a later layout
 * and refuse. The backend puts the procedures back when the tables are at this version but of an
 * earlier revision (or none: before revision 2); set last, the comment is found only once a
 * process that did so got to the end, even one that crashed part-way through.
 */
export const MYSQL_PROCEDURES_REVISION = 'nest-distributed-lock procedures, revision 2';

/**
 * Stored as the comment of the holders table (`<table>_holders`): the backend checks it on first
 * use, brings tables of an earlier layout to this one in place, and refuses tables of a later one.
 * A later version that changes the tables changes it too.
 */
export const MYSQL_SCHEMA_VERSION = `nest-distributed-lock lock table, version ${MYSQL_SCHEMA_LAYOUT}`;

/**
 * The comment of the key table (`<table>`), which stays as the first release wrote it: a process
 * of that release checks this comment alone, and finding anything else it would put its own
 * procedures back, which know nothing of shared holders. Finding it, it calls the procedures of
 * this layout by their old names, as an exclusive caller.
 */
export const MYSQL_KEY_TABLE_COMMENT = 'nest-distributed-lock lock table, version 1';

/** The layout a version comment names, or undefined when it is not one of ours. */
export function mysqlSchemaLayout(comment: unknown): number | undefined {
  const match = typeof comment === 'string' ? /^nest-distributed-lock lock table, version (\d+)$/.exec(comment) : null;
  return match ? Number(match[1]) : undefined;
}

/**
 * Tables of a later layout were made by a newer release, whose rules (who may hold a key beside
 * whom) this one does not know: taking keys there, or putting this version's procedures back,
 * could let two processes hold one key. Says so, for a version comment of a later layout.
 */
export function newerMysqlLayoutRefusal(comment: unknown, table: string): string | undefined {
  const layout = mysqlSchemaLayout(comment);
  if (layout === undefined || layout <= MYSQL_SCHEMA_LAYOUT) return undefined;
  return (
    `the lock table ${table} is at version ${layout}, made by a newer release of nest-distributed-lock than this one ` +
    `(version ${MYSQL_SCHEMA_LAYOUT}): update nest-distributed-lock in this application, as every process that locks through ` +
    `one table must run a release that knows its version.`
  );
}

/**
 * The longest key, in bytes (UTF-8), the backend takes: a waiter's row is indexed on (key, owner),
 * and an InnoDB index entry holds at most 3 072 bytes (DYNAMIC rows, 16 kB pages), each
 * VARBINARY column counting two bytes of length: 3 034 + 2 + 34 + 2.
 */
export const MYSQL_MAX_KEY_BYTES = 3_034;
/** The longest owner: LockService's owner tokens (32 hex characters). */
export const MYSQL_MAX_OWNER_BYTES = 32;
/** The longest identity stored (`instance`, a line feed, `site`: see encodeIdentity), in bytes. */
export const MYSQL_MAX_HOLDER_BYTES = MAX_IDENTITY_BYTES;

/** The greatest fencing token: a JavaScript number holds tokens exactly up to here. */
export const MYSQL_MAX_FENCING_TOKEN = Number.MAX_SAFE_INTEGER;

/** The SQLSTATE and message start the token check raises (see mysql.procedures.ts). */
export const TOKENS_EXHAUSTED = 'nest-distributed-lock: fencing tokens exhausted';

/**
 * The statements that create the lock tables and procedures, in order, for a migration of your own
 * (TypeORM, Knex, Flyway, ...): run each one (`for (const sql of mysqlLockTablesSql()) await
 * queryRunner.query(sql)`), then give the backend `createTables: false` and the same `table`.
 * Safe to run again (tables are created only when missing, tables of the previous layout are
 * brought to this one in place, procedures are replaced). One
 * statement each, so no `DELIMITER` is needed; the `mysql` command-line client, which splits on
 * `;`, needs `DELIMITER //` around the procedures. Without a migration the backend runs the same
 * statements on first use.
 */
export function mysqlLockTablesSql(options?: { table?: string }): string[] {
  if (options !== undefined && (typeof options !== 'object' || options === null)) {
    throw new InvalidLockOptionsError('(options)', `mysqlLockTablesSql: options must be { table? }, got ${String(options)}.`);
  }
  for (const name of Object.keys(options ?? {})) {
    if (name !== 'table') throw new InvalidLockOptionsError(name, `mysqlLockTablesSql: unknown option '${name}'. Accepted options: table.`);
  }
  return tablesSql(resolveMysqlOptions(options).table);
}

/**
 * The tables, the steps that bring the tables of the previous layout (one lease per key, in the
 * key's row) to this one in place, and the procedures (see mysql.procedures.ts).
 *
 * The upgrade keeps a process of the previous release that is still running safe. It calls the
 * procedures by name, and its acquire, extend and release all start by calling `_lock_keys` with
 * one argument. Replaced first, `_lock_keys` takes two: from then on each of those calls fails
 * (and is retried by its caller) instead of granting a lease in the old place. A call already
 * past its key locks holds its transaction open on the key table; the ALTER TABLE that follows
 * waits for every such transaction to end. Only then are the old leases moved to the holders
 * table, and the old names replaced by procedures of this layout, which take keys as exclusive
 * callers of the same line. The key table's comment stays what that release checks (see
 * MYSQL_KEY_TABLE_COMMENT); the holders table's comment, set last, tells this release that
 * everything is in place.
 */
function tablesSql(table: string): string[] {
  const n = lockNames(table);
  const key = `VARBINARY(${MYSQL_MAX_KEY_BYTES})`;
  const owner = `VARBINARY(${MYSQL_MAX_OWNER_BYTES})`;
  const holder = `VARBINARY(${MYSQL_MAX_HOLDER_BYTES})`;
  // Adds a column to a table of an earlier release that lacks it (MySQL has no ADD COLUMN IF NOT EXISTS).
  const addColumn = (suffix: string, column: string, type: string) => `IF NOT EXISTS (SELECT 1 FROM information_schema.COLUMNS
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '${table}${suffix}' AND COLUMN_NAME = '${column}') THEN
    ALTER TABLE \`${table}${suffix}\` ADD COLUMN ${column} ${type} NULL;
  END IF;`;
  const [dropLockKeys, createLockKeys, ...procedures] = proceduresSql(n);
  return [
    // One row per key locked and not swept yet: its lock, which serialises the calls on the key.
    // Its lease columns are the previous layout's, still read by that release's processes.
    `CREATE TABLE IF NOT EXISTS ${n.locks} (
  lock_key ${key} NOT NULL PRIMARY KEY,
  owner ${owner} NOT NULL,
  fencing_token BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC COMMENT = '${MYSQL_KEY_TABLE_COMMENT}'`,
    // One row per holder of a key (or expired lease, not yet deleted): several for a shared lock or
    // a semaphore, each with its own lease, and the limit it holds with (max_holders: 1 exclusive,
    // n permits, the largest BIGINT UNSIGNED shared).
    `CREATE TABLE IF NOT EXISTS ${n.holders} (
  lock_key ${key} NOT NULL,
  owner ${owner} NOT NULL,
  fencing_token BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  max_holders BIGINT UNSIGNED NOT NULL DEFAULT 1,
  holder ${holder} NULL,
  acquired_at DATETIME(6) NULL,
  PRIMARY KEY (lock_key, owner)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC`,
    // One row per waiter and key it waits for: its place in the key's line, when it loses it
    // unless it asks again, the lease a release hands it the lock with (0: a waiter for several
    // keys, which asks again), and its limit.
    `CREATE TABLE IF NOT EXISTS ${n.waiters} (
  lock_key ${key} NOT NULL,
  owner ${owner} NOT NULL,
  place BIGINT UNSIGNED NOT NULL,
  deadline DATETIME(6) NOT NULL,
  lease_ms INT UNSIGNED NOT NULL,
  max_holders BIGINT UNSIGNED NOT NULL DEFAULT 1,
  holder ${holder} NULL,
  since DATETIME(6) NULL,
  PRIMARY KEY (lock_key, owner),
  KEY line (lock_key, place)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC`,
    // Counters: an AUTO_INCREMENT value is taken by inserting a row, which is deleted at once.
    `CREATE TABLE IF NOT EXISTS ${n.tokens} (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB`,
    `CREATE TABLE IF NOT EXISTS ${n.places} (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB`,
    dropLockKeys,
    createLockKeys,
    // Waits for the calls of the previous layout already past their key locks (see above).
    `ALTER TABLE ${n.locks} COMMENT = '${MYSQL_KEY_TABLE_COMMENT}'`,
    `DROP PROCEDURE IF EXISTS ${n.upgrade}`,
    `CREATE PROCEDURE ${n.upgrade}()
MODIFIES SQL DATA
BEGIN
  -- The previous layout's waiters had no limit: exclusive callers.
  IF NOT EXISTS (SELECT 1 FROM information_schema.COLUMNS
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '${table}_waiters' AND COLUMN_NAME = 'max_holders') THEN
    ALTER TABLE ${n.waiters} ADD COLUMN max_holders BIGINT UNSIGNED NOT NULL DEFAULT 1;
  END IF;
  -- Who holds and waits, for inspect (docs/inspection.md): nullable columns without a default, which
  -- releases before them neither write nor read, so they run on these tables unchanged (a rolling
  -- upgrade, or a rollback).
  ${addColumn('_waiters', 'holder', holder)}
  ${addColumn('_waiters', 'since', 'DATETIME(6)')}
  ${addColumn('_holders', 'holder', holder)}
  ${addColumn('_holders', 'acquired_at', 'DATETIME(6)')}
  -- Its leases, one per key in the key's row, become exclusive holders, with their tokens.
  INSERT INTO ${n.holders} (lock_key, owner, fencing_token, expires_at, max_holders)
    SELECT l.lock_key, l.owner, l.fencing_token, l.expires_at, 1 FROM ${n.locks} l WHERE l.owner <> '' AND l.expires_at > UTC_TIMESTAMP(6)
    ON DUPLICATE KEY UPDATE fencing_token = VALUES(fencing_token), expires_at = VALUES(expires_at), max_holders = 1;
  UPDATE ${n.locks} SET owner = '', fencing_token = 0, expires_at = '1970-01-01' WHERE owner <> '';
END`,
    `CALL ${n.upgrade}()`,
    `DROP PROCEDURE ${n.upgrade}`,
    ...procedures,
    `ALTER TABLE ${n.holders} COMMENT = '${MYSQL_SCHEMA_VERSION}'`,
    `ALTER TABLE ${n.waiters} COMMENT = '${MYSQL_PROCEDURES_REVISION}'`,
  ];
}
