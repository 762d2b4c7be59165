import type { IKeyValue } from 'etcd3';
import { SHARED } from '../lock-backend.interface.js';

/**
 * Shared locks and semaphores in the etcd line. Every caller of a key, whatever its kind, has one
 * entry in the key's line, and the entry's value says its kind beside whether it holds or waits:
 * `held` / `waiting` for an exclusive lock (the values exclusive locks always had, so processes of
 * an earlier version on the same etcd read them as before; they read nothing else of another
 * owner's entry, only its create revision), `held shared`, `waiting permits3` and so on for the
 * others. A caller of several keys keeps its entries after the first line that keeps it out
 * `pending` (see etcd.admission.ts): they keep its place and token, and keep nobody out.
 */

export type EntryState = 'held' | 'waiting' | 'pending';

export interface EntryValue {
  state: EntryState;
  /** How many holders it admits (TryAcquireOptions.limits): 1, n, or SHARED. */
  limit: number;
}

export function entryValue(state: EntryState, limit: number): Buffer {
  return Buffer.from(`${state}${limit === 1 ? '' : limit === SHARED ? ' shared' : ` permits${limit}`}`);
}

/** What an entry's value says; a kind this version does not know (a later one's) is taken as a writer: it keeps everyone out. */
export function parseValue(value: Buffer): EntryValue {
  const [word, kind] = value.toString().split(' ');
  const state: EntryState = word === 'held' || word === 'pending' ? word : 'waiting';
  const permits = /^permits(\d+)$/.exec(kind ?? '');
  const limit = kind === 'shared' ? SHARED : permits ? Math.max(1, Number(permits[1])) : 1;
  return { state, limit };
}

/**
 * Hand-over on release: the value of a waiter for one key, exclusively, that a release may hand
 * the key to (etcd.handover.ts). Processes of earlier releases write plain `waiting`, and no
 * release hands them anything: they read this one as an exclusive waiter.
 */
export const WAITING_FOR_HANDOVER = Buffer.from('waiting handover');

/**
 * Held, handed over by a release: still on its owner's waiter lease, where it waited, until its
 * owner moves it onto its own lease (at its first extension). A waiter that died in line is gone
 * with that lease within `waiterTimeout`, handed the key or not. Read as `held` by every version.
 */
export const HANDED = Buffer.from('held handed');

/** Whether a release may hand the key to this caller: one key, exclusive. */
export function takesHandover(limits: readonly number[]): boolean {
  return limits.length === 1 && limits[0] === 1;
}

/** The value of an entry of a caller with `limits` (its keys'), waiting in the line of its `index`-th key. */
export function waitingValue(limits: readonly number[], index: number, state: 'waiting' | 'pending' = 'waiting'): Buffer {
  return state === 'waiting' && takesHandover(limits) ? WAITING_FOR_HANDOVER : entryValue(state, limits[index]);
}

export function isHandedValue(value: Buffer): boolean {
  return value.equals(HANDED);
}

export function isHeldValue(value: Buffer): boolean {
  return parseValue(value).state === 'held';
}

export function isPendingValue(value: Buffer): boolean {
  return parseValue(value).state === 'pending';
}

/**
 * Where a caller stands in one line, from the entries ahead of it (first first):
 * - in: it may hold the key as far as this line goes, once the pending entries ahead are gone:
 *   it deletes them as it enters (their callers then start over, at the back);
 * - mismatch: the earliest reader or permit caller ahead admits another number of holders;
 * - waitFor: the entries whose deletion may let it in, and no others (herd-free); `untilHeld`:
 *   their being marked held lets it in too.
 */
export type KeyStanding =
  { in: true; pending: IKeyValue[] } | { in: false; mismatch: number } | { in: false; waitFor: Buffer[]; untilHeld?: UntilHeld };

/** In as far as the limits go, it waits for the entries ahead that do not hold yet to hold the key. */
export interface UntilHeld {
  /** Every entry ahead that does not hold yet (pending ones aside): once they all hold, it is in. */
  notHeld: IKeyValue[];
  /** The pending entries ahead, which it deletes as it enters. */
  pending: IKeyValue[];
}

/**
 * The rule of who enters, the same as every backend's (docs/shared-locks.md), read off the line:
 * a caller is in when its position (entries ahead) is below its own limit and the limit of every
 * entry ahead. Every entry ahead counts as in, so nobody passes a waiter (a queued writer blocks
 * later readers, a queued permit caller blocks later ones), and who is in is a prefix of the line
 * that only grows as entries ahead leave (or take the key, below): a decision to enter stays right
 * however many of them go meanwhile, and nobody can come in ahead (a new entry is always the newest).
 *
 * The entries watched: a writer, the entry just before it (it needs the key empty); a reader or a
 * permit caller behind a writer, the nearest writer; a permit caller behind n others, the n
 * nearest: it enters only once one of them went (fewer than n left ahead of it means one of the
 * nearest n went), so no deletion it needs goes unseen, and a freed permit wakes at most n.
 *
 * Pending entries count for nobody (see etcd.admission.ts).
 *
 * One more rule keeps the tokens (create revisions) in the order the key is entered: a reader or
 * a permit caller that the rule lets in enters only once every entry ahead of it holds the key.
 * An entry ahead that is in but not held yet (a caller of several keys that waits for a later one,
 * or a reader woken with this one that has not taken the key yet) has a smaller token: entering
 * beside it, this one could hold and leave before it enters, which would then hold with a token
 * below one that left before it began. So it watches the nearest such entry until it is held (or
 * gone, or pending): readers woken together enter one after another, each once the one ahead holds,
 * and a caller of several keys in on its first key keeps later readers of it out until it holds.
 * Told that entry holds, a waiter goes straight for the key, in a transaction that checks every
 * entry that did not hold at its look holds now (etcd.admission.ts): one request per turn.
 */
export function keyStanding(all: readonly IKeyValue[], limit: number): KeyStanding {
  const ahead = all.filter((kv) => !isPendingValue(kv.value));
  const limits = effectiveLimits(ahead);
  if (limit > 1) {
    const theirs = limits.find((l) => l > 1);
    if (theirs !== undefined && theirs !== limit) return { in: false, mismatch: theirs };
  }
  const position = ahead.length;
  if (position < Math.min(limit, ...limits)) {
    const pending = all.filter((kv) => isPendingValue(kv.value));
    const notHeld = ahead.filter((kv) => !isHeldValue(kv.value));
    if (notHeld.length > 0) return { in: false, waitFor: [notHeld[notHeld.length - 1].key], untilHeld: { notHeld, pending } };
    return { in: true, pending };
  }
  if (limit === 1) return { in: false, waitFor: [ahead[position - 1].key] };
  const writer = limits.lastIndexOf(1);
  if (writer >= 0) return { in: false, waitFor: [ahead[writer].key] };
  return { in: false, waitFor: ahead.slice(-limit).map((kv) => kv.key) };
}

/**
 * The limits the rule counts with: the earliest reader or permit caller says what the key is, and
 * a later one that disagrees with it counts as a writer. Such a caller leaves as soon as it looks
 * (its attempt answers limitMismatch); one whose process died first holds everyone behind it up
 * until its waiter lease runs out, as a dead writer does, and lets nobody in beside the others.
 */
function effectiveLimits(ahead: readonly IKeyValue[]): number[] {
  let key: number | undefined;
  return ahead.map((kv) => {
    const { limit } = parseValue(kv.value);
    if (limit === 1) return 1;
    key ??= limit;
    return limit === key ? limit : 1;
  });
}
