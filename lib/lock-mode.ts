import { SHARED, type LockBackend } from './backends/lock-backend.interface.js';
import { InvalidLockOptionsError } from './lock.errors.js';

/** How a caller holds a key: alone (the default), or beside other shared holders. */
export type LockMode = 'exclusive' | 'shared';

/**
 * What a lock is, as handles, `inspect()` and events report it: an exclusive lock, a shared (read)
 * lock, or one of a semaphore's `permits`.
 */
export type LockKind = 'exclusive' | 'shared' | 'permits';

/** The options that choose the kind of a lock. */
interface KindOptions {
  mode?: LockMode;
  permits?: number;
}

/**
 * How many holders a key admits for these options, as the backend takes it
 * (TryAcquireOptions.limits): 1 exclusive, n permits, SHARED (Infinity) shared.
 */
export function limitOf(options: KindOptions | undefined): number {
  if (options?.permits !== undefined) return options.permits;
  return options?.mode === 'shared' ? SHARED : 1;
}

export function kindOf(limit: number): LockKind {
  return limit === 1 ? 'exclusive' : limit === SHARED ? 'shared' : 'permits';
}

/** The kind in words, for messages: "exclusive", "shared", "3 permits". */
export function describeLimit(limit: number): string {
  return limit === 1 ? 'exclusive' : limit === SHARED ? 'shared' : `${limit} permits`;
}

/** The options that ask for this limit, for messages: "mode: 'shared'", "permits: 3". */
function optionsFor(limit: number): string {
  return limit === 1 ? "mode: 'exclusive'" : limit === SHARED ? "mode: 'shared'" : `permits: ${limit}`;
}

/** `permits` and `mode: 'shared'` are two kinds of lock; one call asks for one. */
export function checkKindOptions(options: unknown, where: string): void {
  const { mode, permits } = (options ?? {}) as KindOptions;
  if (permits === undefined || mode === undefined) return;
  if (mode === 'exclusive' && permits === 1) return;
  throw new InvalidLockOptionsError(
    'permits',
    `${where}: options 'permits' (${permits}) and 'mode' ('${mode}') ask for two kinds of lock. Use permits alone for a ` +
      `semaphore of that many holders, or mode: 'shared' alone for a read lock any number of readers may hold.`,
  );
}

/**
 * A backend that cannot hold a key for several holders refuses shared locks and semaphores: a
 * @Locked method at start-up (`where` names it), a using()/acquire() call at the call.
 */
export function checkBackendHolds(backend: LockBackend, limit: number, keys: readonly string[], where?: string): void {
  if (limit === 1 || backend.sharedHolders === true) return;
  throw new InvalidLockOptionsError(
    limit === SHARED ? 'mode' : 'permits',
    `${where ? `${where}: ` : ''}${optionsFor(limit)} on ${keys.join(', ')}: the ${backend.name} backend holds exclusive locks only (one holder per key; ` +
      `its sharedHolders is not true), so it cannot hold a ${describeLimit(limit)} lock. Use a backend that supports shared ` +
      `holders (docs/shared-locks.md lists them), or an exclusive lock.`,
  );
}

/** The backend found holders of `key` that admit `theirs` holders, where this caller asked for `ours`. */
export function limitMismatchError(key: string, ours: number, theirs: number): InvalidLockOptionsError {
  return new InvalidLockOptionsError(
    limitOptionName(ours),
    `${key} is held as ${describeLimit(theirs)} (${optionsFor(theirs)}), and this call asked for ${describeLimit(ours)} ` +
      `(${optionsFor(ours)}): every caller of a key must agree on what it is, or the limit would silently change. Use the ` +
      `same option on every caller of ${key}, or another key.`,
  );
}

function limitOptionName(limit: number): string {
  return limit === SHARED ? 'mode' : 'permits';
}

/**
 * Whether a context that holds a key with `held` may enter it again with `asked`. An exclusive
 * holder may enter in any mode (it already excludes everyone); a shared or permit holder only as
 * what it holds: asking for more (a reader asking to write) would wait for the other holders,
 * who may be waiting for it in the same way, and two readers that both upgrade deadlock.
 */
export function checkReentry(key: string, held: number, asked: number): void {
  if (held === 1 || held === asked) return;
  const upgrade = asked === 1;
  // An options error, not a key error: the interceptor answers a key error as the client's fault (400).
  throw new InvalidLockOptionsError(
    upgrade ? 'mode' : limitOptionName(held),
    `Cannot enter ${key} as ${describeLimit(asked)}: this context holds it as ${describeLimit(held)}. ` +
      (upgrade
        ? `Upgrading a shared lock to an exclusive one deadlocks as soon as two holders try it (each waits for the other ` +
          `to leave), so it is refused. Take the exclusive lock in the outer call (an exclusive holder may enter as shared ` +
          `inside it), or release the shared lock first and acquire the exclusive one afresh.`
        : `A context enters a key again only as what it holds (or anything, when it holds it exclusively). Use the same ` +
          `${limitOptionName(held)} option in the nested call, or take an exclusive lock in the outer one.`),
  );
}

/**
 * What events say of a lock's kind: `mode`, and `permits` for a semaphore; nothing for an
 * exclusive lock, whose events stay as they were before there were other kinds.
 */
export function kindFields(limit: number): { mode?: Exclude<LockKind, 'exclusive'>; permits?: number } {
  if (limit === 1) return {};
  const mode = kindOf(limit) as Exclude<LockKind, 'exclusive'>;
  return mode === 'permits' ? { mode, permits: limit } : { mode };
}
