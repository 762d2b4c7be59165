import type { IKeyValue, ITxnResponse } from 'etcd3';
import { isHandedValue, isHeldValue, keyStanding, type KeyStanding } from './etcd.kinds.js';
import type { LineRequest } from './etcd.line.js';

/**
 * Where a caller stands, read off the answers of the line's transactions (etcd.line.ts): each
 * line read whole, first first, and the rule of who is in applied to what is ahead (etcd.kinds.ts).
 */
/** Where a waiter stands: in each line, from one read of them all. */
export interface Standing {
  /** An entry of its own is gone (its lease ran out, or it was deleted): it has no place any more. */
  lost: boolean;
  /** Its entries are held on its own lease already: it has the keys. */
  won?: boolean;
  /** A release handed it the key (etcd.handover.ts): it holds, on its waiter lease. */
  handed?: boolean;
  /** Per line, in order (empty when lost). */
  lines: KeyStanding[];
  /** The revision the lines were read at: watches start after it. */
  readRevision: number;
}

/** Where a waiter placed by `firstAttempt` stands, from that transaction's answer. */
export function standingAfterFirst(response: ITxnResponse, keys: readonly string[], limits: readonly number[], revision: number): Standing {
  const lines = limits.map((limit, i) => keyStanding(aheadOf(response.responses[keys.length + i].response_range.kvs, revision), limit));
  return { lost: false, lines, readRevision: Number(response.header.revision) };
}

/** For a caller that does not wait: where it would stand at the end of each line read by `firstAttempt`. */
export function standingAtEnd(response: ITxnResponse, limits: readonly number[]): KeyStanding[] {
  return limits.map((limit, i) => keyStanding(response.responses[i].response_range.kvs, limit));
}

/**
 * Where the waiter stands, from the answer of `check` or `promote`. Its entries already held on
 * `holdLease`: an earlier attempt of its own, whose answer was lost, took the keys.
 */
export function standing(response: ITxnResponse, request: LineRequest, holdLease: string): Standing {
  const { keys, limits, revision } = request;
  const own = response.responses.slice(0, keys.length).map((r) => r.response_range.kvs[0]);
  const lost = own.some((kv) => kv === undefined || Number(kv.create_revision) !== revision);
  const won = own.every((kv) => kv && isHeldValue(kv.value) && kv.lease === holdLease);
  const handed = !lost && own.every((kv) => kv && isHandedValue(kv.value));
  const lines = lost
    ? []
    : limits.map((limit, i) => keyStanding(aheadOf(response.responses[keys.length + i].response_range.kvs, revision), limit));
  return { lost, won, handed, lines, readRevision: Number(response.header.revision) };
}

/** The entries of a line ahead of `revision`, first first. */
function aheadOf(kvs: readonly IKeyValue[], revision: number): IKeyValue[] {
  return kvs.filter((kv) => Number(kv.create_revision) < revision);
}
