import {
  MYSQL_MAX_FENCING_TOKEN,
  MYSQL_MAX_HOLDER_BYTES,
  MYSQL_MAX_KEY_BYTES,
  MYSQL_MAX_OWNER_BYTES,
  TOKENS_EXHAUSTED,
  type MysqlLockNames,
} from './mysql.schema.js';

/**
 * The limit column's value for a shared (read) holder: the largest BIGINT UNSIGNED, above every
 * semaphore's permits (at most Number.MAX_SAFE_INTEGER), so "fewer holders than every limit" needs
 * no special case. Passed and read back as text: a JavaScript number does not hold it exactly.
 */
export const SHARED_LIMIT_SQL = '18446744073709551615';

/**
 * The stored procedures, each one statement from the client (one round trip) and one transaction
 * on the server, so a client that pauses or dies mid-call never holds a row lock. The safety
 * argument of the whole backend is on this page:
 *
 * - Every procedure first locks the row of each of its keys in the key table (`_lock_keys`: an
 *   insert that, on a duplicate key, takes the existing row's exclusive lock), in one global order
 *   (the keys' bytes), so two calls on a key run one after the other and calls on several keys do
 *   not deadlock with each other. Each read after it sees what the previous call on the key
 *   committed (READ COMMITTED, set for the procedure's own transaction). Only rows of its own keys
 *   are locked, by primary key: READ COMMITTED takes no gap locks, so two keys never wait for
 *   each other.
 * - A key has a row per holder (`_holders`, primary key (key, owner)), each with its own lease,
 *   expiring by the server's clock (UTC_TIMESTAMP(6), read after the key locks): a holder's row is
 *   free once `expires_at` has passed, whether or not anyone deleted it. `max_holders` is the
 *   holder's limit: 1 exclusive, n a semaphore of n permits, SHARED_LIMIT_SQL shared (read).
 * - A caller with limit L enters a key when nobody is ahead of it in the key's line and the key has
 *   fewer live holders than L and than every holder's limit. Limits above 1 that differ are a
 *   mismatch, reported and never waited for.
 * - Fencing tokens come from one AUTO_INCREMENT counter for every kind (`_fencing_tokens`, a row
 *   inserted and deleted in the acquiring transaction, after the key locks): a token is greater
 *   than every earlier one of its keys, and InnoDB keeps the counter across a restart or a crash
 *   (MySQL 8.0 and MariaDB 10.2.4 on, in the redo log), even when the table is empty.
 * - Waiters stand in a line per key (`_waiters`, ordered by `place`). A waiter for several keys
 *   stands in the lines of its keys up to the first that keeps it out, none after it, and keeps
 *   the place it has in a line as it moves on to the next. `_admit` lets in, from the head, exactly the waiters that can
 *   enter now, and stops at the first that cannot, so nobody passes it: a waiter for one key is
 *   handed the key there, in the releasing transaction, and its process finds the key its own
 *   when it next looks; a waiter for several keys stays at the head, where its process's look
 *   finds that it can enter, and asks again. Nobody else is woken. A waiter that stops asking
 *   loses its place at its `deadline`.
 *
 * - Who holds and waits (`holder`: `<instance>\n<site>`, as encodeIdentity makes it) is stored with
 *   the holder's row and the waiter's, with when the lease was taken (`acquired_at`) and when the
 *   place in line was (`since`), for inspect; no procedure decides anything by them. A hand-over
 *   carries the waiter's to its lease.
 *
 * Keys reach the procedures as a comma-separated list of hex strings (any bytes, NUL included,
 * arrive as they are), limits as a comma-separated list of numbers aligned with them, and keys
 * are stored in VARBINARY columns: keys compare byte for byte, never by a collation that takes
 * 'a' for 'A' or ignores trailing spaces.
 */
export function proceduresSql(n: MysqlLockNames): string[] {
  const key = `VARBINARY(${MYSQL_MAX_KEY_BYTES})`;
  const owner = `VARBINARY(${MYSQL_MAX_OWNER_BYTES})`;
  const holder = `VARBINARY(${MYSQL_MAX_HOLDER_BYTES})`;
  const list = 'MEDIUMTEXT CHARACTER SET ascii';
  const ms = (ts: string) => `CEIL(TIMESTAMPDIFF(MICROSECOND, now_ts, ${ts}) / 1000)`;
  const later = (from: string, ms: string) => `${from} + INTERVAL ${ms} * 1000 MICROSECOND`;
  const nth = (csv: string) => `SUBSTRING_INDEX(SUBSTRING_INDEX(${csv}, ',', i), ',', -1)`;
  const nthKey = `UNHEX(${nth('p_keys')})`;
  const nthLimit = `IF(p_limits IS NULL, 1, CAST(${nth('p_limits')} AS UNSIGNED))`;
  const count = `CHAR_LENGTH(p_keys) - CHAR_LENGTH(REPLACE(p_keys, ',', '')) + 1`;
  // Rolls back and passes the error on: a procedure never leaves a transaction open on the
  // connection (1205, a lock wait timeout, would otherwise roll back only its statement).
  const onError = 'DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;';
  const begin = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL ${n.lockKeys}(p_keys, now_ts);`;
  const nextToken = (into: string) => `INSERT INTO ${n.tokens} () VALUES ();
      SET ${into} = LAST_INSERT_ID();
      DELETE FROM ${n.tokens} WHERE id = ${into};`;
  // A lease its owner still holds (a request sent again, or a key handed over) keeps when it was
  // taken: set before expires_at, as later assignments read the values already assigned.
  const holderRow = (k: string, o: string, token: string, expires: string, limit: string, who: string, at: string) =>
    `INSERT INTO ${n.holders} (lock_key, owner, fencing_token, expires_at, max_holders, holder, acquired_at)
      VALUES (${k}, ${o}, ${token}, ${expires}, ${limit}, ${who}, ${at})
      ON DUPLICATE KEY UPDATE acquired_at = IF(expires_at > ${at}, COALESCE(acquired_at, ${at}), ${at}), fencing_token = ${token},
        expires_at = ${expires}, max_holders = ${limit}, holder = ${who};`;
  return [
    `DROP PROCEDURE IF EXISTS ${n.lockKeys}`,
    // Locks the key row of every key, creating the rows that are missing, in the order given (the
    // client sorts the keys by their bytes); then reads the server's clock. Its second parameter
    // also stops the procedures of the previous layout, which call it with one argument: see the
    // upgrade in mysql.schema.ts.
    `CREATE PROCEDURE ${n.lockKeys}(IN p_keys ${list}, OUT p_now DATETIME(6))
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  WHILE i <= n DO
    INSERT INTO ${n.locks} (lock_key, owner, fencing_token, expires_at) VALUES (${nthKey}, '', 0, '1970-01-01')
      ON DUPLICATE KEY UPDATE owner = owner;
    SET i = i + 1;
  END WHILE;
  SET p_now = UTC_TIMESTAMP(6);
END`,
    `DROP PROCEDURE IF EXISTS ${n.admit}`,
    // Lets in, from the head of the key's line, every waiter that can enter now, and stops at the
    // first that cannot: nobody passes it. A waiter for one key is handed the key here, with a
    // fencing token taken now, and its owner added to p_handed. A waiter for several keys (lease_ms
    // 0), one whose limit disagrees with the holders' (its attempt reports the mismatch), or one
    // no token is left for (its attempt names the fix) stays at the head, where its process's look
    // finds it. Called with the key locked, in the caller's transaction.
    `CREATE PROCEDURE ${n.admit}(IN p_key ${key}, IN p_now DATETIME(6), INOUT p_handed MEDIUMTEXT CHARACTER SET binary)
MODIFIES SQL DATA
BEGIN
  DECLARE holders BIGINT DEFAULT NULL;
  DECLARE least_limit BIGINT UNSIGNED;
  DECLARE shared_limit BIGINT UNSIGNED;
  DECLARE w_owner ${owner};
  DECLARE w_lease INT UNSIGNED;
  DECLARE w_limit BIGINT UNSIGNED;
  DECLARE w_holder ${holder};
  DECLARE handed BIGINT UNSIGNED;
  DELETE FROM ${n.waiters} WHERE lock_key = p_key AND deadline <= p_now;
  line: LOOP
    SET w_owner = (SELECT w.owner FROM ${n.waiters} w WHERE w.lock_key = p_key ORDER BY w.place LIMIT 1);
    IF w_owner IS NULL THEN
      LEAVE line;
    END IF;
    SELECT w.lease_ms, w.max_holders, w.holder INTO w_lease, w_limit, w_holder FROM ${n.waiters} w WHERE w.lock_key = p_key AND w.owner = w_owner;
    -- Read once someone waits: most releases find an empty line.
    IF holders IS NULL THEN
      SELECT COUNT(*), MIN(h.max_holders), MAX(IF(h.max_holders > 1, h.max_holders, NULL)) INTO holders, least_limit, shared_limit
        FROM ${n.holders} h WHERE h.lock_key = p_key AND h.expires_at > p_now;
    END IF;
    IF (w_limit > 1 AND shared_limit <> w_limit) OR holders >= LEAST(w_limit, COALESCE(least_limit, w_limit)) OR w_lease = 0 THEN
      LEAVE line;
    END IF;
    ${nextToken('handed')}
    IF handed > ${MYSQL_MAX_FENCING_TOKEN} THEN
      LEAVE line;
    END IF;
    ${holderRow('p_key', 'w_owner', 'handed', later('p_now', 'w_lease'), 'w_limit', 'w_holder', 'p_now')}
    DELETE FROM ${n.waiters} WHERE lock_key = p_key AND owner = w_owner;
    SET p_handed = CONCAT_WS(',', p_handed, w_owner);
    SET holders = holders + 1;
    SET least_limit = LEAST(COALESCE(least_limit, w_limit), w_limit);
    IF w_limit > 1 THEN
      SET shared_limit = w_limit;
    END IF;
  END LOOP;
END`,
    `DROP PROCEDURE IF EXISTS ${n.takeAs}`,
    // Takes every key or none, each with its limit (p_limits aligned with p_keys; NULL: all 1). A
    // key this owner already holds (a request resent after a timeout, or handed over by a release)
    // is taken as it is, with a new token. Answers (acquired, token, retry_after_ms, mismatch_key,
    // mismatch_limit, handed_to): when busy, the ms until a retry may succeed (the lease that must
    // end first, or the first waiter's place), after putting a caller that will wait in line; a
    // limit mismatch answers the key (hex) and its holders' limit, and leaves the line alone; a
    // caller that leaves the head of a line others may share lets in those behind it that can
    // enter (handed_to). p_holder is who asks, stored with the lease or the place in line.
    `CREATE PROCEDURE ${n.takeAs}(
  IN p_keys ${list}, IN p_owner ${owner}, IN p_ttl_ms INT, IN p_waiter_timeout_ms INT, IN p_will_wait BOOLEAN, IN p_limits ${list},
  IN p_holder ${holder}
)
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  DECLARE k ${key};
  DECLARE lim BIGINT UNSIGNED;
  DECLARE now_ts DATETIME(6);
  DECLARE retry_ms BIGINT DEFAULT NULL;
  DECLARE token BIGINT UNSIGNED;
  DECLARE holders BIGINT;
  DECLARE mine BOOLEAN;
  DECLARE least_limit BIGINT UNSIGNED;
  DECLARE shared_limit BIGINT UNSIGNED;
  DECLARE first_end DATETIME(6);
  DECLARE last_end DATETIME(6);
  DECLARE mismatch_key ${key} DEFAULT NULL;
  DECLARE mismatch_limit BIGINT UNSIGNED DEFAULT NULL;
  DECLARE kept BIGINT UNSIGNED DEFAULT NULL;
  DECLARE kept_count INT DEFAULT 0;
  DECLARE blocked INT DEFAULT NULL;
  DECLARE look_to INT;
  DECLARE head ${owner};
  DECLARE handed MEDIUMTEXT CHARACTER SET binary DEFAULT NULL;
  ${onError}
  ${begin}
  keys_loop: WHILE i <= n DO
    SET k = ${nthKey};
    SET lim = ${nthLimit};
    SELECT COUNT(*), COALESCE(MAX(h.owner = p_owner), FALSE), MIN(h.max_holders), MAX(IF(h.max_holders > 1, h.max_holders, NULL)),
           MIN(h.expires_at), MAX(IF(h.owner <> p_owner, h.expires_at, NULL))
      INTO holders, mine, least_limit, shared_limit, first_end, last_end
      FROM ${n.holders} h WHERE h.lock_key = k AND h.expires_at > now_ts;
    IF NOT mine THEN
      IF lim = 1 THEN
        -- Exclusive: any other live holder is in the way, and it waits for the last lease to end.
        IF last_end IS NOT NULL THEN
          SET retry_ms = GREATEST(COALESCE(retry_ms, 0), ${ms('last_end')});
          SET blocked = COALESCE(blocked, i);
        END IF;
      ELSEIF shared_limit <> lim THEN
        SET mismatch_key = k;
        SET mismatch_limit = shared_limit;
        LEAVE keys_loop;
      ELSEIF holders >= LEAST(lim, COALESCE(least_limit, lim)) THEN
        -- Behind an exclusive holder it waits for its lease; among several, for the first to end.
        SET retry_ms = GREATEST(COALESCE(retry_ms, 0), ${ms('IF(least_limit = 1, last_end, first_end)')});
        SET blocked = COALESCE(blocked, i);
      END IF;
    END IF;
    SET i = i + 1;
  END WHILE;
  -- Without a held key every line decides; with one, only the lines before it: one of them may
  -- keep the caller out sooner.
  IF mismatch_key IS NULL THEN
    SET i = 1;
    SET look_to = COALESCE(blocked - 1, n);
    WHILE i <= look_to DO
      SET k = ${nthKey};
      IF NOT EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.lock_key = k AND h.owner = p_owner AND h.expires_at > now_ts) THEN
        DELETE FROM ${n.waiters} WHERE lock_key = k AND deadline <= now_ts;
        SET head = (SELECT w.owner FROM ${n.waiters} w WHERE w.lock_key = k ORDER BY w.place LIMIT 1);
        IF head IS NOT NULL AND head <> p_owner THEN
          SET retry_ms = COALESCE((SELECT GREATEST(COALESCE(retry_ms, 0), ${ms('w.deadline')}) FROM ${n.waiters} w
            WHERE w.lock_key = k AND w.owner = head), retry_ms);
          IF blocked IS NULL OR blocked > i THEN
            SET blocked = i;
          END IF;
        END IF;
      END IF;
      SET i = i + 1;
    END WHILE;
  END IF;

  IF mismatch_key IS NOT NULL THEN
    COMMIT;
    SELECT 0 AS acquired, NULL AS token, NULL AS retry_after_ms, HEX(mismatch_key) AS mismatch_key,
      CAST(mismatch_limit AS CHAR) AS mismatch_limit, NULL AS handed_to;
  ELSEIF retry_ms IS NOT NULL THEN
    IF p_will_wait THEN
      -- A place in line up to the first key that keeps it out, none after it: a place in the line
      -- of a later key would keep that key from a holder of an earlier one that takes it next
      -- (sorted order), while this caller waits for the earlier one: both would wait until a wait
      -- ran out. So two waiters never wait for each other on keys that are free: one stands in a
      -- later line only once nobody ahead of it keeps it out of the earlier ones. A place it still
      -- has is kept (nobody who came later passes it); a line it joins has it at the back.
      SET i = 1;
      WHILE i <= blocked DO
        SET kept_count = kept_count + (SELECT COUNT(*) FROM ${n.waiters} w WHERE w.lock_key = ${nthKey} AND w.owner = p_owner AND w.deadline > now_ts);
        SET i = i + 1;
      END WHILE;
      IF kept_count < blocked THEN
        INSERT INTO ${n.places} () VALUES ();
        SET kept = LAST_INSERT_ID();
        DELETE FROM ${n.places} WHERE id = kept;
      END IF;
      -- A waiter for one key is handed the lock on release, with its ttl but no longer than its
      -- place lasts, so one that died in line holds the others up that long at most. The place is
      -- set before the deadline: an update reads the columns it already set. (No new place, 0, is
      -- only ever an update's: MySQL refuses a NULL before it finds the row.)
      SET i = 1;
      WHILE i <= blocked DO
        SET lim = ${nthLimit};
        INSERT INTO ${n.waiters} (lock_key, owner, place, deadline, lease_ms, max_holders, holder, since)
          VALUES (${nthKey}, p_owner, COALESCE(kept, 0), ${later('now_ts', 'p_waiter_timeout_ms')}, IF(n = 1, LEAST(p_ttl_ms, p_waiter_timeout_ms), 0), lim,
            p_holder, now_ts)
          ON DUPLICATE KEY UPDATE since = IF(deadline > now_ts, COALESCE(since, now_ts), now_ts), holder = p_holder,
            place = IF(deadline > now_ts, place, kept), deadline = ${later('now_ts', 'p_waiter_timeout_ms')},
            lease_ms = IF(n = 1, LEAST(p_ttl_ms, p_waiter_timeout_ms), 0), max_holders = lim;
        SET i = i + 1;
      END WHILE;
      -- A place an earlier attempt took in a later line, while the keys before it let it in: it
      -- goes, and whoever it kept out there may enter now.
      WHILE i <= n DO
        SET k = ${nthKey};
        DELETE FROM ${n.waiters} WHERE lock_key = k AND owner = p_owner;
        IF ROW_COUNT() > 0 THEN
          CALL ${n.admit}(k, now_ts, handed);
        END IF;
        SET i = i + 1;
      END WHILE;
    END IF;
    COMMIT;
    SELECT 0 AS acquired, NULL AS token, GREATEST(retry_ms, 0) AS retry_after_ms, NULL AS mismatch_key, NULL AS mismatch_limit,
      handed AS handed_to;
  ELSE
    ${nextToken('token')}
    IF token > ${MYSQL_MAX_FENCING_TOKEN} THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '${TOKENS_EXHAUSTED}';
    END IF;
    SET i = 1;
    WHILE i <= n DO
      SET k = ${nthKey};
      SET lim = ${nthLimit};
      ${holderRow('k', 'p_owner', 'token', later('now_ts', 'p_ttl_ms'), 'lim', 'p_holder', 'now_ts')}
      DELETE FROM ${n.waiters} WHERE lock_key = k AND owner = p_owner;
      -- It stood at the head of a line where others may enter beside it: those behind it that can.
      IF ROW_COUNT() > 0 AND lim <> 1 THEN
        CALL ${n.admit}(k, now_ts, handed);
      END IF;
      SET i = i + 1;
    END WHILE;
    COMMIT;
    SELECT 1 AS acquired, token, NULL AS retry_after_ms, NULL AS mismatch_key, NULL AS mismatch_limit, handed AS handed_to;
  END IF;
END`,
    `DROP PROCEDURE IF EXISTS ${n.take}`,
    // The acquire of the release before who holds was stored, for its processes still running on
    // these tables (or started on them later): who asks is not known.
    `CREATE PROCEDURE ${n.take}(
  IN p_keys ${list}, IN p_owner ${owner}, IN p_ttl_ms INT, IN p_waiter_timeout_ms INT, IN p_will_wait BOOLEAN, IN p_limits ${list}
)
MODIFIES SQL DATA
BEGIN
  CALL ${n.takeAs}(p_keys, p_owner, p_ttl_ms, p_waiter_timeout_ms, p_will_wait, p_limits, NULL);
END`,
    `DROP PROCEDURE IF EXISTS ${n.acquire}`,
    // The previous layout's signature, for a process of an older release still running: it takes
    // keys as an exclusive caller of the same line.
    `CREATE PROCEDURE ${n.acquire}(
  IN p_keys ${list}, IN p_owner ${owner}, IN p_ttl_ms INT, IN p_waiter_timeout_ms INT, IN p_will_wait BOOLEAN
)
MODIFIES SQL DATA
BEGIN
  CALL ${n.take}(p_keys, p_owner, p_ttl_ms, p_waiter_timeout_ms, p_will_wait, NULL);
END`,
    `DROP PROCEDURE IF EXISTS ${n.extend}`,
    // Resets the lease of every key if the owner still holds all of them; else changes nothing.
    `CREATE PROCEDURE ${n.extend}(IN p_keys ${list}, IN p_owner ${owner}, IN p_ttl_ms INT)
MODIFIES SQL DATA
BEGIN
  DECLARE i INT DEFAULT 1;
  DECLARE n INT DEFAULT ${count};
  DECLARE held INT DEFAULT 0;
  DECLARE now_ts DATETIME(6);
  ${onError}
  ${begin}
  WHILE i <= n DO
    SET held = held + (SELECT COUNT(*) FROM ${n.holders} h WHERE h.lock_key = ${nthKey} AND h.owner = p_owner AND h.expires_at > now_ts);
    SET i = i + 1;
  END WHILE;
  IF held = n THEN
    SET i = 1;
    WHILE i <= n DO
      UPDATE ${n.holders} SET expires_at = ${later('now_ts', 'p_ttl_ms')} WHERE lock_key = ${nthKey} AND owner = p_owner;
      SET i = i + 1;
    END WHILE;
  END IF;
  COMMIT;
  SELECT held = n AS extended;
END`,
    `DROP PROCEDURE IF EXISTS ${n.release}`,
    // Compare-and-delete: frees the keys the owner still holds (a late release never frees another
    // owner's lease) and takes the owner out of their lines (a waiter that gives up). Then lets in
    // whoever can enter now (see _admit). Answers how many unexpired leases the owner held, and
    // the waiters handed a key, comma-separated (their process may be the caller's).
    `CREATE PROCEDURE ${n.release}(IN p_keys ${list}, IN p_owner ${owner})
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
  DECLARE handed MEDIUMTEXT CHARACTER SET binary DEFAULT NULL;
  ${onError}
  ${begin}
  WHILE i <= n DO
    SET k = ${nthKey};
    SET live = (SELECT h.expires_at > now_ts FROM ${n.holders} h WHERE h.lock_key = k AND h.owner = p_owner);
    DELETE FROM ${n.holders} WHERE lock_key = k AND owner = p_owner;
    SET held = ROW_COUNT() > 0;
    IF live THEN
      SET released = released + 1;
    END IF;
    DELETE FROM ${n.waiters} WHERE lock_key = k AND owner = p_owner;
    SET waited = ROW_COUNT() > 0;
    IF held OR waited THEN
      CALL ${n.admit}(k, now_ts, handed);
    END IF;
    SET i = i + 1;
  END WHILE;
  COMMIT;
  SELECT released, handed AS handed_to;
END`,
  ];
}

/**
 * The procedures proceduresSql() makes, by name as information_schema lists them: the tables'
 * comments say which release made them, these say they are all still there.
 */
export function procedureNames(n: MysqlLockNames): string[] {
  return proceduresSql(n).flatMap((sql) => /^CREATE PROCEDURE `([^`]+)`/.exec(sql)?.[1] ?? []);
}
