/**
 * A lock backend stores leases. It is deliberately small: the service owns waiting, fairness,
 * reentrancy and the watchdog, so a backend only needs these atomic steps. Write your own by
 * implementing this interface and passing it as `backend` to `DistributedLockModule.forRoot`.
 *
 * Every method receives full keys (prefix applied, sorted, without duplicates) and the owner
 * token of one acquisition (128 random bits). Multi-key calls are all-or-nothing.
 *
 * The service sends the calls of one owner one after another: an attempt after the previous one
 * answered or failed, the release after the last attempt; only an extension may still be out when
 * the release goes. A backend may count on it (the etcd backend does: two attempts of one owner at
 * once could leave that owner two places in a line), and whoever calls a backend directly keeps to it.
 */
export interface LockBackend {
  /** A short name for logs and errors: 'memory', 'redis', 'redlock'. */
  readonly name: string;

  /**
   * Whether `fencingToken` is strictly increasing per key across every client of this backend.
   * `false` means handles carry no fencing token (Redlock cannot promise one).
   */
  readonly fencing: boolean;

  /**
   * Whether the backend honours `TryAcquireOptions.limits` (shared locks and semaphores: more than
   * one holder of a key). Without it the service refuses `mode: 'shared'` and `permits` at once
   * with an InvalidLockOptionsError, rather than take them as exclusive locks.
   */
  readonly sharedHolders?: boolean;

  /**
   * Optional, for a backend that keeps waiters in a line: how long (ms) a waiter keeps its place
   * there without asking again. The service refuses a `pollInterval` that is not below it, as its
   * waiters would lose their place between polls.
   */
  readonly waiterTimeout?: number;

  /**
   * Whether the backend stores who holds and waits (TryAcquireOptions.holder) and reports it from
   * inspect: every holder in `LockState.holders`, with its identity, and the line in
   * `LockState.waiters`. Without it inspect tells the lease alone (docs/inspection.md).
   */
  readonly storesIdentity?: boolean;

  /** One attempt, no waiting: take every key or none. */
  tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult>;

  /** Reset the lease of every key to `ttlMs` if `owner` still holds all of them. */
  extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult>;

  /**
   * Delete the keys that `owner` still holds; returns false if it held none of them. The service
   * also calls it for an owner that waited and gave up, so a backend that keeps waiters in line
   * (Redis does, for fairness) can drop it.
   */
  release(keys: readonly string[], owner: string): Promise<boolean>;

  /** The current holder of a key, or undefined when it is free. */
  inspect(key: string): Promise<LockState | undefined>;

  /**
   * Optional, read-only: one page of the keys held now whose names start with `prefix` (full
   * keys), at most `limit` of them, from where `cursor` (a previous page's) left off. A key held
   * from the first page to the last is on exactly one page; one taken or freed meanwhile may or
   * may not be. `cursor` is absent on the last page. docs/inspection.md states each backend's cost.
   */
  list?(options: LockListOptions): Promise<LockListPage>;

  /**
   * Optional: call `onRelease` when one of `keys` may have become free for `owner` (the waiting
   * acquisition, as passed to tryAcquire). The returned promise resolves once notifications are
   * flowing (so a release right after it cannot be missed) to a function that stops them.
   * Without it, waiters poll.
   */
  watch?(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void>;

  /**
   * Optional: true when the backend already listens for releases of these keys, and keeps a
   * wake-up for an owner that fails an attempt from now on until that owner watches. The service
   * then needs no second attempt right after subscribing, which otherwise covers a release that
   * came in between.
   */
  watching?(keys: readonly string[]): boolean;

  /**
   * Optional, for a backend whose answer is known at once (its leases live in this process):
   * tryAcquire and release without a promise. When present, the service calls these instead of
   * tryAcquire and release, and a first attempt that wins needs no promise, no place in this
   * process's queue and no tracking of a request in flight. Read at each acquisition and release,
   * so a backend may offer it only while it applies: the in-memory backend does only while its own
   * tryAcquire and release are in place, so a subclass or a test's spy that replaces either one
   * still sees its replacement run.
   */
  readonly immediate?: ImmediateLockSteps;

  /**
   * Optional: checks at start-up what connecting can show is wrong and waiting cannot heal (no
   * such database, credentials or rights refused, a read-only server, Redlock masters that are not
   * distinct masters), and rejects with a `LockBackendError` whose `permanent` is true, naming the
   * cause and the fix. A store that cannot be reached yet is not an error here: it resolves, as
   * lock operations fail until the store is back. The module calls it before the application
   * starts listening, so a misconfigured app fails at start-up, not at its first lock.
   */
  verify?(): Promise<void>;

  /**
   * Optional: free connections, subscriptions and timers the backend owns. The service calls it
   * once its own releases are answered. Requests still under way, and the releases their answers
   * start (one sent again after a failure, the release of a lock won by an attempt whose caller
   * gave up), go out and are answered first, within the command timeout: closing a connection
   * under them would leave their keys held by nobody until the ttl.
   */
  close?(): Promise<void>;

  /**
   * Optional, for health checks (LockHealthIndicator): what the backend's servers say of
   * themselves beyond answering, e.g. Redis's role, or how many Redlock masters answer. It may
   * take as long as it needs: the caller bounds it with its own timeout.
   */
  health?(): Promise<BackendHealth>;
}

/** A backend's tryAcquire and release, answered at once (see LockBackend.immediate). */
export interface ImmediateLockSteps {
  /**
   * tryAcquire, with its answer. `now` is a performance.now() reading taken before the call: the
   * service counts the lease from it (to `now + ttlMs`, or `now + validityMs` when the answer has
   * one), so the backend must keep the lease at least that long. A lease granted shorter than
   * the ttl is not brought to the full ttl before its holder runs, as it is through tryAcquire when
   * autoExtend is off: a backend that hands locks over with a shorter lease leaves this out.
   */
  tryAcquire(keys: readonly string[], owner: string, ttlMs: number, now: number, holder?: LockHolderIdentity): AcquireResult;

  /** release, with its answer. */
  release(keys: readonly string[], owner: string): boolean;
}

/** What a backend reports of its servers to a health check. */
export interface BackendHealth {
  /** False when the servers answer but cannot serve locks: a replica, fewer masters than a quorum. */
  up: boolean;
  /** Shown on the health endpoint, e.g. `{ role: 'master' }` or `{ mastersUp: 2, masters: 3, quorum: 2 }`. */
  details: Record<string, unknown>;
  /** Why it is down, in words. */
  message?: string;
}

export type AcquireResult =
  | {
      acquired: true;
      /** Strictly greater than any earlier token for these keys; absent when `fencing` is false. */
      fencingToken?: number;
      /**
       * How long the lease is certainly valid, counted from when the request was sent. Defaults to
       * the ttl; quorum backends subtract clock drift. (Redlock's "ttl minus acquisition time minus
       * drift" is counted from the answer; from the request, the acquisition time is already spent.)
       */
      validityMs?: number;
    }
  | {
      acquired: false;
      /** Remaining lease of the current holder, when known: the earliest a retry can succeed. */
      retryAfterMs?: number;
      /**
       * The key's holders admit a different number of holders than this caller asked for
       * (`permits: 3` against `permits: 5`, or permits against shared): the limit they use, and
       * the key it was found on. Waiting cannot heal it; the service throws InvalidLockOptionsError.
       */
      limitMismatch?: { key: string; limit: number };
    };

export interface TryAcquireOptions {
  /**
   * False when the caller gives up if this attempt fails (`tryAcquire`, `wait: 0`, `onBusy:
   * 'skip'`). A backend that keeps a line of waiters for fairness leaves such a caller out of it,
   * so nobody has to take it out again. Default true.
   */
  willWait?: boolean;
  /**
   * Called when this attempt, already reported as failed (it timed out), turns out to have won:
   * the keys are set for `owner` though the caller was told otherwise. Only the caller knows
   * whether that owner is still trying or holding (then the lock is in use) or gave up (then it
   * must be freed), so the backend leaves it to this callback; without one it frees the keys.
   */
  onLateAcquire?: () => void;
  /**
   * How many holders each key admits at once, aligned with `keys`; absent: 1 for every key.
   * Only passed to a backend whose `sharedHolders` is true.
   * - `1`: an exclusive lock;
   * - `n > 1`: a semaphore of n permits, one per holder;
   * - `SHARED` (Infinity): a shared (read) lock: any number of shared holders, no exclusive one.
   *
   * A caller with limit L enters a key when nobody is ahead of it in the key's line and the key has
   * fewer holders than L and than the limit of every holder already in (an exclusive caller waits
   * for every holder to leave; while it holds, nobody enters). Holders whose limits are both above
   * 1 and differ disagree on what the key is: the attempt fails with `limitMismatch`.
   */
  limits?: readonly number[];
  /**
   * Who asks, stored with the lease and with the caller's place in line by a backend whose
   * `storesIdentity` is true (others ignore it). Each string is at most MAX_IDENTITY_LENGTH
   * characters without control characters (the service checks); never argument values.
   */
  holder?: LockHolderIdentity;
}

/** Who holds or waits for a key, as stored with its lease (docs/inspection.md). */
export interface LockHolderIdentity {
  /** The process: the module's `instance` option, `hostname:pid` by default. */
  readonly instance: string;
  /** Where in the code: `Class.method` for @Locked, the `site` option of a call; absent when not given. */
  readonly site?: string;
}

/** The longest `instance` or `site` a backend stores: longer ones are refused (or cut, for a derived `Class.method`). */
export const MAX_IDENTITY_LENGTH = 128;

/** What LockBackend.list reads. */
export interface LockListOptions {
  /** Full-key prefix (the service's keyPrefix included); '' lists every key of the store's locks. */
  prefix: string;
  /** At most this many keys on the page (the service asks for 1 to 1 000). */
  limit: number;
  /** Where the previous page left off; absent for the first page. */
  cursor?: string;
}

/** One page of held keys. */
export interface LockListPage {
  /** Full keys, each once on this page. */
  keys: string[];
  /** Where the next page starts; absent when this page is the last. */
  cursor?: string;
}

/** The limit of a shared (read) holder: any number of them at once (see TryAcquireOptions.limits). */
export const SHARED = Number.POSITIVE_INFINITY;

export type ExtendResult = { extended: true; validityMs?: number } | { extended: false };

export interface LockState {
  key: string;
  /** The holder (the first of them when the key has several). */
  owner: string;
  /** Remaining lease in milliseconds (the longest, when the key has several holders). */
  ttlMs: number;
  /** The holder's token (the greatest, when the key has several holders). */
  fencingToken?: number;
  /** How many holders the key admits (see TryAcquireOptions.limits); absent: 1. */
  limit?: number;
  /**
   * Every holder: always from a backend whose `storesIdentity` is true, else only when the key admits
   * more than one.
   */
  holders?: LockHolderState[];
  /** The line of waiters, first first, from a backend whose `storesIdentity` is true. */
  waiters?: LockWaiterState[];
}

/** One holder of a key. */
export interface LockHolderState extends Partial<LockHolderIdentity> {
  owner: string;
  /** Remaining lease in milliseconds. */
  ttlMs: number;
  fencingToken?: number;
  /** When it took the key: ms since the epoch, by the store's clock where it has one. */
  acquiredAt?: number;
}

/** One caller in a key's line. */
export interface LockWaiterState extends Partial<LockHolderIdentity> {
  owner: string;
  /** When it took its place: ms since the epoch, by the store's clock where it has one. */
  waitingSince?: number;
  /** How many holders it asks the key to admit (see TryAcquireOptions.limits); absent: 1. */
  limit?: number;
}

/**
 * Injection token for the backend. Inject it with `@Inject(LockBackend)`; the interface and the
 * token share one name, so one import gives both.
 */
export const LockBackend = Symbol.for('nest-distributed-lock:LockBackend');
