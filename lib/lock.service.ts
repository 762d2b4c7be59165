import { Injectable, Logger, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { isObservable } from 'rxjs';
import type { LockBackend, LockHolderIdentity } from './backends/lock-backend.interface.js';
import { InFlight } from './backends/in-flight.js';
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
import { LockAcquisition, type NotAcquired } from './lock-acquisition.js';
import { fullLockKeys, type LockKeys } from './lock-key.js';
import { leaseScheduler } from './lease-scheduler.js';
import { Lease } from './lock-lease.js';
import { LockWaitQueue } from './lock-wait-queue.js';
import { logWaitsAndRefusals } from './lock.debug-log.js';
import { LockEvents, type LockBusyEvent } from './lock.events.js';
import { instrumentLocks } from './lock.telemetry.js';
import { InvalidLockKeyError, LockBackendError, LockNotAcquiredError } from './lock.errors.js';
import { LockHandle } from './lock.handle.js';
import { checkBackendHolds, checkReentry, kindFields, limitOf } from './lock-mode.js';
import { checkListQuery, lockInfo, type LockInfo, type LockList, type LockListQuery } from './lock-inspection.js';

export type { LockHolderInfo, LockInfo } from './lock-inspection.js';

/**
 * Manual lock control, and the engine behind @Locked. Use it from Nest (inject it) or on its own:
 * `new LockService(backend, options)`.
 */
@Injectable()
// Not `implements AcquisitionHost`: its members are internal, and the published types leave them out.
export class LockService implements OnModuleInit, OnApplicationShutdown {
  readonly options: ResolvedModuleOptions;
  /** @internal This process's callers waiting for a key set, in order of arrival. */
  readonly queue: LockWaitQueue;
  /** @internal Who this process is, stored with its leases when a call names no site (docs/inspection.md). */
  readonly holder: LockHolderIdentity;
  /** Acquired, released, busy, failed, lost, extended: `locks.events.on('busy', (event) => ...)` (docs/observability.md). */
  readonly events = new LockEvents();
  private readonly leases = new Set<Lease>();
  /** Requests that run in the background (releases after a scope returned or a lease ended, acquisitions under way); shutdown waits for them. */
  private readonly requests = new InFlight();
  /** Aborted on application shutdown: no acquisition starts or keeps waiting after it. */
  private readonly stopper = new AbortController();
  private verifying: Promise<void> | undefined;
  private closing: Promise<void> | undefined;

  constructor(
    readonly backend: LockBackend = new MemoryLockBackend(),
    options?: DistributedLockModuleOptions,
  ) {
    this.options = resolveModuleOptions(options, backend);
    this.holder = { instance: this.options.instance };
    this.queue = new LockWaitQueue({ perKey: this.options.maxWaitersPerKey, total: this.options.maxWaiters });
    // Both are listeners of `events`, like any the application adds: with neither, no event is built.
    if (this.options.debugLogs) logWaitsAndRefusals(this.events);
    const telemetry = this.options.telemetry;
    if (telemetry) instrumentLocks(this.events, backend.name, telemetry === true ? {} : telemetry);
  }

  /**
   * Waits up to `wait` ms for every key and returns the handle. Throws LockNotAcquiredError on
   * timeout. Inside a scope that already holds the keys (`using()`, @Locked) it re-enters.
   * The handle does not make the calling context a holder: use `using()` for that.
   */
  async acquire(keys: LockKeys, options?: AcquireOptions): Promise<LockHandle> {
    checkAcquireOptions(options, 'LockService.acquire');
    const full = this.fullKeys(keys);
    const held = this.hold(full, options);
    const result = held instanceof LockHandle ? held : await held;
    if (result instanceof LockHandle) return result;
    const wait = options?.wait ?? this.options.wait;
    throw new LockNotAcquiredError(full, result.waitedMs, result.retryAfterMs, result.queueFull, wait, limitOf(options));
  }

  /** One attempt, no waiting: the handle, or undefined if any key is held elsewhere. */
  async tryAcquire(keys: LockKeys, options?: Omit<AcquireOptions, 'wait'>): Promise<LockHandle | undefined> {
    checkAcquireOptions(options, 'LockService.tryAcquire');
    const held = this.hold(this.fullKeys(keys), { ...options, wait: 0 });
    const result = held instanceof LockHandle ? held : await held;
    return result instanceof LockHandle ? result : undefined;
  }

  /**
   * Runs `fn` holding the keys and releases them after, whatever `fn` does. Code that `fn` calls
   * (in its async context) re-enters these keys without waiting. With `onBusy: 'skip'` a busy
   * lock returns undefined instead of throwing.
   */
  async using<T>(keys: LockKeys, fn: (lock: LockHandle) => T | Promise<T>, options?: UsingOptions & { onBusy?: 'throw' }): Promise<T>;
  async using<T>(keys: LockKeys, fn: (lock: LockHandle) => T | Promise<T>, options: UsingOptions): Promise<T | undefined>;
  async using<T>(keys: LockKeys, fn: (lock: LockHandle) => T | Promise<T>, options?: UsingOptions): Promise<T | undefined> {
    checkUsingOptions(options, 'LockService.using');
    return this.run(this.fullKeys(keys), fn, options);
  }

  /** Whether anyone holds the key now. */
  async isLocked(key: string): Promise<boolean> {
    return (await this.inspect(key)) !== undefined;
  }

  /**
   * The current lease on a key, or undefined when it is free: its holders and, where the backend
   * stores them, who they are and the line of waiters (docs/inspection.md). Read-only.
   */
  async inspect(key: string): Promise<LockInfo | undefined> {
    const [full] = this.fullKeys(key);
    const state = await this.backend.inspect(full);
    if (!state) return undefined;
    const owners = new Set([...this.leases].map((lease) => lease.owner));
    return lockInfo({ ...state, key: full }, (owner) => owners.has(owner));
  }

  /**
   * One page of the keys held now under `prefix` (after the keyPrefix), at most `limit`; pass the
   * page's `cursor` back for the next. A key held from the first page to the last is listed exactly
   * once. Read-only; the cost per backend is in docs/inspection.md.
   */
  async list(query?: LockListQuery): Promise<LockList> {
    const { prefix, limit, cursor } = checkListQuery(query, this.backend);
    const { keyPrefix } = this.options;
    const page = await this.backend.list!({ prefix: keyPrefix + prefix, limit, ...(cursor !== undefined && { cursor }) });
    const keys = page.keys.map((key) => key.slice(keyPrefix.length));
    return page.cursor === undefined ? { keys } : { keys, cursor: page.cursor };
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
  async run<T>(
    keys: string[],
    fn: (lock: LockHandle) => T | Promise<T>,
    options?: UsingOptions,
    template?: string,
    site?: string,
  ): Promise<T | undefined> {
    // 'skip' means "do not wait": a job that another instance is running is skipped at once, not
    // run after it (unless a wait is asked for).
    if (options?.onBusy === 'skip' && options.wait === undefined) options = { ...options, wait: 0 };
    const held = this.hold(keys, options, template, site);
    const result = held instanceof LockHandle ? held : await held;
    if (!(result instanceof LockHandle)) {
      if (options?.onBusy === 'skip') return undefined;
      const wait = options?.wait ?? this.options.wait;
      throw new LockNotAcquiredError(keys, result.waitedMs, result.retryAfterMs, result.queueFull, wait, limitOf(options));
    }
    // Not awaited: the caller gets its result one round trip sooner. Still ordered: the lease is
    // marked released at once (no re-entry), and the release request is sent before any later
    // request of this process. The method's own result or error wins over a failed release.
    const release = (): void => {
      if (!result.releaseNow()) this.track(result.releaseQuietly());
    };
    let handedOver = false;
    try {
      const value = await runHolding(result, () => fn(result));
      if (!isObservable(value)) return value;
      // An Observable's work runs while it is subscribed: the lock goes with it.
      const held = holdWhileSubscribed(value, result, release, (subscribe) => this.run(keys, subscribe, options, template, site));
      handedOver = held !== undefined;
      return held ? (held as T) : value;
    } finally {
      if (!handedOver) release();
    }
  }

  /** @internal Prefixed, checked, de-duplicated and sorted (see fullLockKeys); @Locked calls it directly. */
  fullKeys(keys: LockKeys): string[] {
    return fullLockKeys(keys, this.options);
  }

  /**
   * At start-up, before the application listens: the backend's own check of what connecting can
   * show is wrong (LockBackend.verify). A permanent LockBackendError (credentials, rights, a
   * read-only server, no such database) fails start-up with the backend's message, not the first
   * lock. A store that cannot be reached yet does not: verify resolves, and locks fail until it
   * is back. Once, however many modules of the application provide this service.
   */
  onModuleInit(): Promise<void> {
    this.verifying ??= Promise.resolve(this.backend.verify?.()).catch((error: unknown) => {
      if (error instanceof LockBackendError && error.permanent) throw error;
      // Not what verify() is for (see its contract): a failure that may heal does not stop start-up.
      new Logger('DistributedLock').warn(`The ${this.backend.name} backend's start-up check failed; starting anyway: ${String(error)}`);
    });
    return this.verifying;
  }

  /** Once, however many modules of the application provide this service (distributed-lock.registry.ts). */
  onApplicationShutdown(): Promise<void> {
    return (this.closing ??= this.shutdown());
  }

  private async shutdown(): Promise<void> {
    // Waiters give up now, not at the end of their wait: their timers would keep the process
    // alive, and the backend they wait on is about to close. They leave its line on the way out.
    this.stopper.abort();
    this.queue.wakeAll();
    // Every lease still here has a holder that is running: its signal aborts (LockLostError
    // 'shutdown') before its keys are deleted, so it can stop before another instance enters.
    // Released before closing the backend: its connections are needed to delete the keys.
    await Promise.allSettled([...this.leases].map((lease) => lease.shutdown()));
    // Attempts in flight (bounded by the backend's own timeouts) may still win, and what they win
    // is given back by a release sent after they answer: wait until nothing is left.
    await this.requests.settled();
    await this.backend.close?.();
  }

  /**
   * @internal What this service keeps now, for leak checks: leases it tracks, requests in the
   * background, queues and per-key counts, and the process's scheduled watchdogs. Each is bounded by
   * the locks held and waited for at this moment, never by the keys used before.
   */
  footprint(): { leases: number; requests: number; keySets: number; countedKeys: number; scheduled: number } {
    return { leases: this.leases.size, requests: this.requests.size, ...this.queue.footprint, scheduled: leaseScheduler.size };
  }

  /** @internal Whether the application is shutting down: no acquisition starts or keeps waiting. */
  get shuttingDown(): boolean {
    return this.stopper.signal.aborted;
  }

  /** @internal Aborts when shuttingDown turns true: what waits on a timer in the background stops. */
  get stopping(): AbortSignal {
    return this.stopper.signal;
  }

  /** @internal An acquisition won this lease: inspect() and shutdown know it until it ends. */
  leaseStarted(lease: Lease): void {
    this.leases.add(lease);
  }

  /** @internal */
  leaseEnded(lease: Lease): void {
    this.leases.delete(lease);
  }

  /** @internal A local release wakes the next local waiter at once, without waiting for pub/sub. */
  leaseFreed(lease: Lease): void {
    if (this.queue.waiting > 0) this.queue.wakeHead(lease.keys.join('\n'), lease.limit === 1);
  }

  /**
   * Acquires what the context does not hold yet through this service's backend, and re-enters
   * what it does. The handle itself (no promise) when a first attempt could be answered at once:
   * on the in-memory backend most calls end there, and each promise saved is a measurable share
   * of their cost (more so once an AsyncLocalStorage has Node run its hooks for every promise).
   */
  private hold(
    keys: string[],
    options: AcquireOptions | undefined,
    template?: string,
    site?: string,
  ): LockHandle | Promise<LockHandle | NotAcquired> {
    checkBackendHolds(this.backend, limitOf(options), keys);
    const held = heldLocks(this.backend);
    if (held !== undefined && keys.some((key) => held.has(key))) return this.holdAsync(keys, options, template, site);
    const acquisition = new LockAcquisition(this, keys, options, site);
    const lease = acquisition.tryNow();
    if (!lease) return this.holdAsync(keys, options, template, site, acquisition);
    return this.handleFor(keys, [lease], false, acquisition.started, false, template, 1, acquisition.started);
  }

  private handleFor(
    keys: string[],
    leases: Lease[],
    reentrant: boolean,
    started: number,
    contended: boolean,
    template: string | undefined,
    limit: number,
    acquiredAt?: number,
  ): LockHandle {
    const events = this.events;
    const handle = new LockHandle(keys, leases, reentrant, events, template, acquiredAt, limit);
    if (events.has('acquired')) {
      const { fencingToken } = handle;
      const kind = kindFields(limit);
      events.emit('acquired', { keys, template, ...kind, fencingToken, waitedMs: performance.now() - started, contended, reentrant });
    }
    return handle;
  }

  /** hold() when the answer takes a promise: a wait, a backend request, keys held in part. `first` is the acquisition tried already. */
  private async holdAsync(
    keys: string[],
    options: AcquireOptions | undefined,
    template: string | undefined,
    site: string | undefined,
    first?: LockAcquisition,
  ): Promise<LockHandle | NotAcquired> {
    const started = first?.started ?? performance.now();
    const events = this.events;
    // A wait asked, not what is left of it on a second round: a call that asked to wait and ran out timed out.
    const asked = options?.wait ?? this.options.wait;
    const limit = limitOf(options);
    let contended = false;
    try {
      for (;;) {
        const held = heldLocks(this.backend);
        const covering = new Set<Lease>();
        let missing = keys;
        if (held) {
          missing = [];
          for (const key of keys) {
            const lease = held.get(key)?.leases.find((l) => l.keys.includes(key));
            if (lease?.state === 'held') {
              // A shared holder asking for an exclusive lock on its key would deadlock: refused here.
              checkReentry(key, lease.limit, limit);
              covering.add(lease);
            } else missing.push(key);
          }
          if (covering.size > 0 && missing.length > 0) this.checkOrder(missing, covering);
        }
        let fresh: Lease | undefined;
        if (missing.length > 0) {
          const acquisition = first ?? new LockAcquisition(this, missing, options, site);
          first = undefined;
          const running = acquisition.run();
          // Shutdown wakes waiters and closes the backend after what it tracks: a woken waiter
          // still has to leave the backend's line, or free a lock a release handed it meanwhile.
          this.track(running);
          const result = await running;
          contended ||= acquisition.contended;
          if (!(result instanceof Lease)) {
            if (events.has('busy')) events.emit('busy', this.busyEvent(keys, template, result, started, asked, limit));
            return result;
          }
          fresh = result;
        }
        const ended = [...covering].find((lease) => lease.state !== 'held');
        if (!ended) {
          for (const lease of covering) lease.holders++;
          const leases = fresh ? [...covering, fresh] : [...covering];
          return this.handleFor(keys, leases, covering.size > 0, started, contended, template, limit);
        }
        // The outer holder let go while we waited for the rest. Lost: never re-enter a lost lock.
        // Released: a released lock is never re-entered either, so everything is acquired anew, as
        // one request, within what is left of the wait.
        await fresh?.release().catch(() => undefined);
        if (ended.state === 'lost') throw ended.signal.reason;
        // What is left of the wait asked, counted from the start: `options.wait` is already what
        // was left for this round.
        options = { ...options, wait: Math.max(0, asked - (performance.now() - started)) };
        contended = true;
      }
    } catch (error) {
      if (events.has('failed'))
        events.emit('failed', { keys, template, ...kindFields(limit), waitedMs: performance.now() - started, error });
      throw error;
    }
  }

  private busyEvent(
    keys: string[],
    template: string | undefined,
    result: NotAcquired,
    started: number,
    asked: number,
    limit: number,
  ): LockBusyEvent {
    const { queueFull, retryAfterMs } = result;
    const timedOut = queueFull === undefined && asked > 0;
    return { keys, template, ...kindFields(limit), waitedMs: performance.now() - started, timedOut, queueFull, retryAfterMs };
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

  /**
   * @internal Keeps a request in the set that shutdown waits for until it settles: one in the
   * background (a release after a scope returned), or an acquisition's run(). Its failure is the
   * caller's to see; here it only ends the tracking.
   */
  track(request: Promise<unknown>): void {
    this.requests.track(request);
  }
}
