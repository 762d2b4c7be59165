import { performance } from 'node:perf_hooks';
import type { AcquireResult, LockBackend, LockHolderIdentity } from './backends/lock-backend.interface.js';
import type { AcquireOptions, ResolvedModuleOptions } from './distributed-lock.options.js';
import { Lease, type LeaseTracker } from './lock-lease.js';
import type { LockWaitQueue, Waiter } from './lock-wait-queue.js';
import { scopedAbortSignal } from './lock-abort-scope.js';
import { DistributedLockError, LockBackendError } from './lock.errors.js';
import { limitMismatchError, limitOf } from './lock-mode.js';
import { newOwnerToken } from './owner-token.js';

/** A wait that ended without the lock. */
export interface NotAcquired {
  waitedMs: number;
  retryAfterMs?: number;
  /** Refused without waiting: this process already had as many waiters as its cap allows. */
  queueFull?: 'perKey' | 'total';
}

/** What an acquisition needs from the LockService it runs for. */
export interface AcquisitionHost extends LeaseTracker {
  readonly backend: LockBackend;
  readonly options: ResolvedModuleOptions;
  /** This process's callers waiting for a key set, in order of arrival. */
  readonly queue: LockWaitQueue;
  /** Who this process is when a call names no site: one object for all of them. */
  readonly holder: LockHolderIdentity;
  /** Set on application shutdown: no acquisition starts or keeps waiting after it. */
  readonly shuttingDown: boolean;
  /** A lease this acquisition won: the host tracks it until it ends. */
  leaseStarted(lease: Lease): void;
  /**
   * Keeps a request in the set that shutdown waits for: one in the background (a release), or a
   * run() (attempts in flight, a waiter still to leave the backend's line).
   */
  track(request: Promise<unknown>): void;
}

/**
 * One call's way to a lease on keys the calling context does not hold yet: its attempts, its place
 * in this process's queue and in the backend's line, and giving up. One object per call.
 */
export class LockAcquisition {
  private readonly ttl: number;
  private readonly wait: number;
  private readonly autoExtend: boolean;
  private readonly minHold: number | undefined;
  private readonly maxHold: number | undefined;
  private readonly signal: AbortSignal | undefined;
  /** How many holders each key admits: 1 exclusive, n permits, SHARED (Infinity) shared. */
  readonly limit: number;
  /** What the backend gets for it: nothing for an exclusive lock, as before shared holders existed. */
  private readonly limits: readonly number[] | undefined;
  /** Who asks, stored with the lease and the place in line (docs/inspection.md). */
  private readonly holder: LockHolderIdentity;
  /**
   * One per call, shared by its attempts: the backend's line knows a waiter by it, and a release
   * hands the lock to it.
   */
  private readonly owner = newOwnerToken();
  readonly started = performance.now();
  private readonly deadline: number;
  // A caller that does not wait stays out of the backend's line: no release to leave it after.
  private readonly willWait: boolean;
  /** The key set as this process's queue names it. */
  private readonly id: string;
  private retryAfterMs: number | undefined;
  private lastError: unknown;
  /** A waiting attempt failed, so a backend that keeps a line of waiters may have us in it. */
  private inLine = false;
  private acquired: Lease | undefined;
  /** This call gave up (or failed): its owner holds nothing it knows of. */
  private finished = false;
  /** Whether a release right after our last failed attempt still reaches us once we watch. */
  private heard = false;
  private unwatch: (() => void) | undefined;
  /** The lock was not had at the first try: this call waited (in this process's queue, or for the backend). */
  contended = false;

  constructor(
    private readonly host: AcquisitionHost,
    private readonly keys: string[],
    options: AcquireOptions | undefined,
    /** The site when the options name none: `Class.method` of a @Locked method. */
    site?: string,
  ) {
    const named = options?.site ?? site;
    this.holder = named === undefined ? host.holder : { instance: host.options.instance, site: named };
    this.maxHold = options?.maxHold;
    this.minHold = options?.minHold;
    // A first lease longer than maxHold would outlive it.
    this.ttl = Math.min(options?.ttl ?? host.options.ttl, this.maxHold ?? Number.POSITIVE_INFINITY);
    this.wait = options?.wait ?? host.options.wait;
    this.autoExtend = options?.autoExtend ?? host.options.autoExtend;
    this.signal = scopedAbortSignal(options?.signal);
    this.deadline = this.started + this.wait;
    this.willWait = this.wait > 0;
    this.id = keys.join('\n');
    this.limit = limitOf(options);
    this.limits = this.limit === 1 ? undefined : keys.map(() => this.limit);
  }

  /**
   * The lease at once, without a promise or a place in the queue, from a backend that answers
   * at once (LockBackend.immediate: the in-memory one), when no caller of this process waits for
   * the keys ahead of this one. Undefined: take the asynchronous way, run(), which tries again and
   * says why not.
   */
  tryNow(): Lease | undefined {
    const immediate = this.host.backend.immediate;
    // Its steps carry no limits: a shared lock or a permit takes the way through tryAcquire.
    if (!immediate || this.limits || this.host.shuttingDown || this.signal?.aborted) return undefined;
    // As run(): a caller that does not wait tries whoever is queued; one that waits goes behind them.
    const queue = this.host.queue;
    if (this.willWait && (queue.full(this.keys) !== undefined || !queue.allTrying(this.id) || queue.behindUnseen(this.keys)))
      return undefined;
    const result = immediate.tryAcquire(this.keys, this.owner, this.ttl, this.started, this.holder);
    return result.acquired ? this.won(result, this.started) : undefined;
  }

  /**
   * The lease, ready for its holder, or how long it waited; throws on abort, shutdown or a backend
   * failure. The host tracks it for shutdown (see AcquisitionHost.track).
   */
  async run(): Promise<Lease | NotAcquired> {
    const result = await this.obtain();
    const readying = result instanceof Lease ? result.ready() : undefined;
    if (readying) await readying;
    return result;
  }

  /** The lease as won, or how long it waited. */
  private async obtain(): Promise<Lease | NotAcquired> {
    this.signal?.throwIfAborted();
    if (this.host.shuttingDown) throw this.shutDownError();
    // A caller that does not wait tries once, whoever else is queued here.
    if (this.wait === 0) {
      try {
        return (await this.attempt()) ?? this.giveUp();
      } finally {
        // An attempt that failed for good gives up here (what it may have won is released).
        this.leaveLine();
      }
    }

    // Callers of this process queue up here: only the first of them talks to the backend, so a
    // newcomer never overtakes a waiter of the same process. The exception: while nobody of ours
    // waits yet (the queue is empty, or all in it still await their first answer), a caller tries
    // at once. It joins the queue before its attempt goes out, so the queue keeps the order in which
    // attempts reach the backend (one connection: in order), which is the order of the backend's
    // line: the waiter the backend hands the lock to is normally the first here (see waitInQueue
    // for when it is not).
    const queue = this.host.queue;
    // Over a cap on waiters: busy at once, before anything is asked or queued.
    const queueFull = queue.full(this.keys);
    if (queueFull) return { waitedMs: 0, queueFull };
    const first = queue.allTrying(this.id) && !queue.behindUnseen(this.keys);
    const waiter = queue.join(this.id, this.keys, this.limit, first);
    try {
      if (first) {
        // The backend listened before the attempt went out and keeps a wake-up until it is watched.
        this.heard = this.host.backend.watching?.(this.keys) === true;
        waiter.trying = true;
        const lease = await this.attempt();
        waiter.trying = false;
        if (lease) return lease;
      }
      this.contended = true;
      return await this.waitInQueue(waiter);
    } finally {
      this.unwatch?.();
      queue.leave(this.id, this.keys, waiter);
      this.leaveLine();
    }
  }

  /** Sleeps until first in this process's queue, then tries each time it is woken or polls. */
  private async waitInQueue(waiter: Waiter): Promise<Lease | NotAcquired> {
    for (;;) {
      this.signal?.throwIfAborted();
      if (this.host.shuttingDown) throw this.shutDownError();
      if (performance.now() >= this.deadline) return this.giveUp();
      if (!this.host.queue.isHead(this.id, waiter) || this.host.queue.behindUnseen(this.keys, waiter)) {
        // Its attempt may be long past once it is first: it then tries again.
        this.heard = false;
        // The backend's line can still have it ahead of the first of this queue (an earlier
        // request of ours failed before it reached the backend, or a reconnection sent requests
        // in another order), and hand it the lock. A backend that names the waiter whose turn it
        // is (`watching`) is listened to from the first failed attempt, and a turn it names is
        // taken at once; otherwise the lock would sit with a waiter asleep until its wait ends.
        const named = this.inLine && this.host.backend.watching !== undefined;
        if (named) await this.watchThenTryNow(waiter);
        // Such a turn comes as a message, which can be lost (a subscriber that reconnected): it then
        // asks again every pollInterval too, as the first here does, or the lock would sit with it.
        const remaining = this.deadline - performance.now();
        await waiter.sleep(named ? Math.min(this.pause(), remaining) : remaining, this.signal);
        if (
          named &&
          this.unwatch &&
          !this.host.shuttingDown &&
          !this.host.queue.isHead(this.id, waiter) &&
          performance.now() < this.deadline
        ) {
          const lease = await this.attempt();
          if (lease) return lease;
        }
        continue;
      }
      if (await this.watchThenTryNow(waiter)) {
        this.host.queue.seen(waiter);
        const lease = await this.attempt();
        if (lease) return lease;
        waiter.listening = this.listening();
      }
      const remaining = this.deadline - performance.now();
      if (remaining <= 0) return this.giveUp();
      await waiter.sleep(Math.min(this.pause(), remaining), this.signal);
    }
  }

  /**
   * Subscribes (once) to the releases of the keys; whether to try again at once, since a release
   * between the failed attempt and the subscription would be missed, unless the backend kept it.
   */
  private async watchThenTryNow(waiter: Waiter): Promise<boolean> {
    const backend = this.host.backend;
    if (this.unwatch || !backend.watch) return true;
    this.unwatch = await backend.watch(this.keys, waiter.wake, this.owner).catch(() => undefined);
    waiter.listening = this.listening();
    return !(this.heard && this.unwatch);
  }

  /** In the backend's line, and watched by owner on a backend that wakes a waiter whose turn it is. */
  private listening(): boolean {
    return this.inLine && this.unwatch !== undefined && this.host.backend.watching !== undefined;
  }

  /** Polling is only the fallback for a missed wake-up; a known lease end comes first. */
  private pause(): number {
    const poll = this.host.options.pollInterval * (0.75 + Math.random() / 2);
    return this.lastError === undefined && this.retryAfterMs !== undefined ? Math.min(this.retryAfterMs + 1, poll) : poll;
  }

  /** One request to the backend: the lease if it won, else undefined (the reason is kept). */
  private async attempt(): Promise<Lease | undefined> {
    const { backend } = this.host;
    const sentAt = performance.now();
    let result;
    try {
      const onLateAcquire = (): void => this.lateAcquire();
      // Not tracked on its own: the host tracks run() for shutdown, and run() awaits it.
      result = await backend.tryAcquire(this.keys, this.owner, this.ttl, {
        willWait: this.willWait,
        onLateAcquire,
        holder: this.holder,
        ...(this.limits && { limits: this.limits }),
      });
    } catch (error) {
      // A caller's mistake the backend found before anything was sent (keys a Redis Cluster
      // cannot lock together): no retry can fix it, so it is not a backend failure to wait out.
      if (error instanceof DistributedLockError && !(error instanceof LockBackendError)) throw error;
      // A store that refuses for good (credentials, rights, read-only) fails the caller at once
      // too, but the refusal may come for a request it applied (the connection dropped after
      // sending it, and the reconnection was refused; a script that set the key, then was refused
      // on the next one): giving up releases, which frees a lock it may have won.
      if (error instanceof LockBackendError && error.permanent) {
        this.inLine = true;
        throw error;
      }
      // Applied or not, nobody knows, and an answer lost with its connection never comes late:
      // giving up releases, even without waiting, which frees a lock it may have won.
      this.inLine = true;
      this.lastError = error;
      return undefined;
    }
    this.lastError = undefined;
    if (!result.acquired) {
      this.inLine = this.willWait;
      // Callers of the key disagree on what it is: no wait heals that. Giving up takes this one out
      // of the backend's line, should the backend have put it there all the same.
      if (result.limitMismatch) throw limitMismatchError(result.limitMismatch.key, this.limit, result.limitMismatch.limit);
      this.retryAfterMs = result.retryAfterMs;
      return undefined;
    }
    if (this.host.shuttingDown || this.signal?.aborted) {
      // Won while the application shut down, or after the caller stopped wanting it: nothing
      // would release it later, so it goes now, by the background release that takes a waiter
      // out of the line.
      this.inLine = true;
      this.leaveLine();
      this.signal?.throwIfAborted();
      throw this.shutDownError();
    }
    return this.won(result, sentAt);
  }

  /** The lease a successful attempt sent at `sentAt` won; the host tracks it from now on. */
  private won(result: AcquireResult & { acquired: true }, sentAt: number): Lease | undefined {
    const { backend } = this.host;
    const granted = result.validityMs ?? this.ttl;
    const validUntil = sentAt + granted;
    if (validUntil <= performance.now()) {
      // Won, but the answer came after the lease it won had run out (a slow network, a paused
      // process): the key may be another's by now, so no section may start on it. A failed
      // attempt: the next one (same owner) starts a fresh lease, and giving up releases what is
      // left of this one.
      this.inLine = true;
      return undefined;
    }
    const holds =
      this.minHold === undefined && this.maxHold === undefined
        ? undefined
        : // Counted from the request (max: never later than the backend's) and from the answer (min: never sooner than the work began).
          { minUntil: this.minHold && performance.now() + this.minHold, maxUntil: this.maxHold && sentAt + this.maxHold };
    const lease = new Lease(
      backend,
      this.keys,
      this.owner,
      result.fencingToken,
      this.ttl,
      granted,
      sentAt,
      this.autoExtend,
      this.host,
      holds,
    );
    lease.limit = this.limit;
    this.host.leaseStarted(lease);
    this.acquired = lease;
    return lease;
  }

  /**
   * An attempt reported as failed (timed out) may still win in the backend. The owner is shared by
   * this call's attempts, so a late win is this call's own lock: while it still tries, a later
   * attempt finds the lock already its own, and giving up frees it; while it holds, it is in use.
   * Only when it gave up, or its lease already ended, would nobody free it.
   */
  private lateAcquire(): void {
    if (!this.finished && !this.acquired) this.inLine = true;
    else if (this.acquired?.state !== 'held') this.releaseInBackground();
  }

  private leaveLine(): void {
    this.finished = true;
    if (!this.inLine || this.acquired) return;
    this.inLine = false;
    // Release by an owner that holds nothing only takes it out of the backend's line, so a
    // waiter that gave up does not hold up the others (one that holds the keys frees them).
    this.releaseInBackground();
  }

  /** Not awaited; shutdown waits for it. */
  private releaseInBackground(): void {
    this.host.track(this.host.backend.release(this.keys, this.owner));
  }

  private giveUp(): NotAcquired {
    this.leaveLine();
    const error = this.lastError;
    if (error !== undefined) {
      throw error instanceof LockBackendError
        ? error
        : new LockBackendError(this.host.backend.name, `acquire of ${this.keys.join(', ')} failed: ${String(error)}`, error);
    }
    return { waitedMs: performance.now() - this.started, retryAfterMs: this.retryAfterMs };
  }

  private shutDownError(): LockBackendError {
    return new LockBackendError(this.host.backend.name, `acquire of ${this.keys.join(', ')} failed: the application is shutting down.`);
  }
}
