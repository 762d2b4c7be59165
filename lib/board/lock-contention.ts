import type { LockEvents } from '../lock.events.js';

/** How contended a key was over the window, as this process saw it. */
export interface LockContentionCounts {
  /** Acquisitions that found the key held and waited for it (then got it). */
  waits: number;
  /** Calls that did not get the key: refused at once, a full queue, or a wait that ran out. */
  busy: number;
  /** Leases lost while held (expired, taken, store unreachable). */
  lost: number;
}

interface Bucket extends LockContentionCounts {
  /** Start of the bucket's slice of time, ms since the epoch. */
  at: number;
}

export interface LockContentionOptions {
  /** How far back counts go, in ms. */
  windowMs: number;
  /** At most this many keys are remembered; the one counted longest ago goes first. */
  maxKeys: number;
  /** Only keys under this prefix are counted, and without it. */
  keyPrefix: string;
}

/** Slices per window: counts age out a tenth of the window at a time. */
const SLICES = 10;

/**
 * Per-key counts of waits, busy answers and lost leases over the last few minutes, from the lock
 * events this process's LockService emits. Bounded: at most `maxKeys` keys of SLICES buckets each,
 * whatever the number of keys the application locks.
 */
export class LockContention {
  private readonly keys = new Map<string, Bucket[]>();
  private readonly sliceMs: number;
  private readonly stops: (() => void)[];

  constructor(
    events: LockEvents,
    private readonly options: LockContentionOptions,
    private readonly now: () => number = Date.now,
  ) {
    this.sliceMs = Math.max(1, Math.ceil(options.windowMs / SLICES));
    this.stops = [
      // A re-entry never waits; a contended acquisition did.
      events.on('acquired', (event) => {
        if (event.contended && !event.reentrant) this.count(event.keys, 'waits');
      }),
      events.on('busy', (event) => this.count(event.keys, 'busy')),
      events.on('lost', (event) => this.count(event.keys, 'lost')),
    ];
  }

  /** The counts of `key` (without the keyPrefix) over the window; zeros for a key not seen. */
  of(key: string): LockContentionCounts {
    const total = { waits: 0, busy: 0, lost: 0 };
    const since = this.now() - this.options.windowMs;
    for (const bucket of this.keys.get(key) ?? []) {
      if (bucket.at + this.sliceMs <= since) continue;
      total.waits += bucket.waits;
      total.busy += bucket.busy;
      total.lost += bucket.lost;
    }
    return total;
  }

  /** The `limit` most contended keys over the window, most first (by busy, lost, then waits). */
  top(limit: number): (LockContentionCounts & { key: string })[] {
    const rows = [...this.keys.keys()].map((key) => ({ key, ...this.of(key) })).filter((row) => row.waits + row.busy + row.lost > 0);
    rows.sort((a, b) => b.busy + b.lost - (a.busy + a.lost) || b.waits - a.waits || (a.key < b.key ? -1 : 1));
    return rows.slice(0, limit);
  }

  /** Keys remembered now (for the memory bound's test). */
  get size(): number {
    return this.keys.size;
  }

  stop(): void {
    for (const stop of this.stops.splice(0)) stop();
  }

  private count(fullKeys: readonly string[], field: keyof LockContentionCounts): void {
    const { keyPrefix, maxKeys, windowMs } = this.options;
    const now = this.now();
    const at = now - (now % this.sliceMs);
    for (const full of fullKeys) {
      if (!full.startsWith(keyPrefix)) continue;
      const key = full.slice(keyPrefix.length);
      const buckets = this.keys.get(key) ?? [];
      // Moved to the end of the map's order: the key counted longest ago is first, and goes first.
      this.keys.delete(key);
      while (buckets.length > 0 && buckets[0].at + this.sliceMs <= now - windowMs) buckets.shift();
      let last = buckets[buckets.length - 1];
      if (last?.at !== at) buckets.push((last = { at, waits: 0, busy: 0, lost: 0 }));
      last[field]++;
      this.keys.set(key, buckets);
      if (this.keys.size > maxKeys) this.keys.delete(this.keys.keys().next().value!);
    }
  }
}
