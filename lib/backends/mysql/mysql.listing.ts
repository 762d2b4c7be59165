import { decodeKeyCursor, encodeKeyCursor, likePrefix } from '../key-cursor.js';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import type { MysqlConnection } from './mysql.connection.js';

/**
 * list() on MySQL: the keys after the cursor's, in the byte order of the lock table's primary key,
 * read from its index (`lock_key LIKE 'prefix%'` on a VARBINARY column is a range of it). Rows of
 * leases that ended, and the placeholder rows the procedures lock keys by, are skipped on the way.
 * `|` escapes LIKE's wildcards: a backslash would depend on the server's sql_mode.
 */
export async function listMysql(connection: MysqlConnection, options: LockListOptions): Promise<LockListPage> {
  const after = options.cursor === undefined ? null : Buffer.from(decodeKeyCursor(options.cursor, 'mysql'));
  const rows = await connection.run({
    op: 'list',
    keys: [],
    sql:
      `SELECT DISTINCT lock_key FROM ${connection.names.locks} WHERE lock_key LIKE ? ESCAPE '|' AND (? IS NULL OR lock_key > ?) ` +
      `AND expires_at > UTC_TIMESTAMP(6) ORDER BY lock_key LIMIT ${options.limit + 1}`,
    values: [Buffer.from(likePrefix(options.prefix, '|')), after, after],
  });
  const keys = rows.map((row) => Buffer.from(row.lock_key as Uint8Array).toString('utf8'));
  if (keys.length <= options.limit) return { keys };
  keys.pop();
  return { keys, cursor: encodeKeyCursor(keys[keys.length - 1]) };
}
