import { decodeIdentity } from '../../lock-identity.js';
import { SHARED, type LockHolderState, type LockState, type LockWaiterState } from '../lock-backend.interface.js';
import type { MysqlConnection } from './mysql.connection.js';
import { SHARED_LIMIT_SQL } from './mysql.procedures.js';

/** How many waiters inspect tells, first first. */
const WAITERS_SHOWN = 100;

/** A DATETIME(6) of the tables (UTC) as ms since the epoch, whatever the session's time zone. */
const epochMs = (column: string) => `TIMESTAMPDIFF(MICROSECOND, '1970-01-01', ${column}) DIV 1000`;

/**
 * The key's live holders and its line, in one statement (two index ranges, by the server's
 * clock): holders in token order, then the first WAITERS_SHOWN waiters in line order. A lease or a
 * place taken by a release before who holds was stored has no identity (its holder column is NULL).
 */
export async function inspectMysql(connection: MysqlConnection, key: string): Promise<LockState | undefined> {
  const { holders: holdersTable, waiters: waitersTable } = connection.names;
  const rows = await connection.run({
    op: 'inspect',
    keys: [key],
    sql:
      `SELECT 'h' AS kind, fencing_token AS ord, owner, CAST(max_holders AS CHAR) AS max_holders, holder, ` +
      `${epochMs('acquired_at')} AS at_ms, CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000) AS ttl_ms ` +
      `FROM ${holdersTable} WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6) ` +
      `UNION ALL (SELECT 'w', place, owner, CAST(max_holders AS CHAR), holder, ${epochMs('since')}, NULL ` +
      `FROM ${waitersTable} WHERE lock_key = ? AND deadline > UTC_TIMESTAMP(6) ORDER BY place LIMIT ${WAITERS_SHOWN}) ` +
      `ORDER BY kind, ord`,
    values: [Buffer.from(key), Buffer.from(key)],
  });
  const holders: LockHolderState[] = [];
  const waiters: LockWaiterState[] = [];
  let limit = 1;
  for (const row of rows) {
    const identity = decodeIdentity(row.holder === null ? null : text(row.holder));
    if (text(row.kind) === 'h') {
      if (holders.length === 0) limit = limitOf(row.max_holders);
      holders.push({
        owner: text(row.owner),
        ttlMs: Math.max(0, Number(row.ttl_ms)),
        fencingToken: Number(row.ord),
        ...(row.at_ms !== null && { acquiredAt: Number(row.at_ms) }),
        ...identity,
      });
    } else {
      const theirs = limitOf(row.max_holders);
      waiters.push({
        owner: text(row.owner),
        ...(row.at_ms !== null && { waitingSince: Number(row.at_ms) }),
        ...(theirs !== 1 && { limit: theirs }),
        ...identity,
      });
    }
  }
  if (holders.length === 0) return undefined;
  const ttlMs = Math.max(...holders.map((h) => h.ttlMs));
  return {
    key,
    owner: holders[0].owner,
    ttlMs,
    fencingToken: holders.at(-1)!.fencingToken,
    ...(limit !== 1 && { limit }),
    holders,
    waiters,
  };
}

/** A limit as the tables keep it (text, see SHARED_LIMIT_SQL), as the interface gives it. */
export function limitOf(value: unknown): number {
  const text = Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
  return text === SHARED_LIMIT_SQL ? SHARED : Number(text);
}

/** A VARBINARY column comes back as a Buffer. */
function text(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}
