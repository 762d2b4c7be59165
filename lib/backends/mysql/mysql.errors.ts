import type { MysqlLockNames } from './mysql.schema.js';
import { MYSQL_MAX_FENCING_TOKEN, TOKENS_EXHAUSTED } from './mysql.schema.js';

/** Who the backend connects as, for fixes that name them. */
export interface MysqlIdentity {
  user: string | undefined;
  database: string | undefined;
}

/** What the server says of a failure: mysql2 sets these on the errors it passes on. */
interface ServerError {
  errno?: unknown;
  code?: unknown;
  sqlState?: unknown;
  message?: unknown;
}

/** InnoDB chose this transaction as a deadlock victim (1213) or it waited too long for a row lock (1205). */
const DEADLOCK = 1213;
const LOCK_WAIT_TIMEOUT = 1205;
/** The server runs with --read-only (a replica), so it refuses writes from users without the privilege. */
export const READ_ONLY_SERVER = 1290;
/** The session's transactions are read-only (SET SESSION TRANSACTION READ ONLY, or the pool's setting). */
const READ_ONLY_TRANSACTION = 1792;
/** "Running in read-only mode": the server refuses every write (innodb_read_only, for one). */
const READ_ONLY_MODE = 1836;
/** A procedure the backend calls is missing: someone dropped it, or the tables are being made again. */
export const NO_SUCH_PROCEDURE = 1305;

/** Whether InnoDB rolled the call back for a deadlock or a lock wait timeout: it can be sent again at once. */
export function isRetryable(error: unknown): boolean {
  const errno = (error as ServerError | undefined)?.errno;
  return errno === DEADLOCK || errno === LOCK_WAIT_TIMEOUT;
}

/**
 * A server that refuses writes (1290 a read-only option, 1792 a read-only transaction, 1836
 * read-only mode): mysql2's pool.query() closes such a connection rather than reuse it (a
 * demoted primary behind the same address), and so does the backend.
 */
export function isReadOnly(error: unknown): boolean {
  const errno = errnoOf(error);
  return errno === READ_ONLY_SERVER || errno === READ_ONLY_TRANSACTION || errno === READ_ONLY_MODE;
}

export function errnoOf(error: unknown): unknown {
  return (error as ServerError | undefined)?.errno;
}

/**
 * For an error that waiting cannot heal, what is wrong and how to fix it, in words; undefined for
 * an error that may pass (a server down, a timeout, a deadlock, a read-only server during a
 * failover). The server says which by its error number.
 */
export function permanentCause(error: unknown, names: MysqlLockNames, who: MysqlIdentity): string | undefined {
  const { errno, message } = (error ?? {}) as ServerError;
  const user = who.user === undefined ? "'<user>'@'<host>'" : `'${who.user}'@'<host>'`;
  const database = who.database ?? '<database>';
  const grant =
    `GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON \`${database}\`.* TO ${user}; or, to let the backend create its tables, ` +
    `GRANT CREATE, ALTER, CREATE ROUTINE, ALTER ROUTINE too (else create them in a migration with mysqlLockTablesSql() and ` +
    `pass createTables: false).`;
  switch (errno) {
    // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR
    case 1045:
    case 1698:
      return (
        `The server refused the credentials of user ${who.user ?? '(the default)'}: correct the user and password of the ` +
        `connection (or the user's host in the server's grants), as waiting will not change its answer.`
      );
    // ER_DBACCESS_DENIED_ERROR
    case 1044:
      return `User ${user} may not use database ${database}: GRANT ... ON \`${database}\`.* TO ${user}, as below. ${grant}`;
    // ER_BAD_DB_ERROR
    case 1049:
      return (
        `The database ${database} does not exist on this server: correct the database of the connection, or create it ` +
        `(CREATE DATABASE \`${database}\`).`
      );
    // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR, ER_PROCACCESS_DENIED_ERROR
    case 1142:
    case 1143:
    case 1227:
    case 1370:
      return `User ${user} lacks rights on the lock tables ${names.locks}, ${names.waiters}, ... or their procedures: ${grant}`;
    case READ_ONLY_TRANSACTION:
      return (
        `The session's transactions are read-only (transaction_read_only, or tx_read_only on MariaDB, is on for this pool): ` +
        `no lock can be taken. Give the lock backend a pool whose sessions may write.`
      );
    default:
      if (typeof message === 'string' && message.startsWith(TOKENS_EXHAUSTED)) {
        return (
          `The fencing-token counter ${names.tokens} reached ${MYSQL_MAX_FENCING_TOKEN}, the greatest integer a JavaScript number ` +
          `holds exactly: no token greater than the last can be handed out. It only gets there when its AUTO_INCREMENT was moved. ` +
          `Moving it back would hand out tokens again that your stores have seen: give the backend a new table (option 'table'), ` +
          `whose tokens start at 1, and reset the fencing tokens your stores keep.`
        );
      }
      return undefined;
  }
}

/** What a read-only server error says in a lock operation: it may pass (a replica being promoted). */
export const READ_ONLY_NOTE =
  'The server runs read-only (a replica, or a failover still promoting it): locks are retried within the wait. If this is ' +
  'not a failover, connect to the primary.';

/**
 * The server's error without what mysql2 attaches to it: `sql`, the statement with its values
 * written in (an owner token, which lets whoever reads it release the lock), and the connection.
 * Nest prints a 500's error whole, with its cause.
 */
export function serverError(error: unknown): unknown {
  if (!(error instanceof Error)) return error;
  const { code, errno, sqlState } = error as ServerError;
  const clean = new Error(error.message);
  clean.name = error.name;
  clean.stack = error.stack;
  return Object.assign(clean, { code, errno, sqlState });
}
