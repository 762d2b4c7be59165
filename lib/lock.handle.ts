import { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { inspect } from 'node:util';
import type { Lease } from './lock-lease.js';
import type { LockEvents } from './lock.events.js';
import { kindFields, kindOf, type LockKind } from './lock-mode.js';

const logger = new Logger('DistributedLock');

/**
 * A held lock. Release it exactly once (or use `await using`); it keeps its lease alive on its
 * own while held, and `signal` aborts with a LockLostError if the lease is lost anyway.
 *
 * A reentrant acquisition gets its own handle over the outer holder's lease: releasing it only
 * drops its hold, and the backend lock goes when the last holder lets go.
 */
export class LockHandle implements AsyncDisposable {
  private released = false;
  private combinedSignal: AbortSignal | undefined;

  /** @internal Created by LockService. */
  constructor(
    /** Full keys (prefix applied), sorted. */
    readonly keys: readonly string[],
    /** @internal */
    readonly leases: readonly Lease[],
    /** True when this handle entered a lock its async context already held. */
    readonly reentrant: boolean,
    /** @internal Where 'released' goes. */
    private readonly events?: LockEvents,
    /** @internal The @Locked key template, for events. */
    private readonly template?: string,
    /** @internal For the 'released' event's heldMs: a number, read whether or not anyone listens yet. */
    private readonly acquiredAt = performance.now(),
    /** @internal How many holders its keys admit: 1 exclusive, n permits, Infinity shared. */
    readonly limit = 1,
  ) {}

  /**
   * What kind of lock this handle holds, as asked: 'exclusive', 'shared' (a read lock), or
   * 'permits' (one of a semaphore's `permits`). A re-entry into an exclusive lock says what it asked for.
   */
  get mode(): LockKind {
    return kindOf(this.limit);
  }

  /** The semaphore's number of permits, when `mode` is 'permits'. */
  get permits(): number | undefined {
    return kindFields(this.limit).permits;
  }

  /**
   * Strictly greater than the token of every earlier acquisition of these keys, so storage can
   * refuse writes from a stale holder. Always `undefined` on a backend that cannot promise that
   * (`backend.fencing === false`: the Redlock backend), never a number that only looks safe; also
   * `undefined` when a reentrant handle spans locks acquired separately (use `fencingTokenFor`).
   */
  get fencingToken(): number | undefined {
    return this.leases.length === 1 ? this.leases[0].fencingToken : undefined;
  }

  /** The fencing token of the lock that covers `key` (a full key, prefix included). */
  fencingTokenFor(key: string): number | undefined {
    return this.leases.find((lease) => lease.keys.includes(key))?.fencingToken;
  }

  /**
   * Aborts with a LockLostError when the lease is lost while held. Reading it checks the clock: a
   * signal read after the deadline is already aborted, even when a stalled event loop has not yet
   * let the watchdog's timer run.
   */
  get signal(): AbortSignal {
    this.readLeases();
    this.combinedSignal ??= this.leases.length === 1 ? this.leases[0].signal : AbortSignal.any(this.leases.map((l) => l.signal));
    return this.combinedSignal;
  }

  /** When the lease runs out unless extended (the watchdog extends it while autoExtend is on). */
  get expiresAt(): Date {
    return new Date(Math.min(...this.leases.map((lease) => lease.expiresAt.getTime())));
  }

  /** Neither released by this handle nor lost; past the deadline it is false, and `signal` aborts. */
  get isHeld(): boolean {
    return this.readLeases() && !this.released;
  }

  /**
   * Throws the LockLostError that aborts `signal` if the lease is lost: `signal.throwIfAborted()`
   * that checks the clock first, so a stall past the deadline is noticed here, in the same tick.
   * Call it before each write that must happen under the lock. A handle you released yourself is
   * not lost (see `isHeld`).
   */
  throwIfLost(): void {
    if (this.readLeases()) return;
    if (this.combinedSignal?.aborted) throw this.combinedSignal.reason;
    for (const lease of this.leases) if (lease.state === 'lost') throw lease.signal.reason;
  }

  /**
   * Extends the lease now to `ttl` ms (default: the ttl it was acquired with), never past the
   * lock's `maxHold` (then `expiresAt` shows the shorter end). Throws LockLostError if the lock
   * is no longer held.
   */
  async extend(ttl?: number): Promise<void> {
    await Promise.all(this.leases.map((lease) => lease.extend(ttl)));
  }

  /** Releases this hold. Calling it again does nothing. */
  release(): Promise<void> {
    return this.releaseNow() ? Promise.resolve() : this.releaseLater();
  }

  /**
   * @internal Releases at once when that needs no answer to wait for (a re-entry letting go, or
   * a backend that answers at once): true when done, false when nothing was done and release() must be
   * awaited.
   */
  releaseNow(): boolean {
    if (this.released) return true;
    if (this.leases.length !== 1 || !this.leases[0].releasesNow) return false;
    this.markReleased();
    this.leases[0].releaseNow();
    return true;
  }

  private async releaseLater(): Promise<void> {
    this.markReleased();
    if (this.leases.length === 1) return this.leases[0].release();
    const results = await Promise.allSettled(this.leases.map((lease) => lease.release()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  /**
   * The end of an `await using` block. A failed release is logged, not thrown: thrown here, it
   * would replace the block's result, or wrap its error in a SuppressedError. The lease then
   * expires on its own. Call `release()` to see the error.
   */
  /**
   * What a log line or a response body shows of a handle. The owner token stays out: whoever has
   * it can release or extend the lock as its holder.
   */
  toJSON(): {
    keys: readonly string[];
    mode: LockKind;
    permits?: number;
    fencingToken?: number;
    isHeld: boolean;
    reentrant: boolean;
    expiresAt: Date;
  } {
    const { keys, fencingToken, isHeld, reentrant, expiresAt } = this;
    return { keys, mode: this.mode, ...kindFields(this.limit), fencingToken, isHeld, reentrant, expiresAt };
  }

  [inspect.custom](depth: number, options: object): string {
    return `LockHandle ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.releaseQuietly();
  }

  /** @internal Releases, logging a failure instead of throwing it: the end of a scope (`using()`, `await using`). */
  async releaseQuietly(): Promise<void> {
    try {
      await this.release();
    } catch (error) {
      const cause = error instanceof Error && error.cause !== undefined ? ` (cause: ${String(error.cause)})` : '';
      logger.warn(`Release of ${this.keys.join(', ')} failed; the lease will expire on its own. ${String(error)}${cause}`);
    }
  }

  private markReleased(): void {
    this.released = true;
    // Before the backend's answer: the next holder's 'acquired' must not come first.
    const events = this.events;
    if (events?.has('released')) {
      events.emit('released', {
        keys: this.keys,
        template: this.template,
        ...kindFields(this.limit),
        heldMs: performance.now() - this.acquiredAt,
        reentrant: this.reentrant,
      });
    }
  }

  /** Reads every lease's state, so each one past its deadline is declared lost now; true if all are held. */
  private readLeases(): boolean {
    let held = true;
    for (const lease of this.leases) if (lease.state !== 'held') held = false;
    return held;
  }
}
