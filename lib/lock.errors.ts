const FAMILY = Symbol.for('nest-distributed-lock:error');

/** Base class of every error this library throws, so callers can catch them as one family. */
export class DistributedLockError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }

  /**
   * `instanceof` also accepts the same error class of the package's other build: an app that
   * loads both the ESM and the CommonJS build (a CommonJS dependency requires it) has two copies
   * of each class, and `catch (e) { if (e instanceof LockNotAcquiredError) ... }` or a Nest
   * `@Catch(LockNotAcquiredError)` filter must not depend on which copy threw.
   */
  static override [Symbol.hasInstance]<T>(this: abstract new (...args: never[]) => T, value: unknown): value is T {
    if (Function.prototype[Symbol.hasInstance].call(this, value)) return true;
    if (typeof value !== 'object' || value === null || !(FAMILY in value)) return false;
    // An error of the other build: its class, or a class it extends, has this class's name.
    for (
      let proto = Object.getPrototypeOf(value) as { constructor?: { name?: string } } | null;
      proto;
      proto = Object.getPrototypeOf(proto)
    ) {
      if (proto.constructor?.name === this.name) return true;
    }
    return false;
  }
}
Object.defineProperty(DistributedLockError.prototype, FAMILY, { value: true });

/** The lock was held by someone else for the whole wait. Maps to HTTP 409 with Retry-After. */
export class LockNotAcquiredError extends DistributedLockError {
  constructor(
    readonly keys: readonly string[],
    /** How long the call took before giving up: the wait, or the one attempt's round trip when it did not wait. */
    readonly waitedMs: number,
    /** Remaining lease of the holder when we gave up, if the backend told us. */
    readonly retryAfterMs?: number,
    /**
     * Set when the call did not wait at all: this process already had as many callers waiting as
     * the module's `maxWaitersPerKey` ('perKey') or `maxWaiters` ('total') allows.
     */
    readonly queueFull?: 'perKey' | 'total',
    /** The wait the caller asked for (its `wait` option, or the module's), when known; 0: one attempt. */
    readonly waitMs?: number,
    /**
     * How many holders the lock admits, as the caller asked: 1 exclusive (default), n permits,
     * Infinity shared. `mode` and `permits` say it in words.
     */
    readonly limit = 1,
  ) {
    super(notAcquiredMessage(keys, waitedMs, queueFull, waitMs, limit));
  }

  /** What kind of lock was asked for: 'exclusive', 'shared', or 'permits' (a semaphore's). */
  get mode(): 'exclusive' | 'shared' | 'permits' {
    return this.limit === 1 ? 'exclusive' : this.limit === Number.POSITIVE_INFINITY ? 'shared' : 'permits';
  }

  /** The semaphore's number of permits, when `mode` is 'permits'. */
  get permits(): number | undefined {
    return this.mode === 'permits' ? this.limit : undefined;
  }
}

/** Why a caller that asked for this kind of lock found no room. */
function busyBecause(keys: readonly string[], limit: number): string {
  const were = keys.length > 1 ? 'were' : 'was';
  if (limit === 1) return `${were} held by another owner`;
  if (limit === Number.POSITIVE_INFINITY) return `${were} held exclusively, or a caller for an exclusive lock waited ahead (shared lock)`;
  return `had all ${limit} permits taken, or a caller waited ahead for one (semaphore)`;
}

function notAcquiredMessage(
  keys: readonly string[],
  waitedMs: number,
  queueFull: 'perKey' | 'total' | undefined,
  waitMs: number | undefined,
  limit: number,
): string {
  const lock = `Lock not acquired: ${keys.join(', ')}`;
  if (queueFull) {
    return (
      `${lock} ${keys.length > 1 ? 'have' : 'has'} too many callers of this process waiting already ` +
      `(the module's ${queueFull === 'perKey' ? 'maxWaitersPerKey' : 'maxWaiters'} option), so this one did not wait. Retry later, ` +
      `or raise the cap.`
    );
  }
  const held = `${lock} ${busyBecause(keys, limit)}`;
  const took = Math.round(waitedMs);
  // What the caller asked for, and what was measured: a call that did not wait spent a round trip, not a wait.
  if (waitMs === 0)
    return `${held}. The call asked not to wait (wait: 0): its one attempt took ${took} ms. Retry later, or pass a \`wait\`.`;
  if (waitMs !== undefined) {
    return `${held} for the whole wait asked (${waitMs} ms; gave up after ${took} ms). Retry later, or raise the \`wait\` option.`;
  }
  return `${held} for the whole wait (gave up after ${took} ms). Retry later, or raise the \`wait\` option.`;
}

/** Why a holder stopped holding its lock before releasing it. */
export type LockLostReason =
  | 'expired' // the lease's local deadline passed without a successful extension
  | 'taken' // an extension found the key gone or owned by someone else
  | 'backend-error' // extensions failed (backend unreachable) until the lease ran out
  | 'shutdown' // the application shut down and released the lock while its holder still ran
  | 'max-hold'; // the holder ran past the lock's maxHold, so the lease was not extended further

/** Fired on `LockHandle.signal` when the lease is lost while the holder still runs. */
export class LockLostError extends DistributedLockError {
  constructor(
    readonly keys: readonly string[],
    readonly reason: LockLostReason,
    cause?: unknown,
  ) {
    super(`Lock lost on ${keys.join(', ')}: ${describeLoss(reason)}`, cause === undefined ? undefined : { cause });
  }
}

function describeLoss(reason: LockLostReason): string {
  switch (reason) {
    case 'expired':
      return 'the lease ran out before it could be extended (was the event loop blocked, or is autoExtend off?). Stop writing, or use the fencing token so storage rejects late writes.';
    case 'taken':
      return 'the backend no longer has this owner on the key (it expired and another owner took it, or it was deleted). Stop writing: another holder may be working.';
    case 'backend-error':
      return 'the backend could not be reached to extend the lease before it ran out. Stop writing: another holder may acquire it.';
    case 'max-hold':
      return 'the holder ran past the maxHold given for this lock, so the lease was not extended further. Stop writing: another holder may acquire it. Raise maxHold if the work needs longer.';
    case 'shutdown':
      return (
        'the application is shutting down and released this lock while its holder still ran. Stop the work now: another instance ' +
        'may take the lock. To let work finish under the lock, stop starting new work and wait for running work in ' +
        'beforeApplicationShutdown or onModuleDestroy, which Nest calls before this.'
      );
  }
}

/** The backend failed (unreachable, timed out, no quorum). Carries the backend's error as `cause`. */
export class LockBackendError extends DistributedLockError {
  /**
   * True when waiting cannot heal it: the store refused these credentials or this operation
   * (authentication, permission), is read-only, or has no such database. A caller that waits
   * gets it at once rather than retrying for its whole wait; the message names the fix.
   */
  readonly permanent: boolean;

  constructor(
    readonly backend: string,
    message: string,
    cause?: unknown,
    options: { permanent?: boolean } = {},
  ) {
    super(`Lock backend '${backend}' failed: ${message}`, cause === undefined ? undefined : { cause: withoutCommand(cause) });
    this.permanent = options.permanent ?? false;
  }
}

/**
 * A client's error as a cause, without the command it carries: ioredis attaches the command's
 * arguments (a script's owner token, which lets whoever reads it release the lock; AUTH's
 * password) to its errors, and Nest prints a 500's error whole. Name, message and stack stay, and
 * so does the command's name; nested causes are cleaned the same way.
 */
/** @internal */
export function withoutCommand(cause: unknown, depth = 0): unknown {
  if (!(cause instanceof Error) || depth > 5) return cause;
  const command = (cause as { command?: { name?: unknown } }).command;
  const inner = cause.cause === undefined ? undefined : withoutCommand(cause.cause, depth + 1);
  if (command === undefined && inner === cause.cause) return cause;
  const clean = new Error(cause.message, inner === undefined ? undefined : { cause: inner });
  clean.name = cause.name;
  clean.stack = cause.stack;
  if (command !== undefined) Object.assign(clean, { command: { name: command?.name } });
  return clean;
}

/** A lock key (or a key template on a @Locked method) is unusable. */
export class InvalidLockKeyError extends DistributedLockError {}

/** A lock option or module option has a wrong type or value, or is unknown. */
export class InvalidLockOptionsError extends DistributedLockError {
  constructor(
    readonly option: string,
    message: string,
  ) {
    super(message);
  }
}

/** A @Locked method ran in an application that does not import DistributedLockModule. */
export class LockModuleNotImportedError extends DistributedLockError {}
