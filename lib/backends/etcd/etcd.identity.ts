import { decodeIdentity } from '../../lock-identity.js';
import type { LockHolderIdentity } from '../lock-backend.interface.js';

/**
 * Who holds or waits on etcd. An entry's value is left as it always was (`held`, `waiting`,
 * `pending` and a kind: processes of an earlier release compare it inside their transactions), so
 * who asks lives in a key of its own beside the entry (EtcdKeys.identity), written by the
 * transaction that puts the entry, on the same lease (it goes when the holder's or waiter's lease
 * goes), and deleted by every transaction that deletes the entry.
 *
 * Its value: when the entry was put as it is now (ms since the epoch), a line feed, then
 * encodeIdentity's string (instance, a line feed, site; empty for a caller that named nobody).
 * etcd has no clock a transaction can read, so the time is the asking client's wall clock when it
 * sent the request: a waiter's when it took its place, a holder's when it took the keys.
 */

export interface StoredIdentity extends Partial<LockHolderIdentity> {
  /** When the entry was put as it is: ms since the epoch, by the clock of the client that put it. */
  since?: number;
}

/** The value of an identity key: `since`, a line feed, then the bytes of identityBytes() (none without a holder). */
export function identityValue(who: Buffer | undefined, since: number): Buffer {
  const time = Buffer.from(`${Math.round(since)}\n`);
  return who ? Buffer.concat([time, who]) : time;
}

/** What an identity key says; nothing of a malformed one. */
export function readIdentity(value: Buffer): StoredIdentity {
  const text = value.toString('utf8');
  const cut = text.indexOf('\n');
  if (cut < 0) return {};
  const since = Number(text.slice(0, cut));
  return { ...(cut > 0 && Number.isSafeInteger(since) && { since }), ...decodeIdentity(text.slice(cut + 1)) };
}
