import type { Lease } from './lock-lease.js';

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
  ) {}

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

  /** Aborts with a LockLostError when the lease is lost while held. */
  get signal(): AbortSignal {
    this.combinedSignal ??= this.leases.length === 1 ? this.leases[0].signal : AbortSignal.any(this.leases.map((l) => l.signal));
    return this.combinedSignal;
  }

  /** When the lease runs out unless extended (the watchdog extends it while autoExtend is on). */
  get expiresAt(): Date {
    return new Date(Math.min(...this.leases.map((lease) => lease.expiresAt.getTime())));
  }

  /** Neither released by this handle nor lost. */
  get isHeld(): boolean {
    return !this.released && this.leases.every((lease) => lease.state === 'held');
  }

  /**
   * Extends the lease now to `ttl` ms (default: the ttl it was acquired with). Throws
   * LockLostError if the lock is no longer held.
   */
  async extend(ttl?: number): Promise<void> {
    await Promise.all(this.leases.map((lease) => lease.extend(ttl)));
  }

  /** Releases this hold. Calling it again does nothing. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    if (this.leases.length === 1) return this.leases[0].release();
    const results = await Promise.allSettled(this.leases.map((lease) => lease.release()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}
