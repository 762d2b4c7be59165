import type { LockHolderIdentity } from './lock-backend.interface.js';

/** One holder of a key in the in-memory store. */
export interface MemoryHolder {
  owner: string;
  /** performance.now() deadline: wall-clock jumps must not expire or revive a lease. */
  expiresAt: number;
  fencingToken: number;
  /** How many holders it admits beside itself and the others (TryAcquireOptions.limits). */
  limit: number;
  /** Who it is, as the caller said (TryAcquireOptions.holder). */
  holder: LockHolderIdentity | undefined;
  /** performance.now() when it took the key. */
  since: number;
}

/** A caller whose attempt failed and that waits: its place in the key's line. */
interface LineEntry {
  owner: string;
  limit: number;
  /**
   * Each attempt of the owner renews it for the attempt's ttl: a waiter that vanished without
   * leaving the line holds the others up no longer than a holder that vanished. A waiter that
   * still listens for its turn has not vanished, and keeps its place past it (see prune).
   */
  expiresAt: number;
  holder: LockHolderIdentity | undefined;
  /** performance.now() when it took its place. */
  since: number;
}

/**
 * The holders of one key and its line of waiters, with the one rule of who may enter: a caller
 * with limit L enters when the key has fewer holders than L and than every holder's limit, and
 * nobody ahead of it in the line would still be left out. Everyone ahead who fits is counted as
 * in already, so a caller never takes a place the line keeps for an earlier one (a queued writer
 * blocks every later reader; a caller for a permit that is not free blocks later ones), while
 * callers that all fit (readers behind readers) may enter in any order.
 */
export class KeyHolders {
  readonly holders: MemoryHolder[] = [];
  private readonly line: LineEntry[] = [];

  /** The line, first first, as inspect shows it. */
  get waiters(): readonly Readonly<LineEntry>[] {
    return this.line;
  }

  /** Nobody holds or waits: the key's state can go. */
  get empty(): boolean {
    return this.holders.length === 0 && this.line.length === 0;
  }

  /**
   * Drops holders and waiters whose time ran out; returns the owners dropped (their key may now
   * admit others). A waiter that still listens for its turn stays: the service's waiters listen
   * from their first failed attempt until they leave, and only the head of a process's queue asks
   * again (every pollInterval, which may be longer than its ttl), so a place kept only for the
   * ttl would be lost while the waiter sleeps, and every newcomer would pass it.
   */
  prune(now: number, listening: (owner: string) => boolean = () => false): string[] {
    const dropped: string[] = [];
    for (const list of [this.holders, this.line]) {
      for (let i = list.length - 1; i >= 0; i--) {
        if (list[i].expiresAt > now || (list === this.line && listening(list[i].owner))) continue;
        dropped.push(list[i].owner);
        list.splice(i, 1);
      }
    }
    return dropped;
  }

  holder(owner: string): MemoryHolder | undefined {
    return this.holders.find((h) => h.owner === owner);
  }

  inLine(owner: string): boolean {
    return this.line.some((w) => w.owner === owner);
  }

  /** The limit of a holder that disagrees with `limit` (both above 1 and different), if any. */
  mismatch(limit: number): number | undefined {
    if (limit <= 1) return undefined;
    return this.holders.find((h) => h.limit > 1 && h.limit !== limit)?.limit;
  }

  /** Whether `owner` (in the line or not: then behind all of it) may enter with `limit` now. */
  admits(owner: string, limit: number): boolean {
    const room = this.room();
    for (const waiting of this.line) {
      if (waiting.owner === owner) break;
      if (!room.take(waiting.limit)) return false;
    }
    return room.fits(limit);
  }

  /**
   * The waiters that may enter now, in line order: those at the head of the line that all fit.
   * A release wakes these and no others. A waiter whose limit disagrees with the holders' is
   * among them too, so that it learns at once (its attempt fails with limitMismatch).
   */
  admissible(): string[] {
    const room = this.room();
    const owners: string[] = [];
    for (const waiting of this.line) {
      if (this.mismatch(waiting.limit) !== undefined) owners.push(waiting.owner);
      else if (room.take(waiting.limit)) owners.push(waiting.owner);
      else break;
    }
    return owners;
  }

  /** Into the line (at its end), or a renewed place for one already in it. */
  join(owner: string, limit: number, expiresAt: number, holder: LockHolderIdentity | undefined, now: number): void {
    const waiting = this.line.find((w) => w.owner === owner);
    if (waiting) waiting.expiresAt = Math.max(waiting.expiresAt, expiresAt);
    else this.line.push({ owner, limit, expiresAt, holder, since: now });
  }

  /** Out of the line and off the holders; whether it held the key, and whether anything changed. */
  remove(owner: string): { held: boolean; changed: boolean } {
    const held = this.holders.findIndex((h) => h.owner === owner);
    if (held >= 0) this.holders.splice(held, 1);
    const waiting = this.line.findIndex((w) => w.owner === owner);
    if (waiting >= 0) this.line.splice(waiting, 1);
    return { held: held >= 0, changed: held >= 0 || waiting >= 0 };
  }

  /** Milliseconds until the holders that keep a caller with `limit` out may have gone; undefined when nobody holds. */
  retryAfter(limit: number, now: number): number | undefined {
    if (this.holders.length === 0) return undefined;
    const remaining = this.holders.map((h) => h.expiresAt - now);
    // An exclusive caller needs all of them gone; any other, one of them.
    return Math.max(0, limit === 1 ? Math.max(...remaining) : Math.min(...remaining));
  }

  /** Who is in now, counted one by one as the line's waiters are let in ahead of a caller. */
  private room(): { fits(limit: number): boolean; take(limit: number): boolean } {
    let count = this.holders.length;
    let least = Math.min(Number.POSITIVE_INFINITY, ...this.holders.map((h) => h.limit));
    const fits = (limit: number) => count < limit && count < least;
    return {
      fits,
      take: (limit) => {
        // A waiter that disagrees with the holders can never enter beside them: it keeps no place.
        if (this.mismatch(limit) !== undefined) return true;
        if (!fits(limit)) return false;
        count++;
        least = Math.min(least, limit);
        return true;
      },
    };
  }
}
