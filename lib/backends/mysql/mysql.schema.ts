import { InvalidLockOptionsError } from '../../lock.errors.js';
import { resolveMysqlOptions } from './mysql.options.js';

/** The names the backend uses in SQL, quoted. `table` is a checked name, so quoting needs no escaping. */
export interface MysqlLockNames {
  /** The lock table's name, unquoted, as information_schema and messages take it. */
  readonly table: string;
  readonly locks: string;
  readonly waiters: string;
  readonly tokens: string;
  readonly places: string;
  readonly lockKeys: string;
  readonly acquire: string;
  readonly extend: string;
  readonly release: string;
}

export function lockNames(table: string): MysqlLockNames {
  const name = (suffix: string) => `\`${table}${suffix}\``;
  return {
    table,
    locks: name(''),
    waiters: name('_waiters'),
    tokens: name('_fencing_tokens'),
    places: name('_waiter_places'),
    lockKeys: name('_lock_keys'),
    acquire: name('_acquire'),
    extend: name('_extend'),
    release: name('_release'),
  };
}

/**
 * Stored as the lock table's comment: the backend checks it on first use and creates what is
 * missing when it differs. A later version that changes the tables changes it too.
 */
export const MYSQL_SCHEMA_VERSION = 'nest-distributed-lock lock table, version 1';

/**
 * The longest key, in bytes (UTF-8), the backend takes: a waiter's row is indexed on (key, owner),
 * and an InnoDB index entry holds at most 3 072 bytes (DYNAMIC rows, 16 kB pages), each
 * VARBINARY column counting two bytes of length: 3 034 + 2 + 34 + 2.
 */
export const MYSQL_MAX_KEY_BYTES = 3_034;
/** The longest owner: LockService's owner tokens (32 hex characters). */
export const MYSQL_MAX_OWNER_BYTES = 32;

/** The greatest fencing token: a JavaScript number holds tokens exactly up to here. */
export const MYSQL_MAX_FENCING_TOKEN = Number.MAX_SAFE_INTEGER;

/** The SQLSTATE and message start the token check raises (see tablesSql). */
export const TOKENS_EXHAUSTED = 'nest-distributed-lock: fencing tokens exhausted';

/**
 * The statements that create the lock tables and procedures, in order, for a migration of your own
 * (TypeORM, Knex, Flyway, ...): run each one (`for (const sql of mysqlLockTablesSql()) await
 * queryRunner.query(sql)`), then give the backend `createTables: false` and the same `table`.
 * Safe to run again (tables are created only when missing; procedures are replaced). One
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
 * The whole safety argument of the MySQL backend is on this page: three procedures, each one
 * statement from the client (one round trip) and one transaction on the server, so a client that
 * pauses or dies mid-call never holds a row lock.
 *
 * - Every procedure first locks the lease row of each of its keys (`_lock_keys`: an insert that,
 *   on a duplicate key, takes the existing row's exclusive lock), in one global order (the keys'
 *   bytes), so two calls on a key run one after the other and calls on several keys do not
 *   deadlock with each other. Each read after it sees what the previous call on the key
 *   committed (READ COMMITTED, set for the procedure's own transaction). Only rows of its own keys
 *   are locked, by primary key: READ COMMITTED takes no gap locks, so two keys never wait for
 *   each other.
 * - Leases expire by the server's clock (UTC_TIMESTAMP(6), read after the key locks): a lease
 *   row is free once `expires_at` has passed, whether or not anyone deleted it. A free row stays
 *   as the key's lock (owner '').
 * - Fencing tokens come from one AUTO_INCREMENT counter (`_fencing_tokens`, a row inserted and
 *   deleted in the acquiring transaction): a token is greater than every earlier one of its keys,
 *   and InnoDB keeps the counter across a restart or a crash (MySQL 8.0 and MariaDB 10.2.4 on,
 *   in the redo log), even when the table is empty.
 * - Waiters stand in a line per key (`_waiters`, ordered by `place`, one number per waiter, the
 *   same in each line it stands in). A free key goes to the first waiter that still has its
 *   place; a release hands a one-key waiter the lock right there, in its own transaction, and
 *   the waiter's process finds it its own when it next looks. A waiter that stops asking loses
 *   its place at its `deadline`.
 *
 * Keys reach the procedures as a comma-separated list of hex strings (any bytes, NUL included,
 * arrive as they are), and are stored in VARBINARY columns: keys compare byte for byte, never
 * by a collation that takes 'a' for 'A' or ignores trailing spaces.
 */
function tablesSql(table: string): string[] {
  const n = lockNames(table);
  const key = `VARBINARY(${MYSQL_MAX_KEY_BYTES})`;
  const owner = `VARBINARY(${MYSQL_MAX_OWNER_BYTES})`;
  const ms = (ts: string) => `CEIL(TIMESTAMPDIFF(MICROSECOND, now_ts, ${ts}) / 1000)`;
  const later = (ms: string) => `now_ts + INTERVAL ${ms} * 1000 MICROSECOND`;
  const nth = `UNHEX(SUBSTRING_INDEX(SUBSTRING_INDEX(p_keys, ',', i), ',', -1))`;
  const count = `CHAR_LENGTH(p_keys) - CHAR_LENGTH(REPLACE(p_keys, ',', '')) + 1`;
  // Rolls back and passes the error on: a procedure never leaves a transaction open on the
  // connection (1205, a lock wait timeout, would otherwise roll back only its statement).
  const onError = 'DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;';
  const begin = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL ${n.lockKeys}(p_keys);
  SET now_ts = UTC_TIMESTAMP(6);`;
  const takeToken = (into: string) => `INSERT INTO ${n.tokens} () VALUES ();
      SET ${into} = LAST_INSERT_ID();
      DELETE FROM ${n.tokens} WHERE id = ${into};
      IF ${into} > ${MYSQL_MAX_FENCING_TOKEN} THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '${TOKENS_EXHAUSTED}';
      END IF;`;
  return [
    // One row per key ever locked and not swept yet: its lease (owner '' and an expiry in the past
    // when free). Its lock serialises the calls on the key.
    `CREATE TABLE IF NOT EXISTS ${n.locks} (
  lock_key ${key} NOT NULL PRIMARY KEY,
  owner ${owner} NOT NULL,
  fencing_token BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC`,
    // One row per waiter and key it waits for: its place in the key's line, when it loses it
    // unless it asks again, and the lease a release hands it the lock with (0: a waiter for
    // several keys, which asks again).
    `CREATE TABLE IF NOT EXISTS ${n.waiters} (
  lock_key ${key} NOT NULL,
  owner ${owner} NOT NULL,
  place BIGINT UNSIGNED NOT NULL,
  deadline DATETIME(6) NOT NULL,
  lease_ms INT UNSIGNED NOT NULL,
  PRIMARY KEY (lock_key, owner),
  KEY line (lock_key, place)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC`,
    // Counters: an AUTO_INCREMENT value is taken by inserting a row, which is deleted at once.
    `CREATE TABLE IF NOT EXISTS ${n.tokens} (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB`,
    `CREATE TABLE IF NOT EXISTS ${n.places} (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB`,
    `DROP PROCEDURE IF EXISTS ${n.lockKeys}`,
    // Locks the lease row of every key, creating the rows that are missing, in the order given
    // (the client sorts the keys by their bytes).
    `CREATE PROCEDURE ${n.lockKeys}(IN p_keys MEDIUMTEXT CHARACTER SET ascii)
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  WHILE i <= n DO
    INSERT INTO ${n.locks} (lock_key, owner, fencing_token, expires_at) VALUES (${nth}, '', 0, '1970-01-01')
      ON DUPLICATE KEY UPDATE owner = owner;
    SET i = i + 1;
  END WHILE;
END`,
    `DROP PROCEDURE IF EXISTS ${n.acquire}`,
    // Takes every key or none. A free key goes to the first waiter in its line: a process that
    // releases and asks again at once does not starve the others. A key this owner already holds
    // (a request resent after a timeout, or handed over by a release) is taken as it is, with a
    // new token. Answers (acquired, token, retry_after_ms): when busy, the ms until a retry may
    // succeed (the holder's remaining lease, or the first waiter's place), after putting a caller
    // that will wait in line.
    `CREATE PROCEDURE ${n.acquire}(
  IN p_keys MEDIUMTEXT CHARACTER SET ascii, IN p_owner ${owner}, IN p_ttl_ms INT, IN p_waiter_timeout_ms INT, IN p_will_wait BOOLEAN
)
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  DECLARE k ${key};
  DECLARE now_ts DATETIME(6);
  DECLARE retry_ms BIGINT DEFAULT NULL;
  DECLARE token BIGINT UNSIGNED;
  DECLARE kept BIGINT UNSIGNED DEFAULT NULL;
  DECLARE kept_count INT DEFAULT 0;
  DECLARE kept_differs BOOLEAN DEFAULT FALSE;
  DECLARE place BIGINT UNSIGNED;
  DECLARE head ${owner};
  ${onError}
  ${begin}
  WHILE i <= n DO
    SET k = ${nth};
    -- A scalar subquery without a row is NULL: a free key leaves what earlier keys found.
    SET retry_ms = COALESCE((SELECT GREATEST(COALESCE(retry_ms, 0), ${ms('l.expires_at')}) FROM ${n.locks} l
      WHERE l.lock_key = k AND l.expires_at > now_ts AND l.owner <> p_owner), retry_ms);
    SET i = i + 1;
  END WHILE;
  IF retry_ms IS NULL THEN
    SET i = 1;
    WHILE i <= n DO
      SET k = ${nth};
      IF NOT EXISTS (SELECT 1 FROM ${n.locks} l WHERE l.lock_key = k AND l.owner = p_owner AND l.expires_at > now_ts) THEN
        DELETE FROM ${n.waiters} WHERE lock_key = k AND deadline <= now_ts;
        SET head = (SELECT w.owner FROM ${n.waiters} w WHERE w.lock_key = k ORDER BY w.place LIMIT 1);
        IF head IS NOT NULL AND head <> p_owner THEN
          SET retry_ms = COALESCE((SELECT GREATEST(COALESCE(retry_ms, 0), ${ms('w.deadline')}) FROM ${n.waiters} w
            WHERE w.lock_key = k AND w.owner = head), retry_ms);
        END IF;
      END IF;
      SET i = i + 1;
    END WHILE;
  END IF;

  IF retry_ms IS NOT NULL THEN
    IF p_will_wait THEN
      -- One place per waiter, the same in all its lines: two waiters then stand in the same order in
      -- every line they share, so neither waits for the other on keys that are free. One that lost
      -- its place in any line takes a new one, at the back of all of them.
      SET i = 1;
      WHILE i <= n DO
        SET k = ${nth};
        SET place = (SELECT w.place FROM ${n.waiters} w WHERE w.lock_key = k AND w.owner = p_owner AND w.deadline > now_ts);
        IF place IS NOT NULL THEN
          SET kept_count = kept_count + 1;
          SET kept_differs = kept_differs OR (kept IS NOT NULL AND kept <> place);
          SET kept = place;
        END IF;
        SET i = i + 1;
      END WHILE;
      IF kept_count < n OR kept_differs THEN
        INSERT INTO ${n.places} () VALUES ();
        SET kept = LAST_INSERT_ID();
        DELETE FROM ${n.places} WHERE id = kept;
      END IF;
      -- A waiter for one key is handed the lock on release, with its ttl but no longer than its
      -- place lasts, so one that died in line holds the others up that long at most.
      SET i = 1;
      WHILE i <= n DO
        INSERT INTO ${n.waiters} (lock_key, owner, place, deadline, lease_ms)
          VALUES (${nth}, p_owner, kept, ${later('p_waiter_timeout_ms')}, IF(n = 1, LEAST(p_ttl_ms, p_waiter_timeout_ms), 0))
          ON DUPLICATE KEY UPDATE place = kept, deadline = ${later('p_waiter_timeout_ms')},
            lease_ms = IF(n = 1, LEAST(p_ttl_ms, p_waiter_timeout_ms), 0);
        SET i = i + 1;
      END WHILE;
    END IF;
    COMMIT;
    SELECT 0 AS acquired, NULL AS token, GREATEST(retry_ms, 0) AS retry_after_ms;
  ELSE
    ${takeToken('token')}
    SET i = 1;
    WHILE i <= n DO
      SET k = ${nth};
      UPDATE ${n.locks} SET owner = p_owner, fencing_token = token, expires_at = ${later('p_ttl_ms')} WHERE lock_key = k;
      DELETE FROM ${n.waiters} WHERE lock_key = k AND owner = p_owner;
      SET i = i + 1;
    END WHILE;
    COMMIT;
    SELECT 1 AS acquired, token, NULL AS retry_after_ms;
  END IF;
END`,
    `DROP PROCEDURE IF EXISTS ${n.extend}`,
    // Resets the lease of every key if the owner still holds all of them; else changes nothing.
    `CREATE PROCEDURE ${n.extend}(IN p_keys MEDIUMTEXT CHARACTER SET ascii, IN p_owner ${owner}, IN p_ttl_ms INT)
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  DECLARE held INT DEFAULT 0;
  DECLARE now_ts DATETIME(6);
  ${onError}
  ${begin}
  WHILE i <= n DO
    SET held = held + (SELECT COUNT(*) FROM ${n.locks} l WHERE l.lock_key = ${nth} AND l.owner = p_owner AND l.expires_at > now_ts);
    SET i = i + 1;
  END WHILE;
  IF held = n THEN
    SET i = 1;
    WHILE i <= n DO
      UPDATE ${n.locks} SET expires_at = ${later('p_ttl_ms')} WHERE lock_key = ${nth} AND owner = p_owner;
      SET i = i + 1;
    END WHILE;
  END IF;
  COMMIT;
  SELECT held = n AS extended;
END`,
    `DROP PROCEDURE IF EXISTS ${n.release}`,
    // Compare-and-delete: frees the keys the owner still holds (a late release never frees another
    // owner's lock) and takes the owner out of their lines (a waiter that gives up). Then, if the
    // key is free, hands it to the first waiter for this key alone, with a token taken now, in
    // this transaction: its process finds the lock its own when it next looks. A waiter for
    // several keys is left first in line, and asks again. Answers how many unexpired leases the
    // owner held, and the last waiter handed a key (its process may be the caller's).
    `CREATE PROCEDURE ${n.release}(IN p_keys MEDIUMTEXT CHARACTER SET ascii, IN p_owner ${owner})
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  DECLARE k ${key};
  DECLARE now_ts DATETIME(6);
  DECLARE held BOOLEAN;
  DECLARE live BOOLEAN;
  DECLARE waited BOOLEAN;
  DECLARE released INT DEFAULT 0;
  DECLARE head ${owner};
  DECLARE head_lease INT UNSIGNED;
  DECLARE handed BIGINT UNSIGNED;
  DECLARE handed_to ${owner} DEFAULT NULL;
  ${onError}
  ${begin}
  WHILE i <= n DO
    SET k = ${nth};
    SELECT l.owner = p_owner, l.expires_at > now_ts INTO held, live FROM ${n.locks} l WHERE l.lock_key = k;
    IF held THEN
      SET released = released + live;
      UPDATE ${n.locks} SET owner = '', expires_at = '1970-01-01' WHERE lock_key = k;
      SET live = FALSE;
    END IF;
    DELETE FROM ${n.waiters} WHERE lock_key = k AND owner = p_owner;
    SET waited = ROW_COUNT() > 0;
    IF held OR (waited AND NOT live) THEN
      DELETE FROM ${n.waiters} WHERE lock_key = k AND deadline <= now_ts;
      SET head = (SELECT w.owner FROM ${n.waiters} w WHERE w.lock_key = k ORDER BY w.place LIMIT 1);
      SET head_lease = (SELECT w.lease_ms FROM ${n.waiters} w WHERE w.lock_key = k AND w.owner = head);
      IF head IS NOT NULL AND head_lease > 0 THEN
        ${takeToken('handed')}
        UPDATE ${n.locks} SET owner = head, fencing_token = handed, expires_at = ${later('head_lease')} WHERE lock_key = k;
        DELETE FROM ${n.waiters} WHERE lock_key = k AND owner = head;
        SET handed_to = head;
      END IF;
    END IF;
    SET i = i + 1;
  END WHILE;
  COMMIT;
  SELECT released, handed_to;
END`,
    `ALTER TABLE ${n.locks} COMMENT = '${MYSQL_SCHEMA_VERSION}'`,
  ];
}
