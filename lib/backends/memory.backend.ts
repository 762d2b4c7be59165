import { performance } from 'node:perf_hooks';
import type { AcquireResult, ExtendResult, ImmediateLockSteps, LockBackend, LockState } from './lock-backend.interface.js';

interface Lease {
  owner: string;
  /** performance.now() deadline: wall-clock jumps must not expire or revive a lease. */
  expiresAt: number;
  fencingToken: number;
}

const SWEEP_FLOOR = 1_024;

/**
 * Leases in this process's memory. Real semantics (TTL expiry, owner-only release, fencing,
 * release notifications) so it can stand in for Redis in unit tests, but it excludes nothing
 * across processes: fit for tests and single-instance apps only.
 */
export class MemoryLockBackend implements LockBackend {
  readonly name = 'memory';
  readonly fencing = true;

  private readonly leases = new Map<string, Lease>();
  private readonly watchers = new Map<string, Set<() => void>>();
  /**
   * One counter for all keys is still strictly increasing per key, and costs no memory per key.
   * Never below the clock in µs (see nextToken): the process that comes after a restart starts
   * above every token this one gave.
   */
  private lastToken = 0;
  /** Size of `leases` past which expired leases nobody looked at again are dropped (see sweep). */
  private sweepAbove = SWEEP_FLOOR;
  /** tryAcquire and release without their promises (see `immediate`). */
  private readonly steps: ImmediateLockSteps = {
    tryAcquire: (keys, owner, ttlMs, now) => this.acquireAt(keys, owner, ttlMs, now),
    release: (keys, owner) => this.free(keys, owner),
  };

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<AcquireResult> {
    return this.acquireAt(keys, owner, ttlMs, performance.now());
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const now = performance.now();
    if (!keys.every((key) => this.live(key, now)?.owner === owner)) return { extended: false };
    for (const key of keys) this.leases.get(key)!.expiresAt = now + ttlMs;
    return { extended: true };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    return this.free(keys, owner);
  }

  /**
   * Every answer is known at once. Offered only while tryAcquire and release are this class's own:
   * a replacement (a subclass, a test's spy) is what must run.
   */
  get immediate(): ImmediateLockSteps | undefined {
    return this.tryAcquire === ownTryAcquire && this.release === ownRelease ? this.steps : undefined;
  }

  /** `now` may be taken before the call: the lease then ends no later than the caller counts it. */
  private acquireAt(keys: readonly string[], owner: string, ttlMs: number, now: number): AcquireResult {
    let retryAfterMs: number | undefined;
    for (const key of keys) {
      const lease = this.live(key, now);
      if (lease) retryAfterMs = Math.max(retryAfterMs ?? 0, lease.expiresAt - now);
    }
    if (retryAfterMs !== undefined) return { acquired: false, retryAfterMs: Math.ceil(retryAfterMs) };
    const fencingToken = this.nextToken();
    for (const key of keys) this.leases.set(key, { owner, expiresAt: now + ttlMs, fencingToken });
    if (this.leases.size > this.sweepAbove) this.sweep(now);
    return { acquired: true, fencingToken };
  }

  /**
   * One more than the last token, but never below the wall clock in microseconds (as the Redis
   * backend does with its server's clock). The counter alone would start again at 1 in the next
   * process, and storage that checks tokens would refuse every write of it. Tokens given so far
   * are at most the clock when they were given, plus one per acquisition taken faster than one
   * per µs, so the next process's first token is above them unless the clock was set back (or the
   * process ran ahead of it by more than the restart took). Near 1.8e15: exact in a JavaScript
   * number until the year 2255.
   */
  private nextToken(): number {
    const token = Math.max(this.lastToken + 1, Date.now() * 1_000);
    this.lastToken = token;
    return token;
  }

  private free(keys: readonly string[], owner: string): boolean {
    let released = false;
    for (const key of keys) {
      if (this.leases.get(key)?.owner !== owner) continue;
      this.leases.delete(key);
      released = true;
      this.notify(key);
    }
    return released;
  }

  async inspect(key: string): Promise<LockState | undefined> {
    const now = performance.now();
    const lease = this.live(key, now);
    return lease && { key, owner: lease.owner, ttlMs: Math.max(0, Math.ceil(lease.expiresAt - now)), fencingToken: lease.fencingToken };
  }

  async watch(keys: readonly string[], onRelease: () => void): Promise<() => void> {
    for (const key of keys) {
      let set = this.watchers.get(key);
      if (!set) this.watchers.set(key, (set = new Set()));
      set.add(onRelease);
    }
    return () => {
      for (const key of keys) {
        const set = this.watchers.get(key);
        if (set?.delete(onRelease) && set.size === 0) this.watchers.delete(key);
      }
    };
  }

  /** @internal How many keys hold a lease (live or not yet seen expired) and how many are watched. */
  get footprint(): { keys: number; watchedKeys: number } {
    return { keys: this.leases.size, watchedKeys: this.watchers.size };
  }

  async close(): Promise<void> {
    this.watchers.clear();
    this.leases.clear();
  }

  /**
   * A lease that runs out instead of being released (kept for minHold, or its holder stopped)
   * stays until its key is used again: over many keys that would grow without end. A sweep each
   * time the map doubles since the last one drops them, at a constant cost per acquisition.
   */
  private sweep(now: number): void {
    for (const [key, lease] of this.leases) if (lease.expiresAt <= now) this.leases.delete(key);
    this.sweepAbove = Math.max(SWEEP_FLOOR, 2 * this.leases.size);
  }

  /** The unexpired lease on a key; an expired one is dropped on sight. */
  private live(key: string, now: number): Lease | undefined {
    const lease = this.leases.get(key);
    if (lease && lease.expiresAt <= now) {
      this.leases.delete(key);
      return undefined;
    }
    return lease;
  }

  private notify(key: string): void {
    const set = this.watchers.get(key);
    if (set) for (const onRelease of [...set]) onRelease();
  }
}

const ownTryAcquire = MemoryLockBackend.prototype.tryAcquire;
const ownRelease = MemoryLockBackend.prototype.release;
