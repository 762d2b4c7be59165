import { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ExtendResult, LockBackend } from './backends/lock-backend.interface.js';
import { leaseScheduler } from './lease-scheduler.js';
import type { LockEvents } from './lock.events.js';
import { LockBackendError, LockLostError, type LockLostReason } from './lock.errors.js';
import { kindFields } from './lock-mode.js';

export type LeaseState = 'held' | 'released' | 'lost';

/** The service that tracks leases: told when one stops being held, and when its keys are free. */
export interface LeaseTracker {
  leaseEnded(lease: Lease): void;
  leaseFreed(lease: Lease): void;
  /** Where 'lost' and 'extended' go. */
  readonly events?: LockEvents;
  /** Aborts on application shutdown: a lease's requests after its end (a resend) stop then. */
  readonly stopping: AbortSignal;
  /** Keeps a request in the set that shutdown waits for before it closes the backend. */
  track(request: Promise<unknown>): void;
}

const logger = new Logger('DistributedLock');

/** The bounds a lock's minHold and maxHold set, as performance.now() times. */
export interface HoldBounds {
  /** A release before it keeps the keys until it (the lease is shortened, not deleted). */
  minUntil?: number;
  /** No extension reaches past it. */
  maxUntil?: number;
}

/**
 * One successful acquisition: the owner token, its deadline and its watchdog. Reentrant handles
 * share a lease and count as holders; the backend lock is released when the last holder lets go.
 *
 * The deadline is local and monotonic (performance.now(), started before the request that set it
 * was sent, with the ttl that request carried), so it never lasts longer than the lease the
 * backend granted. The watchdog is called (through the process's LeaseScheduler) at the next
 * extension or at the deadline, whichever is first. A stalled event loop delays that call, so
 * every read of `state` or `signal` also compares the clock with the deadline: the first read
 * after it declares the lease lost, in the same tick, never a lease silently kept.
 */
// A Scheduled for the LeaseScheduler (checked where it is scheduled), not declared as one: the
// scheduler's fields are internal, and the published types leave them out.
export class Lease {
  holders = 1;
  /** How many holders its keys admit (1 exclusive, n permits, Infinity shared): what a re-entry may ask for. */
  limit = 1;
  /** @internal For the scheduler. */
  dueAt = 0;
  /** @internal For the scheduler. */
  heapIndex = -1;
  private current: LeaseState = 'held';
  /** performance.now() after which the lease may be gone on the backend. */
  private deadline: number;
  /** Whether the scheduled call is an extension (else the deadline). */
  private dueExtend = false;
  /** Created on first use: most leases end without anyone reading their signal. */
  private controller: AbortController | undefined;
  private nextExtendAt: number;
  /** Why the last extension failed, until one succeeds: the cause if the lease runs out. */
  private lastError: unknown;
  /** Extensions asked and not answered yet: the one out and those waiting their turn. */
  private extensions = 0;
  /** Settles once the last extension asked so far has its answer: the next one goes out after it. */
  private lastExtension: Promise<unknown> = Promise.resolve();
  /** An extension went unanswered: the store may still apply it, after requests sent later (see releaseAfterMinHold). */
  private extensionInDoubt = false;
  /** The last extension was cut short by maxHold: the lease now ends there, and no extension follows. */
  private atMaxHold = false;
  /** Resolves when the lease ends, so an extension queued behind one that never answers gives up. */
  private ended: Promise<void> | undefined;
  private resolveEnded: (() => void) | undefined;

  constructor(
    readonly backend: LockBackend,
    readonly keys: readonly string[],
    readonly owner: string,
    readonly fencingToken: number | undefined,
    private ttl: number,
    /** How long (ms) the backend certainly keeps the lease, counted from `grantedAt`: the ttl, or less. */
    private readonly granted: number,
    /** A clock reading taken before the lease was granted (its request's): the deadline and the first extension count from it. */
    grantedAt: number,
    private readonly autoExtend: boolean,
    private readonly tracker: LeaseTracker,
    private readonly holds?: HoldBounds,
  ) {
    this.deadline = grantedAt + granted;
    this.atMaxHold = holds?.maxUntil !== undefined && this.deadline >= holds.maxUntil;
    this.nextExtendAt = extendAt(ttl, this.deadline, grantedAt);
    this.arm();
  }

  /**
   * @internal Called once by the acquisition that won the lease, before its holder runs. A lock
   * handed over on release may come with less than the ttl (at most the waiterTimeout): without a
   * watchdog (autoExtend off) it is extended to the ttl asked once here. Within 5% of the ttl (a
   * backend's drift allowance, Redlock's) it is taken as it is. A failed extension leaves the
   * shorter lease, which still ends (its signal aborts) on time. Undefined: ready as it is.
   */
  ready(): Promise<void> | undefined {
    if (this.autoExtend || this.granted >= this.ttl * 0.95) return undefined;
    return this.extend().catch(() => undefined);
  }

  /** 'held' until released or lost; read after the deadline, it turns 'lost' then and there. */
  get state(): LeaseState {
    this.noticeDeadline();
    return this.current;
  }

  get signal(): AbortSignal {
    this.noticeDeadline();
    this.controller ??= new AbortController();
    return this.controller.signal;
  }

  /** Wall-clock estimate of the deadline, for display; decisions use the monotonic deadline. */
  get expiresAt(): Date {
    return new Date(Date.now() + (this.deadline - performance.now()));
  }

  /**
   * Extends to `ttl` (default: the lease's ttl), which the watchdog then keeps extending by.
   *
   * Manual and automatic extensions go out one at a time, in the order asked: with two requests
   * out, the backend keeps the ttl of whichever it ran last, and the answers cannot say which that
   * was. So a manual extend asked while the watchdog's request is out waits for that answer, then
   * sends its own ttl, counted from when it goes out: the caller gets the lease it asked for. The
   * watchdog sends nothing while a manual extension is out or waiting (see arm()): that one renews
   * the lease and re-arms the watchdog; if no answer comes before the deadline, the lease is lost,
   * as when the watchdog's own request goes unanswered.
   */
  async extend(ttl?: number): Promise<void> {
    this.assertHeld();
    if (!(await this.serially(() => this.send(ttl ?? this.ttl, false)))) this.assertHeld();
  }

  /**
   * @internal Whether release() would need no answer from the backend: a re-entry lets go, the
   * lease already ended, or the backend frees the keys at once (LockBackend.immediate; no minHold
   * to keep).
   */
  get releasesNow(): boolean {
    if (this.holders > 1 || this.current !== 'held') return true;
    return this.holds?.minUntil === undefined && this.backend.immediate !== undefined;
  }

  /** @internal release() right after `releasesNow` said it needs no answer. */
  releaseNow(): void {
    if (--this.holders > 0 || this.state !== 'held') return;
    this.end('released');
    this.backend.immediate!.release(this.keys, this.owner);
    this.tracker.leaseFreed(this);
  }

  /** Drops one holder; the last one deletes the keys on the backend (or keeps them until minHold). */
  async release(): Promise<void> {
    if (--this.holders > 0 || this.state !== 'held') return;
    this.end('released');
    if (this.holds?.minUntil !== undefined) {
      // Not free yet: the lease is shortened to the rest of minHold and runs out by itself. Local
      // waiters are not woken; they wait for that end as for any lease.
      const kept = await this.keepForMinHold().catch((error: unknown) => {
        // Not lost: sent again until it lands, or the old lease ends, and the caller hears of it.
        this.tracker.track(this.resendMinHold());
        throw error instanceof LockBackendError ? error : new LockBackendError(this.backend.name, 'release failed', error);
      });
      if (kept) {
        if (this.extensionInDoubt) this.tracker.track(this.releaseAfterMinHold());
        return;
      }
    }
    const releasing = this.backend.release(this.keys, this.owner);
    // Out of the service's leases from now on: shutdown waits for it all the same, before it closes the backend.
    this.tracker.track(releasing);
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

  /**
   * Ends the lease at application shutdown, whatever its holder count. Holders still running are
   * told first (the signal aborts with LockLostError 'shutdown', `isHeld` turns false), then the
   * keys are deleted; resolves once the backend answered, so the backend can be closed after.
   */
  shutdown(): Promise<void> {
    if (this.current === 'held' && performance.now() >= this.deadline) return this.expire();
    return this.lose('shutdown');
  }

  /**
   * With minHold still ahead, shortens the lease to the rest of it instead of freeing the keys;
   * true when it did. An extension still out is awaited first: on a backend that can run two
   * requests in either order (a connection pool), it would otherwise land after the shortening
   * and keep the key for a whole ttl.
   */
  private async keepForMinHold(): Promise<boolean> {
    if (this.extensions > 0) await this.lastExtension;
    const until = this.holds?.minUntil;
    const keep = until === undefined ? 0 : Math.ceil(until - performance.now());
    if (keep <= 0) return false;
    await this.backend.extend(this.keys, this.owner, keep);
    return true;
  }

  /**
   * The lease was shortened to the rest of minHold, but an extension sent before went unanswered:
   * on a connection pool it may land after the shortening and keep the key a whole ttl with no
   * holder. So the keys are released once minHold is over (a late extension cannot bring a deleted
   * key back); at shutdown before then, the shortening is sent once more instead.
   */
  private async releaseAfterMinHold(): Promise<void> {
    const until = this.holds?.minUntil ?? 0;
    const stopping = this.tracker.stopping;
    await sleep(Math.max(0, until - performance.now()), undefined, { signal: stopping, ref: false }).catch(ignore);
    // Only shutdown wakes it early (a timer may fire a millisecond before `until` by this clock).
    const keep = Math.ceil(until - performance.now());
    if (stopping.aborted && keep > 0) await this.backend.extend(this.keys, this.owner, keep).catch(ignore);
    else await this.backend.release(this.keys, this.owner).then(() => this.tracker.leaseFreed(this), ignore);
  }

  /**
   * A shortening to the rest of minHold that failed (store unreachable) would leave the key for
   * its old lease, a whole ttl: sent again until it lands. Past minHold, at the old lease's end or
   * at shutdown (after one last try) it gives up with a release, which the backend sends again if
   * it fails: else a late extension of the old lease (a watchdog's, still queued in a client) could
   * keep the key a whole ttl with no holder. Owner-checked, so never another's lock. Shutdown
   * cuts its pause short and waits for it.
   */
  private async resendMinHold(): Promise<void> {
    const stopping = this.tracker.stopping;
    while (performance.now() < this.deadline) {
      const pause = Math.min(1_000, Math.max(50, (this.deadline - performance.now()) / 5));
      await sleep(pause, undefined, { signal: stopping, ref: false }).catch(ignore);
      const keep = Math.ceil((this.holds?.minUntil ?? 0) - performance.now());
      if (keep <= 0 || performance.now() >= this.deadline) break;
      if (await this.backend.extend(this.keys, this.owner, keep).then(() => true, ignore)) {
        if (this.extensionInDoubt) await this.releaseAfterMinHold();
        return;
      }
      if (stopping.aborted) break;
    }
    await this.backend.release(this.keys, this.owner).then(() => this.tracker.leaseFreed(this), ignore);
  }

  /** The scheduler's call comes late when the event loop stalls: a read past the deadline declares the loss itself. */
  private noticeDeadline(): void {
    if (this.current === 'held' && performance.now() >= this.deadline) void this.expire();
  }

  private assertHeld(): void {
    if (this.state === 'held') return;
    throw this.signal.aborted ? this.signal.reason : new LockLostError(this.keys, 'taken');
  }

  /** Runs `send` after every extension asked before it has its answer (or the lease ended). */
  private async serially(send: () => Promise<boolean>): Promise<boolean> {
    const ahead = this.extensions > 0 ? this.lastExtension : undefined;
    this.extensions++;
    const mine = ahead ? Promise.race([ahead, this.whenEnded()]).then(send) : send();
    this.lastExtension = mine.catch(() => undefined);
    this.arm();
    try {
      return await mine;
    } finally {
      this.extensions--;
      this.arm();
    }
  }

  /**
   * One extend request. Its answer sets the deadline from the ttl this request carried, counted
   * from before it went out. Resolves false when the lease did not survive it (lost or released
   * meanwhile; a lease once lost is never revived, even by a late success).
   */
  private async send(ttl: number, automatic: boolean): Promise<boolean> {
    this.assertHeld();
    const sentAt = performance.now();
    // Never past maxHold: what is left of it, if shorter than the ttl asked.
    const maxUntil = this.holds?.maxUntil;
    const granted = maxUntil === undefined ? ttl : Math.min(ttl, Math.floor(maxUntil - sentAt));
    if (granted <= 0) {
      this.atMaxHold = true;
      return true;
    }
    let result: ExtendResult;
    try {
      result = await this.backend.extend(this.keys, this.owner, granted);
    } catch (error) {
      this.extensionInDoubt = true;
      if (this.current === 'held') {
        this.lastError = error;
        // No answer is not "not applied": the backend may still run the request later, and then
        // the lease ends at least `granted` after it was sent. When that is sooner than the lease
        // counted so far (a manual extend to a shorter ttl), the deadline comes forward to it.
        this.deadline = Math.min(this.deadline, sentAt + granted);
        // Retry well before the deadline, so one dropped request does not cost the lease.
        this.nextExtendAt = performance.now() + Math.max(10, Math.min(this.ttl / 3, (this.deadline - performance.now()) / 3));
      }
      throw error instanceof LockBackendError ? error : new LockBackendError(this.backend.name, 'extend failed', error);
    }
    if (this.state !== 'held') return false;
    this.lastError = undefined;
    if (!result.extended) {
      void this.lose('taken');
      return false;
    }
    this.ttl = ttl;
    this.atMaxHold = granted < ttl;
    const validity = Math.min(result.validityMs ?? granted, granted);
    this.deadline = sentAt + validity;
    this.nextExtendAt = extendAt(ttl, this.deadline);
    const events = this.tracker.events;
    if (events?.has('extended')) events.emit('extended', { keys: this.keys, ...kindFields(this.limit), ttlMs: validity, automatic });
    return true;
  }

  private whenEnded(): Promise<void> {
    return (this.ended ??= new Promise((resolve) => (this.resolveEnded = resolve)));
  }

  private arm(): void {
    if (this.current !== 'held') {
      leaseScheduler.cancel(this);
      return;
    }
    this.dueExtend = this.autoExtend && !this.atMaxHold && this.extensions === 0 && this.nextExtendAt < this.deadline;
    leaseScheduler.schedule(this, this.dueExtend ? this.nextExtendAt : this.deadline);
  }

  /** @internal The scheduler's call: the next extension or the deadline has come. */
  fire(): void {
    if (this.current !== 'held') return;
    // The deadline, or an extension due no earlier than it (a stalled event loop): lost.
    if (!this.dueExtend || performance.now() >= this.deadline) {
      void this.expire();
      return;
    }
    // A failure is kept in lastError and retried by the schedule; the deadline decides.
    this.serially(() => this.send(this.ttl, true)).catch(() => undefined);
  }

  /** The deadline passed without a successful extension. */
  private expire(): Promise<void> {
    // An extension still waiting for its answer is a backend that stopped answering (a paused
    // or partitioned Redis), not a holder that forgot to extend.
    const unanswered =
      this.extensions > 0 ? new LockBackendError(this.backend.name, 'the extension got no answer before the lease ran out') : undefined;
    const cause = this.lastError ?? unanswered;
    if (!cause && this.atMaxHold) return this.lose('max-hold');
    return this.lose(cause ? 'backend-error' : 'expired', cause);
  }

  /** Tells the holders (the signal aborts), then frees the keys if they are still ours. */
  private lose(reason: LockLostReason, cause?: unknown): Promise<void> {
    if (this.current !== 'held') return Promise.resolve();
    this.end('lost');
    const error = new LockLostError(this.keys, reason, cause);
    logger.warn(error.message);
    this.controller ??= new AbortController();
    this.controller.abort(error);
    const events = this.tracker.events;
    if (events?.has('lost')) events.emit('lost', { keys: this.keys, ...kindFields(this.limit), reason, error });
    // At shutdown, a lock asked to be kept for a while (minHold) is kept for the rest of it.
    if (reason === 'shutdown' && this.holds?.minUntil !== undefined) {
      return this.keepForMinHold().then((kept) => (kept ? undefined : this.free()), ignore);
    }
    return this.free();
  }

  /**
   * Frees the keys at once if they are still ours (after a stall), so waiters need not sit out
   * the rest of the TTL. Compare-and-delete: it never touches another owner's lock.
   */
  private free(): Promise<void> {
    const freeing = this.backend
      .release(this.keys, this.owner)
      .then(ignore, ignore)
      .finally(() => this.tracker.leaseFreed(this));
    // A lease lost before shutdown is no longer among the service's leases: shutdown waits for this all the same.
    this.tracker.track(freeing);
    return freeing;
  }

  private end(state: LeaseState): void {
    this.current = state;
    leaseScheduler.cancel(this);
    this.resolveEnded?.();
    this.tracker.leaseEnded(this);
  }
}

function ignore(): undefined {
  return undefined;
}

/**
 * The next extension: after a third of the lease, or of what is left of it when the backend
 * granted less than the ttl (a lock handed over on release comes with a shorter lease).
 */
function extendAt(ttl: number, deadline: number, now = performance.now()): number {
  return now + Math.min(ttl, deadline - now) / 3;
}
