import { decodeIdentity } from '../../lock-identity.js';
import { decodeKeyCursor, encodeKeyCursor, likePrefix } from '../key-cursor.js';
import type { LockHolderState, LockListOptions, LockListPage, LockState, LockWaiterState } from '../lock-backend.interface.js';
import type { PostgresConnection } from './postgres.connection.js';

/** How many waiters inspect tells, first first. */
const WAITERS_SHOWN = 100;

/**
 * The key's live holders, then its line: two reads, by the server's clock. A lease taken by a
 * release before who holds was stored has no identity (its holder column is NULL).
 */
export async function inspectPostgres(connection: PostgresConnection, key: string): Promise<LockState | undefined> {
  const { names } = connection;
  const rows = await connection.run({
    op: 'inspect',
    keys: [key],
    text:
      `SELECT owner, fencing_token, max_holders, holder, (extract(epoch FROM acquired_at) * 1000)::float8 AS acquired_at, ` +
      `ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8 AS ttl_ms ` +
      `FROM ${names.locks} WHERE key = $1 AND expires_at > clock_timestamp() ORDER BY fencing_token`,
    values: [key],
  });
  if (rows.length === 0) return undefined;
  const holders: LockHolderState[] = rows.map((row) => ({
    owner: row.owner as string,
    ttlMs: Math.max(0, row.ttl_ms as number),
    fencingToken: Number(row.fencing_token),
    ...(row.acquired_at !== null && { acquiredAt: Math.round(row.acquired_at as number) }),
    ...decodeIdentity(row.holder as string | null),
  }));
  const line = await connection.run({
    op: 'inspect',
    keys: [key],
    text:
      `SELECT owner, max_holders, holder, (extract(epoch FROM since) * 1000)::float8 AS since FROM ${names.waiters} ` +
      `WHERE key = $1 AND deadline > clock_timestamp() ORDER BY place LIMIT ${WAITERS_SHOWN}`,
    values: [key],
  });
  const waiters: LockWaiterState[] = line.map((row) => ({
    owner: row.owner as string,
    ...(row.since !== null && { waitingSince: Math.round(row.since as number) }),
    ...(row.max_holders !== 1 && { limit: row.max_holders as number }),
    ...decodeIdentity(row.holder as string | null),
  }));
  const limit = rows[0].max_holders as number;
  const ttlMs = Math.max(...holders.map((h) => h.ttlMs));
  const fencingToken = holders.at(-1)!.fencingToken;
  return { key, owner: holders[0].owner, ttlMs, fencingToken, ...(limit !== 1 && { limit }), holders, waiters };
}

/**
 * The keys after the cursor's, in the primary key's order ("C" collation: bytes), read from its
 * index: `key LIKE 'prefix%'` on a "C" column is a range of it. Expired leases not yet deleted are
 * skipped on the way, as every read does.
 */
export async function listPostgres(connection: PostgresConnection, options: LockListOptions): Promise<LockListPage> {
  const after = options.cursor === undefined ? null : decodeKeyCursor(options.cursor, 'postgres');
  const rows = await connection.run({
    op: 'list',
    keys: [],
    text:
      `SELECT key FROM ${connection.names.locks} WHERE key LIKE $1 AND ($2::text IS NULL OR key > $2) ` +
      `AND expires_at > clock_timestamp() GROUP BY key ORDER BY key LIMIT $3`,
    values: [likePrefix(options.prefix), after, options.limit + 1],
  });
  const keys = rows.map((row) => row.key as string);
  if (keys.length <= options.limit) return { keys };
  keys.pop();
  return { keys, cursor: encodeKeyCursor(keys[keys.length - 1]) };
}
