/** Releases kept at most: a store down for long under heavy traffic must not grow this for good. */
const MAX_KEPT = 10_000;

/** What a backend sends again for one owner: its keys, and what else it needs to free them (its `Extra`). */
interface Pending<Extra> {
  keys: readonly string[];
  extra: Extra | undefined;
}

/**
 * Releases that failed, sent again once the backend's store answers again, until it answers them.
 * A release that failed while the store was unreachable would otherwise leave the lock held by
 * nobody until its ttl (and a store that restarts its leases, as etcd does at each election,
 * restarts that ttl): a holder's release, the release of a lock lost while the store was
 * unreachable, the release of a caller that gave up after an attempt the store carried out but
 * whose answer was lost with its connection, or of a lost lease whose last extension the store
 * applied without answering. A release deletes by owner, and an owner token is never used again
 * once released: sending it twice, or after the lease ran out, frees nothing of anyone else's.
 *
 * How a backend uses it:
 * 1. `new FailedReleases((keys, owner, extra) => this.release(keys, owner))`: the function sends one
 *    release and, when it fails again, calls `add()` again (a backend's own `release()` does both).
 *    `extra` is whatever the backend gave `add()` beyond the keys (etcd: the leases to revoke).
 * 2. In `release()`, when the store could not be reached: `add(keys, owner)`, then throw, so the
 *    caller still hears of it. Not for an error waiting cannot heal (a `permanent` one).
 * 3. In `tryAcquire()`: `forget(owner)`, as the owner's keys are its own again.
 * 4. When the store is back, call `sendAgain` (it is bound): on the client's 'ready', after a
 *    statement answered, after any call answered. A store that gives no such sign is covered by
 *    `{ retryEveryMs }`: while anything is kept, it is sent again that often.
 * 5. In `close()`: `close()`.
 */
export class FailedReleases<Extra = undefined> {
  /** By owner. */
  private readonly pending = new Map<string, Pending<Extra>>();
  /** Releases of the last batch still out: one batch at a time, however often the backend says it is back. */
  private sending = 0;
  /** The backend said so again while a batch was out: another goes once it is done. */
  private askedAgain = false;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly release: (keys: readonly string[], owner: string, extra: Extra | undefined) => Promise<unknown>,
    private readonly options: { retryEveryMs?: number } = {},
  ) {}

  get size(): number {
    return this.pending.size;
  }

  add(keys: readonly string[], owner: string, extra?: Extra): void {
    if (this.pending.size >= MAX_KEPT) this.pending.delete(this.pending.keys().next().value!);
    this.pending.set(owner, { keys, extra });
    this.schedule();
  }

  /** The owner asks for a lock again (a caller of the backend that reuses an owner): its keys are its own again. */
  forget(owner: string): void {
    if (this.pending.size > 0) this.pending.delete(owner);
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.pending.clear();
    this.askedAgain = false;
  }

  /** Sends every one again; one that fails again is added again by the release itself. */
  readonly sendAgain = (): void => {
    if (this.pending.size === 0) return;
    if (this.sending > 0) {
      this.askedAgain = true;
      return;
    }
    const pending = [...this.pending];
    this.pending.clear();
    this.sending = pending.length;
    const done = (): void => {
      if (--this.sending > 0 || !this.askedAgain) return;
      this.askedAgain = false;
      this.sendAgain();
    };
    for (const [owner, { keys, extra }] of pending) this.release(keys, owner, extra).then(done, done);
  };

  /** With `retryEveryMs`: the next try of what is kept, for a store that never says it is back. */
  private schedule(): void {
    const period = this.options.retryEveryMs;
    if (period === undefined || this.timer || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.sendAgain();
      // Kept while a batch is out: the ones that fail again are added, and schedule again.
      if (this.pending.size > 0) this.schedule();
    }, period);
    this.timer.unref();
  }
}
