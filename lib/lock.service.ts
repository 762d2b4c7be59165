import { Injectable, Logger, type OnApplicationShutdown } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import type { LockBackend } from './backends/lock-backend.interface.js';
import { MemoryLockBackend } from './backends/memory.backend.js';
import {
  checkAcquireOptions,
  checkUsingOptions,
  resolveModuleOptions,
  type AcquireOptions,
  type DistributedLockModuleOptions,
  type ResolvedModuleOptions,
  type UsingOptions,
} from './distributed-lock.options.js';
import { heldLocks, runHolding } from './lock-context.js';
import { Lease, type LeaseTracker } from './lock-lease.js';
import { LockWaitQueue } from './lock-wait-queue.js';
import { DistributedLockError, InvalidLockKeyError, LockBackendError, LockNotAcquiredError } from './lock.errors.js';
import { LockHandle } from './lock.handle.js';
import { newOwnerToken } from './owner-token.js';

/** What `inspect()` tells about a key. */
export interface LockInfo {
  /** Full key, prefix included. */
  key: string;
  /** Remaining lease in milliseconds. */
  ttlMs: number;
  fencingToken?: number;
  /** Whether this LockService (this process) holds it. */
  heldHere: boolean;
}

type Keys = string | readonly string[];

interface NotAcquired {
  waitedMs: number;
  retryAfterMs?: number;
}

const logger = new Logger('DistributedLock');

/**
 * Manual lock control, and the engine behind @Locked. Use it from Nest (inject it) or on its own:
 * `new LockService(backend, options)`.
 */
@Injectable()
export class LockService implements OnApplicationShutdown, LeaseTracker {
  readonly options: ResolvedModuleOptions;
  private readonly queue = new LockWaitQueue();
  private readonly leases = new Set<Lease>();
  /** Releases that run after a scope returned; shutdown waits for them. */
  private readonly releasing = new Set<Promise<void>>();
  /** Set on application shutdown: no acquisition starts or keeps waiting after it. */
  private shutDown = false;

  constructor(
    readonly backend: LockBackend = new MemoryLockBackend(),
    options?: DistributedLockModuleOptions,
  ) {
    this.options = resolveModuleOptions(options);
  }

  /**
   * Waits up to `wait` ms for every key and returns the handle. Throws LockNotAcquiredError on
   * timeout. Inside a scope that already holds the keys (`using()`, @Locked) it re-enters.
   * The handle does not make the calling context a holder: use `using()` for that.
   */
  async acquire(keys: Keys, options?: AcquireOptions): Promise<LockHandle> {
    checkAcquireOptions(options, 'LockService.acquire');
    const full = this.fullKeys(keys);
    const result = await this.hold(full, options);
    if (result instanceof LockHandle) return result;
    throw new LockNotAcquiredError(full, result.waitedMs, result.retryAfterMs);
  }

  /** One attempt, no waiting: the handle, or undefined if any key is held elsewhere. */
  async tryAcquire(keys: Keys, options?: Omit<AcquireOptions, 'wait'>): Promise<LockHandle | undefined> {
    checkAcquireOptions(options, 'LockService.tryAcquire');
    const result = await this.hold(this.fullKeys(keys), { ...options, wait: 0 });
    return result instanceof LockHandle ? result : undefined;
  }

  /**
   * Runs `fn` holding the keys and releases them after, whatever `fn` does. Code that `fn` calls
   * (in its async context) re-enters these keys without waiting. With `onBusy: 'skip'` a busy
   * lock returns undefined instead of throwing.
   */
  async using<T>(keys: Keys, fn: (lock: LockHandle) => T | Promise<T>, options?: UsingOptions & { onBusy?: 'throw' }): Promise<T>;
  async using<T>(keys: Keys, fn: (lock: LockHandle) => T | Promise<T>, options: UsingOptions): Promise<T | undefined>;
  async using<T>(keys: Keys, fn: (lock: LockHandle) => T | Promise<T>, options?: UsingOptions): Promise<T | undefined> {
    checkUsingOptions(options, 'LockService.using');
    return this.run(this.fullKeys(keys), fn, options);
  }

  /** Whether anyone holds the key now. */
  async isLocked(key: string): Promise<boolean> {
    return (await this.inspect(key)) !== undefined;
  }

  /** The current lease on a key, or undefined when it is free. */
  async inspect(key: string): Promise<LockInfo | undefined> {
    const [full] = this.fullKeys(key);
    const state = await this.backend.inspect(full);
    if (!state) return undefined;
    const heldHere = [...this.leases].some((lease) => lease.owner === state.owner);
    return { key: full, ttlMs: state.ttlMs, fencingToken: state.fencingToken, heldHere };
  }

  /**
   * The handle the current async context holds: for `key` (without prefix), or the innermost one.
   * Inside a @Locked method this is how to reach the fencing token.
   */
  current(key?: string): LockHandle | undefined {
    const held = heldLocks();
    if (!held) return undefined;
    if (key !== undefined) {
      const handle = held.get(this.fullKeys(key)[0]);
      return handle?.isHeld ? handle : undefined;
    }
    const handles = [...held.values()];
    for (let i = handles.length - 1; i >= 0; i--) if (handles[i].isHeld) return handles[i];
    return undefined;
  }

  /** @internal The body of `using()` once keys and options are checked; @Locked calls it directly. */
  async run<T>(keys: string[], fn: (lock: LockHandle) => T | Promise<T>, options?: UsingOptions): Promise<T | undefined> {
    const result = await this.hold(keys, options);
    if (!(result instanceof LockHandle)) {
      if (options?.onBusy === 'skip') return undefined;
      throw new LockNotAcquiredError(keys, result.waitedMs, result.retryAfterMs);
    }
    try {
      return await runHolding(result, () => fn(result));
    } finally {
      // Not awaited: the caller gets its result one round trip sooner. Still ordered: the lease is
      // marked released at once (no re-entry), and the release request is sent before any later
      // request of this process. The method's own result or error wins over a failed release.
      this.track(
        result.release().catch((error: unknown) => logger.warn(`Release of ${keys.join(', ')} failed; the lease will expire on its own. ${describeError(error)}`)),
      );
    }
  }

  /** Prefixes, checks, de-duplicates and sorts keys: one global order means no lock-order deadlock. */
  fullKeys(keys: Keys): string[] {
    // One key, the usual case: nothing to de-duplicate or sort.
    if (typeof keys === 'string') return [this.fullKey(keys)];
    if (!Array.isArray(keys) || keys.length === 0) {
      throw new InvalidLockKeyError(`Lock keys must be a non-empty string or a non-empty array of strings, got ${describeKeys(keys)}.`);
    }
    return [...new Set(keys.map((key) => this.fullKey(key)))].sort();
  }

  /** One key checked and prefixed. */
  private fullKey(key: unknown): string {
    if (typeof key !== 'string' || key.length === 0) {
      throw new InvalidLockKeyError(`A lock key must be a non-empty string, got ${describeKeys(key)}. Name what you lock, e.g. 'order:42'.`);
    }
    const { keyPrefix, maxKeyLength } = this.options;
    const prefixed = keyPrefix + key;
    if (prefixed.length > maxKeyLength) {
      throw new InvalidLockKeyError(
        `Lock key '${prefixed.slice(0, 60)}…' is ${prefixed.length} characters long, over maxKeyLength ${maxKeyLength}. ` +
          `Lock an identifier rather than a payload, or raise maxKeyLength in DistributedLockModule.forRoot().`,
      );
    }
    return prefixed;
  }

  async onApplicationShutdown(): Promise<void> {
    // Waiters give up now, not at the end of their wait: their timers would keep the process
    // alive, and the backend they wait on is about to close. They leave its line on the way out.
    this.shutDown = true;
    this.queue.wakeAll();
    // Release before closing the backend: its connections are needed to delete the keys.
    await Promise.allSettled([...this.leases].map((lease) => lease.forceRelease()));
    await Promise.allSettled([...this.releasing]);
    await this.backend.close?.();
  }

  /** @internal */
  leaseEnded(lease: Lease): void {
    this.leases.delete(lease);
  }

  /** @internal A local release wakes the next local waiter at once, without waiting for pub/sub. */
  leaseFreed(lease: Lease): void {
    this.queue.wakeHead(lease.keys.join('\n'));
  }

  /** Acquires what the context does not hold yet, and re-enters what it does. */
  private async hold(keys: string[], options: AcquireOptions | undefined): Promise<LockHandle | NotAcquired> {
    const held = heldLocks();
    const covering = new Set<Lease>();
    let missing = keys;
    if (held) {
      missing = [];
      for (const key of keys) {
        const lease = held.get(key)?.leases.find((l) => l.keys.includes(key));
        if (lease?.state === 'held') covering.add(lease);
        else missing.push(key);
      }
    }
    let fresh: Lease | undefined;
    if (missing.length > 0) {
      const result = await this.acquireLease(missing, options);
      if (!(result instanceof Lease)) return result;
      fresh = result;
    }
    for (const lease of covering) {
      if (lease.state !== 'held') {
        // The outer lock was lost while we waited for the rest: never re-enter a lost lock.
        await fresh?.release();
        throw lease.signal.reason;
      }
    }
    for (const lease of covering) lease.holders++;
    const leases = fresh ? [...covering, fresh] : [...covering];
    return new LockHandle(keys, leases, covering.size > 0);
  }

  private async acquireLease(keys: string[], options: AcquireOptions | undefined): Promise<Lease | NotAcquired> {
    const ttl = options?.ttl ?? this.options.ttl;
    const wait = options?.wait ?? this.options.wait;
    const autoExtend = options?.autoExtend ?? this.options.autoExtend;
    const signal = options?.signal;
    signal?.throwIfAborted();
    if (this.shutDown) throw this.shutDownError(keys);

    const owner = newOwnerToken();
    const started = performance.now();
    const deadline = started + wait;
    let retryAfterMs: number | undefined;
    let lastError: unknown;
    /** A waiting attempt failed, so a backend that keeps a line of waiters may have us in it. */
    let inLine = false;
    // A caller that does not wait stays out of the backend's line: no release to leave it after.
    const willWait = wait > 0;
    let acquired = false;

    const attempt = async (): Promise<Lease | undefined> => {
      const sentAt = performance.now();
      try {
        const result = await this.backend.tryAcquire(keys, owner, ttl, { willWait });
        lastError = undefined;
        if (!result.acquired) {
          inLine = willWait;
          retryAfterMs = result.retryAfterMs;
          return undefined;
        }
        if (this.shutDown) {
          // Won while the application shut down: nothing would release it later, so it goes now,
          // by the same background release that takes a waiter out of the line.
          lastError = this.shutDownError(keys);
          inLine = true;
          leaveLine();
          return undefined;
        }
        const lease = new Lease(this.backend, keys, owner, result.fencingToken, ttl, sentAt + (result.validityMs ?? ttl), autoExtend, this);
        this.leases.add(lease);
        acquired = true;
        return lease;
      } catch (error) {
        // A caller's mistake the backend found (keys a Redis Cluster cannot lock together): no
        // retry can fix it, so it is not a backend failure to wait out.
        if (error instanceof DistributedLockError && !(error instanceof LockBackendError)) throw error;
        inLine = willWait;
        lastError = error;
        return undefined;
      }
    };
    const leaveLine = (): void => {
      if (!inLine || acquired) return;
      inLine = false;
      // Release by an owner that holds nothing only takes it out of the backend's line, so a
      // waiter that gave up does not hold up the others (one that holds the keys frees them).
      // Not awaited; shutdown waits for it.
      this.track(this.backend.release(keys, owner).then(() => undefined, () => undefined));
    };
    const giveUp = (): NotAcquired => {
      leaveLine();
      if (lastError !== undefined) {
        throw lastError instanceof LockBackendError
          ? lastError
          : new LockBackendError(this.backend.name, `acquire of ${keys.join(', ')} failed: ${String(lastError)}`, lastError);
      }
      return { waitedMs: performance.now() - started, retryAfterMs };
    };

    // A caller that does not wait tries once, whoever else is queued here.
    if (wait === 0) return (await attempt()) ?? giveUp();

    const id = keys.join('\n');
    // Whether a release right after our last failed attempt still reaches us once we watch: the
    // backend listened before the attempt went out and keeps a wake-up until it is watched.
    let heard = false;
    // Nobody of ours is queued: try at once. Concurrent first tries of this process join the
    // backend's line in the order their answers come back, which is the order they line up here.
    if (!this.queue.has(id)) {
      heard = this.backend.watching?.(keys) === true;
      const lease = await attempt();
      if (lease) return lease;
    }

    // Callers of this process line up here: only the first of them talks to the backend, so a
    // newcomer never overtakes a waiter of the same process.
    const waiter = this.queue.join(id);
    let unwatch: (() => void) | undefined;
    try {
      for (;;) {
        signal?.throwIfAborted();
        if (this.shutDown) throw this.shutDownError(keys);
        if (performance.now() >= deadline) return giveUp();
        if (!this.queue.isHead(id, waiter)) {
          // Its attempt may be long past once it is first: it then tries again.
          heard = false;
          await waiter.sleep(deadline - performance.now(), signal);
          continue;
        }
        // Subscribe, then try again at once, since a release between the failed attempt and the
        // subscription would be missed; unless the backend kept it for us.
        let tryNow = true;
        if (!unwatch && this.backend.watch) {
          unwatch = await this.backend.watch(keys, waiter.wake, owner).catch(() => undefined);
          tryNow = !(heard && unwatch);
        }
        if (tryNow) {
          const lease = await attempt();
          if (lease) return lease;
        }
        const remaining = deadline - performance.now();
        if (remaining <= 0) return giveUp();
        // Polling is only the fallback for a missed wake-up; a known lease end comes first.
        const poll = this.options.pollInterval * (0.75 + Math.random() / 2);
        const pause = lastError === undefined && retryAfterMs !== undefined ? Math.min(retryAfterMs + 1, poll) : poll;
        await waiter.sleep(Math.min(pause, remaining), signal);
      }
    } finally {
      unwatch?.();
      this.queue.leave(id, waiter);
      leaveLine();
    }
  }

  private shutDownError(keys: readonly string[]): LockBackendError {
    return new LockBackendError(this.backend.name, `acquire of ${keys.join(', ')} failed: the application is shutting down.`);
  }

  /** Keeps a background request (a release) in the set that shutdown waits for. */
  private track(request: Promise<void>): void {
    const tracked = request.finally(() => this.releasing.delete(tracked));
    this.releasing.add(tracked);
  }
}

function describeError(error: unknown): string {
  const cause = error instanceof Error && error.cause !== undefined ? ` (cause: ${String(error.cause)})` : '';
  return `${String(error)}${cause}`;
}

function describeKeys(value: unknown): string {
  if (value === '') return "''";
  if (Array.isArray(value)) return value.length === 0 ? 'an empty array' : 'an array';
  return typeof value === 'string' ? `'${value}'` : String(value);
}
