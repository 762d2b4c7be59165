/** Releases kept at most: a store down for long under heavy traffic must not grow this for good. */
const MAX_KEPT = 10_000;

/**
 * Releases that failed, sent again once the backend's connection is back, until the store answers
 * them. A release that failed while the store was unreachable would otherwise leave the lock held
 * by nobody until its ttl: a holder's release, the release of a caller that gave up after an
 * attempt the store carried out but whose answer was lost with its connection, or the release of
 * a lost lease whose last extension the store applied without answering. A release deletes by
 * owner, and an owner token is never used again once released: sending it twice, or after the
 * lease ran out, frees nothing of anyone else's.
 *
 * The backend says when its connection is back (see `sendAgain`).
 */
export class FailedReleases {
  /** Keys by owner. */
  private readonly pending = new Map<string, readonly string[]>();
  /** Releases of the last batch still out: one batch at a time, however often the backend says it is back. */
  private sending = 0;
  /** The backend said so again while a batch was out: another goes once it is done. */
  private askedAgain = false;

  constructor(private readonly release: (keys: readonly string[], owner: string) => Promise<unknown>) {}

  get size(): number {
    return this.pending.size;
  }

  add(keys: readonly string[], owner: string): void {
    if (this.pending.size >= MAX_KEPT) this.pending.delete(this.pending.keys().next().value!);
    this.pending.set(owner, keys);
  }

  /** The owner asks for a lock again (a caller of the backend that reuses an owner): its keys are its own again. */
  forget(owner: string): void {
    if (this.pending.size > 0) this.pending.delete(owner);
  }

  close(): void {
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
    for (const [owner, keys] of pending) this.release(keys, owner).then(done, done);
  };
}
