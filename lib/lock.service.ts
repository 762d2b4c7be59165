import { Injectable, type OnApplicationShutdown } from '@nestjs/common';
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
import { holdWhileSubscribed } from './lock-observable.js';
import { Lease, type LeaseTracker } from './lock-lease.js';
import { LockWaitQueue } from './lock-wait-queue.js';
import { DistributedLockError, InvalidLockKeyError, LockBackendError, LockNotAcquiredError } from './lock.errors.js';
import { LockHandle } from './lock.handle.js';
import { checkKeyCharacters, quoteKey } from './lock-key.js';
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

/**
 * Manual lock control, and the engine behind @Locked. Use it from Nest (inject it) or on its own:
 * `new LockService(backend, options)`.
 */
@Injectable()
export class LockService implements OnApplicationShutdown, LeaseTracker {
  readonly options: ResolvedModuleOptions;
  private readonly queue = new LockWaitQueue();
  private readonly leases = new Set<Lease>();
  /** Requests that run in the background (releases after a scope returned, attempts in flight); shutdown waits for them. */
  private readonly releasing = new Set<Promise<void>>();
  /** Set on application shutdown: no acquisition starts or keeps waiting after it. */
  private shutDown = false;

  constructor(
    readonly backend: LockBackend = new MemoryLockBackend(),
    options?: DistributedLockModuleOptions,
  ) {
    this.options = resolveModuleOptions(options, backend);
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
    const held = heldLocks(this.backend);
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
    // Not awaited: the caller gets its result one round trip sooner. Still ordered: the lease is
    // marked released at once (no re-entry), and the release request is sent before any later
    // request of this process. The method's own result or error wins over a failed release.
    const release = (): void => this.track(result.releaseQuietly());
    let handedOver = false;
    try {
      const value = await runHolding(result, () => fn(result));
      // An Observable's work runs while it is subscribed: the lock goes with it.
      const held = holdWhileSubscribed(value, result, release, (subscribe) => this.run(keys, subscribe, options));
      handedOver = held !== undefined;
      return held ? (held as T) : value;
    } finally {
      if (!handedOver) release();
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
        `Lock key ${quoteKey(prefixed.slice(0, 60))}… is ${prefixed.length} characters long, over maxKeyLength ${maxKeyLength}. ` +
          `Lock an identifier rather than a payload, or raise maxKeyLength in DistributedLockModule.forRoot().`,
      );
    }
    checkKeyCharacters(prefixed);
    return prefixed;
  }

  async onApplicationShutdown(): Promise<void> {
    // Waiters give up now, not at the end of their wait: their timers would keep the process
    // alive, and the backend they wait on is about to close. They leave its line on the way out.
    this.shutDown = true;
    this.queue.wakeAll();
    // Every lease still here has a holder that is running: its signal aborts (LockLostError
    // 'shutdown') before its keys are deleted, so it can stop before another instance enters.
    // Released before closing the backend: its connections are needed to delete the keys.
    await Promise.allSettled([...this.leases].map((lease) => lease.shutdown()));
    // Attempts in flight (bounded by the backend's own timeouts) may still win, and what they win
    // is given back by a release sent after they answer: wait until nothing is left.
    while (this.releasing.size > 0) await Promise.allSettled([...this.releasing]);
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

  /**
   * Acquires what the context does not hold yet through this service's backend, and re-enters
   * what it does.
   */
  private async hold(keys: string[], options: AcquireOptions | undefined): Promise<LockHandle | NotAcquired> {
    const started = performance.now();
    for (;;) {
      const held = heldLocks(this.backend);
      const covering = new Set<Lease>();
      let missing = keys;
      if (held) {
        missing = [];
        for (const key of keys) {
          const lease = held.get(key)?.leases.find((l) => l.keys.includes(key));
          if (lease?.state === 'held') covering.add(lease);
          else missing.push(key);
        }
        if (covering.size > 0 && missing.length > 0) this.checkOrder(missing, covering);
      }
      let fresh: Lease | undefined;
      if (missing.length > 0) {
        const result = await this.acquireLease(missing, options);
        if (!(result instanceof Lease)) return result;
        fresh = result;
      }
      const ended = [...covering].find((lease) => lease.state !== 'held');
      if (!ended) {
        for (const lease of covering) lease.holders++;
        const leases = fresh ? [...covering, fresh] : [...covering];
        return new LockHandle(keys, leases, covering.size > 0);
      }
      // The outer holder let go while we waited for the rest. Lost: never re-enter a lost lock.
      // Released: a released lock is never re-entered either, so everything is acquired anew, as
      // one request, within what is left of the wait.
      await fresh?.release().catch(() => undefined);
      if (ended.state === 'lost') throw ended.signal.reason;
      const wait = options?.wait ?? this.options.wait;
      options = { ...options, wait: Math.max(0, wait - (performance.now() - started)) };
    }
  }

  /**
   * Keys are taken in one global order (sorted), which is what keeps callers from deadlocking. A
   * request that holds some of its keys already and would take one that sorts before them breaks
   * that order (holding b, taking a, while another caller holding a waits for b), so it is refused.
   */
  private checkOrder(missing: readonly string[], covering: ReadonlySet<Lease>): void {
    const heldKeys = [...covering].flatMap((lease) => lease.keys);
    const greatestHeld = heldKeys.reduce((a, b) => (a > b ? a : b));
    const before = missing.filter((key) => key < greatestHeld);
    if (before.length === 0) return;
    throw new InvalidLockKeyError(
      `Cannot add ${before.join(', ')} to the lock on ${heldKeys.join(', ')} held by this context: keys are taken in sorted order, and ` +
        `${before[0]} sorts before ${greatestHeld}, so two callers doing this could deadlock. Lock all of them together in the outer ` +
        `call, or nest the locks in sorted order.`,
    );
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
    let acquired: Lease | undefined;
    /** This call gave up (or failed): its owner holds nothing it knows of. */
    let finished = false;

    // An attempt reported as failed (timed out) may still win in the backend. The owner is one per
    // call, shared by its attempts: the backend's line knows a waiter by it, and a release hands
    // the lock to it. So a late win is this call's own lock: while it still tries, a later attempt
    // finds the lock already its own, and giving up frees it; while it holds, it is in use. Only
    // when it gave up, or its lease already ended, would nobody free it.
    const onLateAcquire = (): void => {
      if (!finished && !acquired) inLine = true;
      else if (acquired?.state !== 'held') this.track(this.backend.release(keys, owner).then(() => undefined, () => undefined));
    };
    const attempt = async (): Promise<Lease | undefined> => {
      const sentAt = performance.now();
      let result;
      try {
        const request = this.backend.tryAcquire(keys, owner, ttl, { willWait, onLateAcquire });
        this.track(request.then(() => undefined, () => undefined));
        result = await request;
      } catch (error) {
        // A caller's mistake the backend found (keys a Redis Cluster cannot lock together): no
        // retry can fix it, so it is not a backend failure to wait out.
        if (error instanceof DistributedLockError && !(error instanceof LockBackendError)) throw error;
        inLine = willWait;
        lastError = error;
        return undefined;
      }
      lastError = undefined;
      if (!result.acquired) {
        inLine = willWait;
        retryAfterMs = result.retryAfterMs;
        return undefined;
      }
      if (this.shutDown || signal?.aborted) {
        // Won while the application shut down, or after the caller stopped wanting it: nothing
        // would release it later, so it goes now, by the background release that takes a waiter
        // out of the line.
        inLine = true;
        leaveLine();
        signal?.throwIfAborted();
        throw this.shutDownError(keys);
      }
      const lease = new Lease(this.backend, keys, owner, result.fencingToken, ttl, sentAt + (result.validityMs ?? ttl), autoExtend, this);
      this.leases.add(lease);
      acquired = lease;
      return lease;
    };
    const leaveLine = (): void => {
      finished = true;
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
    // Callers of this process line up here: only the first of them talks to the backend, so a
    // newcomer never overtakes a waiter of the same process. The exception: while nobody of ours
    // waits yet (the queue is empty, or all in it still await their first answer), a caller tries
    // at once. It joins the queue before its attempt goes out, so the queue keeps the order in which
    // attempts reach the backend (one connection: in order), which is the order of the backend's
    // line: the waiter the backend hands the lock to is always the first here, the one listening.
    const first = this.queue.allTrying(id);
    const waiter = this.queue.join(id);
    let unwatch: (() => void) | undefined;
    try {
      if (first) {
        heard = this.backend.watching?.(keys) === true;
        waiter.trying = true;
        const lease = await attempt();
        waiter.trying = false;
        if (lease) return lease;
      }
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

function describeKeys(value: unknown): string {
  if (value === '') return "''";
  if (Array.isArray(value)) return value.length === 0 ? 'an empty array' : 'an array';
  return typeof value === 'string' ? `'${value}'` : String(value);
}
