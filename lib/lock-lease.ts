import { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import type { LockBackend } from './backends/lock-backend.interface.js';
import { leaseScheduler, type Scheduled } from './lease-scheduler.js';
import { LockBackendError, LockLostError, type LockLostReason } from './lock.errors.js';

export type LeaseState = 'held' | 'released' | 'lost';

/** The service that tracks leases: told when one stops being held, and when its keys are free. */
export interface LeaseTracker {
  leaseEnded(lease: Lease): void;
  leaseFreed(lease: Lease): void;
}

const logger = new Logger('DistributedLock');

/**
 * One successful acquisition: the owner token, its deadline and its watchdog. Reentrant handles
 * share a lease and count as holders; the backend lock is released when the last holder lets go.
 *
 * The deadline is local and monotonic (performance.now(), started before the acquire request was
 * sent), so it never lasts longer than the lease the backend granted. The watchdog is called
 * (through the process's LeaseScheduler) at the next extension or at the deadline, whichever is
 * first; if the event loop stalls past the deadline, the call comes late and finds the deadline
 * gone: the lease is declared lost, never silently kept.
 */
export class Lease implements Scheduled {
  state: LeaseState = 'held';
  holders = 1;
  /** @internal For the scheduler. */
  dueAt = 0;
  /** @internal For the scheduler. */
  heapIndex = -1;
  /** Whether the scheduled call is an extension (else the deadline). */
  private dueExtend = false;
  /** Created on first use: most leases end without anyone reading their signal. */
  private controller: AbortController | undefined;
  private extending = false;
  private nextExtendAt: number;

  constructor(
    readonly backend: LockBackend,
    readonly keys: readonly string[],
    readonly owner: string,
    readonly fencingToken: number | undefined,
    private ttl: number,
    /** performance.now() after which the lease may be gone on the backend. */
    private deadline: number,
    private readonly autoExtend: boolean,
    private readonly tracker: LeaseTracker,
  ) {
    this.nextExtendAt = extendAt(ttl, deadline);
    this.arm();
  }

  get signal(): AbortSignal {
    this.controller ??= new AbortController();
    return this.controller.signal;
  }

  /** Wall-clock estimate of the deadline, for display; decisions use the monotonic deadline. */
  get expiresAt(): Date {
    return new Date(Date.now() + (this.deadline - performance.now()));
  }

  /** Extends now, resetting the lease to `ttl` (default: the acquisition's ttl). */
  async extend(ttl = this.ttl): Promise<void> {
    this.assertHeld();
    const sentAt = performance.now();
    let result;
    try {
      result = await this.backend.extend(this.keys, this.owner, ttl);
    } catch (error) {
      throw error instanceof LockBackendError ? error : new LockBackendError(this.backend.name, 'extend failed', error);
    }
    this.assertHeld();
    if (!result.extended) {
      this.lose('taken');
      this.assertHeld();
    } else {
      this.renewed(sentAt, ttl, result.validityMs);
    }
  }

  /** Drops one holder; the last one deletes the keys on the backend. */
  async release(): Promise<void> {
    if (--this.holders > 0 || this.state !== 'held') return;
    this.end('released');
    const releasing = this.backend.release(this.keys, this.owner);
    // The release request is on its way; a local waiter's acquire now goes out behind it (on one
    // connection: in order), saving the wait for the pub/sub message. Were it to arrive first, it
    // fails and the waiter sleeps until that message: slower, never unsafe.
    this.tracker.leaseFreed(this);
    try {
      await releasing;
    } catch (error) {
      throw error instanceof LockBackendError ? error : new LockBackendError(this.backend.name, 'release failed', error);
    }
  }

  /** Ends the lease at shutdown whatever its holder count. */
  async forceRelease(): Promise<void> {
    this.holders = 1;
    await this.release();
  }

  private assertHeld(): void {
    if (this.state === 'held') return;
    throw this.signal.aborted ? this.signal.reason : new LockLostError(this.keys, 'taken');
  }

  private renewed(sentAt: number, ttl: number, validityMs: number | undefined): void {
    this.ttl = ttl;
    this.deadline = sentAt + (validityMs ?? ttl);
    this.nextExtendAt = extendAt(ttl, this.deadline);
    this.arm();
  }

  private arm(): void {
    if (this.state !== 'held') {
      leaseScheduler.cancel(this);
      return;
    }
    this.dueExtend = this.autoExtend && !this.extending && this.nextExtendAt < this.deadline;
    leaseScheduler.schedule(this, this.dueExtend ? this.nextExtendAt : this.deadline);
  }

  /** @internal The scheduler's call: the next extension or the deadline has come. */
  fire(): void {
    this.tick(this.dueExtend);
  }

  private tick(extendNow: boolean): void {
    if (this.state !== 'held') return;
    // The deadline, or an extension due no earlier than it (a stalled event loop): lost.
    if (!extendNow || performance.now() >= this.deadline) {
      // An extension still waiting for its answer is a backend that stopped answering (a paused
      // or partitioned Redis), not a holder that forgot to extend.
      const cause = this.lastError ?? (this.extending ? new LockBackendError(this.backend.name, 'the extension got no answer before the lease ran out') : undefined);
      this.lose(cause ? 'backend-error' : 'expired', cause);
      return;
    }
    this.extending = true;
    this.arm();
    const sentAt = performance.now();
    this.backend.extend(this.keys, this.owner, this.ttl).then(
      (result) => {
        this.extending = false;
        if (this.state !== 'held') return;
        this.lastError = undefined;
        if (result.extended) this.renewed(sentAt, this.ttl, result.validityMs);
        else this.lose('taken');
      },
      (error: unknown) => {
        this.extending = false;
        if (this.state !== 'held') return;
        this.lastError = error;
        // Retry well before the deadline, so one dropped request does not cost the lease.
        this.nextExtendAt = performance.now() + Math.max(10, Math.min(this.ttl / 3, (this.deadline - performance.now()) / 3));
        this.arm();
      },
    );
  }

  private lastError: unknown;

  private lose(reason: LockLostReason, cause?: unknown): void {
    if (this.state !== 'held') return;
    this.end('lost');
    const error = new LockLostError(this.keys, reason, cause);
    logger.warn(error.message);
    this.controller ??= new AbortController();
    this.controller.abort(error);
    // Frees the keys at once if they are still ours (after a stall), so waiters need not sit out
    // the rest of the TTL. Compare-and-delete: it never touches another owner's lock.
    this.backend
      .release(this.keys, this.owner)
      .catch(() => undefined)
      .finally(() => this.tracker.leaseFreed(this));
  }

  private end(state: LeaseState): void {
    this.state = state;
    leaseScheduler.cancel(this);
    this.tracker.leaseEnded(this);
  }
}

/**
 * The next extension: after a third of the lease, or of what is left of it when the backend
 * granted less than the ttl (a lock handed over on release comes with a shorter lease).
 */
function extendAt(ttl: number, deadline: number): number {
  const now = performance.now();
  return now + Math.min(ttl, deadline - now) / 3;
}
