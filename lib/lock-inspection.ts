import { createHash } from 'node:crypto';
import type { LockBackend, LockState } from './backends/lock-backend.interface.js';
import { InvalidLockOptionsError } from './lock.errors.js';
import { kindOf, type LockKind } from './lock-mode.js';
import { show } from './option-value.js';

/** What `inspect()` tells about a key (docs/inspection.md). */
export interface LockInfo {
  /** Full key, prefix included. */
  key: string;
  /** Remaining lease in milliseconds (the longest, when the key has several holders). */
  ttlMs: number;
  /** The holder's token (the greatest, when the key has several holders). */
  fencingToken?: number;
  /** Whether this LockService (this process) holds it (is one of its holders). */
  heldHere: boolean;
  /** How it is held: 'exclusive', 'shared' (by readers), or 'permits' (a semaphore's). */
  mode: LockKind;
  /** How many holders it admits: 1 exclusive, n permits, Infinity shared. */
  limit: number;
  /**
   * Every holder, with who it is where the backend stores it (LockBackend.storesIdentity). From a
   * backend that does not, an exclusive lock's one holder without identity.
   */
  holders: LockHolderInfo[];
  /**
   * The callers waiting in the store's line, first first; absent when the backend does not tell
   * (LockBackend.storesIdentity). A process's later callers for the same key wait behind its first in
   * that process's own queue, and are in the store's line only once they asked the store.
   */
  waiters?: LockWaiterInfo[];
}

/** One holder of a key, as `inspect()` tells it. */
export interface LockHolderInfo {
  /**
   * Names this holder for as long as it holds, without its owner token (whoever knows that could
   * release or extend its lock): a digest of it. A forced release (the lock board's) names the
   * holder it means by it, so a holder that came after the one shown is never the one freed.
   */
  id: string;
  /** Remaining lease in milliseconds. */
  ttlMs: number;
  fencingToken?: number;
  /** Whether this LockService (this process) is this holder. */
  heldHere: boolean;
  /** The holder's process (its module option `instance`), when stored. */
  instance?: string;
  /** Where it took the lock (`Class.method`, or the `site` option), when stored. */
  site?: string;
  /** When it took the key: ms since the epoch, by the store's clock where it has one. */
  acquiredAt?: number;
}

/** One caller in a key's line, as `inspect()` tells it. */
export interface LockWaiterInfo {
  /** The waiter's process (its module option `instance`), when stored. */
  instance?: string;
  /** Where it asks for the lock (`Class.method`, or the `site` option), when stored. */
  site?: string;
  /** When it took its place in line: ms since the epoch, by the store's clock where it has one. */
  waitingSince?: number;
  /** What it waits for: 'exclusive', 'shared' or 'permits'. */
  mode: LockKind;
}

/** What `list()` reads. */
export interface LockListQuery {
  /** Keys that start with this (after the module's keyPrefix). Default '': every key under the keyPrefix. */
  prefix?: string;
  /** At most this many keys on the page: 1 to 1 000. Default 100. */
  limit?: number;
  /** The `cursor` of the previous page; absent for the first page. */
  cursor?: string;
}

/** One page of held keys, as `list()` returns it. */
export interface LockList {
  /** Keys held now, without the module's keyPrefix (as `inspect()` and `using()` take them). */
  keys: string[];
  /** Pass it back for the next page; absent on the last page. */
  cursor?: string;
}

export const MAX_LIST_LIMIT = 1_000;
const DEFAULT_LIST_LIMIT = 100;

/** The backend's state of a key in the service's words; `ours` tells the owners of this service's leases. */
export function lockInfo(state: LockState, ours: (owner: string) => boolean): LockInfo {
  const limit = state.limit ?? 1;
  const holders = (state.holders ?? [{ owner: state.owner, ttlMs: state.ttlMs, fencingToken: state.fencingToken }]).map(
    ({ owner, ttlMs, fencingToken, instance, site, acquiredAt }) => ({
      id: holderId(owner),
      ttlMs,
      fencingToken,
      heldHere: ours(owner),
      ...(instance !== undefined && { instance }),
      ...(site !== undefined && { site }),
      ...(acquiredAt !== undefined && { acquiredAt }),
    }),
  );
  const waiters = state.waiters?.map(({ instance, site, waitingSince, limit: theirs }) => ({
    ...(instance !== undefined && { instance }),
    ...(site !== undefined && { site }),
    ...(waitingSince !== undefined && { waitingSince }),
    mode: kindOf(theirs ?? 1),
  }));
  return {
    key: state.key,
    ttlMs: state.ttlMs,
    fencingToken: state.fencingToken,
    heldHere: holders.some((holder) => holder.heldHere),
    mode: kindOf(limit),
    limit,
    holders,
    ...(waiters && { waiters }),
  };
}

/** A holder's id (see LockHolderInfo.id): 16 characters of a SHA-256 of its owner token. */
export function holderId(owner: string): string {
  return createHash('sha256').update(owner).digest('base64url').slice(0, 16);
}

/** The query checked, with its defaults; throws InvalidLockOptionsError saying what was wrong. */
export function checkListQuery(
  query: LockListQuery | undefined,
  backend: LockBackend,
): Required<Omit<LockListQuery, 'cursor'>> & LockListQuery {
  if (!backend.list) {
    throw new InvalidLockOptionsError(
      '(backend)',
      `LockService.list: the ${backend.name} backend cannot list its keys (it has no list method). Use inspect(key) for a key you ` +
        `know, or a backend that lists (docs/inspection.md names them).`,
    );
  }
  const { prefix = '', limit = DEFAULT_LIST_LIMIT, cursor, ...rest } = query ?? {};
  const unknown = Object.keys(rest)[0];
  if (unknown !== undefined) {
    throw new InvalidLockOptionsError(unknown, `LockService.list: unknown option '${unknown}'. Accepted options: prefix, limit, cursor.`);
  }
  if (typeof prefix !== 'string') {
    throw new InvalidLockOptionsError('prefix', `LockService.list: option 'prefix' must be a string, got ${show(prefix)}.`);
  }
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIST_LIMIT) {
    throw new InvalidLockOptionsError(
      'limit',
      `LockService.list: option 'limit' must be an integer from 1 to ${MAX_LIST_LIMIT}, got ${show(limit)}. Page on with the cursor.`,
    );
  }
  if (cursor !== undefined && (typeof cursor !== 'string' || cursor === '')) {
    throw new InvalidLockOptionsError(
      'cursor',
      `LockService.list: option 'cursor' must be the non-empty string a previous page returned, got ${show(cursor)}.`,
    );
  }
  return { prefix, limit, cursor };
}
