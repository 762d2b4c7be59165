import type { ITxnResponse } from 'etcd3';
import type { AcquireResult } from '../lock-backend.interface.js';
import type { EtcdConnection, Operation } from './etcd.connection.js';
import { isHeldValue } from './etcd.kinds.js';
import type { EtcdLine } from './etcd.line.js';
import type { HoldLease } from './etcd.places.js';
import { standingAtEnd } from './etcd.standing.js';

/** A caller that does not wait, with what its first attempt read of its lines (`read`). */
export interface NoWaitAttempt {
  keys: readonly string[];
  owner: string;
  limits: readonly number[];
  /** What its identity keys say, if it enters (etcd.identity.ts). */
  identity: Buffer;
  hold: HoldLease;
  /** The validity a lock it wins reports: what its first attempt counted of its lease. */
  validityMs: number;
  read: ITxnResponse;
  what: Operation;
}

/**
 * A caller that does not wait, and found its lines busy: it enters at the end of every line if
 * the rule lets it in there (beside readers or permit holders, or past pending entries, which it
 * deletes), in a transaction that holds only if nobody came in since the read. 'again' when
 * somebody did: the caller may look once more. Its hold lease goes unless it entered.
 */
export async function enterAtEnd(connection: EtcdConnection, line: EtcdLine, attempt: NoWaitAttempt): Promise<AcquireResult | 'again'> {
  const { keys, owner, limits, identity, hold, validityMs, read, what } = attempt;
  const lines = standingAtEnd(read, limits);
  const mismatched = lines.findIndex((standing) => 'mismatch' in standing);
  if (mismatched >= 0 || lines.some((standing) => !standing.in)) {
    connection.revokeQuietly(hold.id, what);
    if (mismatched < 0) return { acquired: false };
    return { acquired: false, limitMismatch: { key: keys[mismatched], limit: (lines[mismatched] as { mismatch: number }).mismatch } };
  }
  const pending = lines.flatMap((standing) => (standing.in ? standing.pending : []));
  let response;
  try {
    response = await connection.txn(line.enterAtEnd(keys, owner, limits, identity, hold.id, Number(read.header.revision), pending), what);
  } catch (error) {
    // Applied or not: the lease goes, and with it a lock it may have won.
    connection.revokeQuietly(hold.id, what);
    throw error;
  }
  if (response.succeeded) return { acquired: true, fencingToken: Number(response.header.revision), validityMs };
  // An earlier copy of this request (a client that retried it) may have entered already.
  const own = line.ownEntriesOf(response);
  if (own.every((kv) => kv && isHeldValue(kv.value) && kv.lease === hold.id))
    return { acquired: true, fencingToken: Number(own[0]!.create_revision), validityMs };
  connection.revokeQuietly(hold.id, what);
  return 'again';
}
