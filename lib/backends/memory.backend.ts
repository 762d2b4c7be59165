import { performance } from 'node:perf_hooks';
import type {
  AcquireResult,
  ExtendResult,
  ImmediateLockSteps,
  LockBackend,
  LockHolderIdentity,
  LockListOptions,
  LockListPage,
  LockState,
  TryAcquireOptions,
} from './lock-backend.interface.js';
import { KeyHolders } from './memory.key-holders.js';
import { listPage } from './memory.listing.js';

const SWEEP_FLOOR = 1_024;

/**
 * Leases in this process's memory. Real semantics (TTL expiry, owner-only release, fencing,
 * release notifications, shared holders and semaphores, a fair line of waiters) so it can stand
 * in for Redis in unit tests, but it excludes nothing across processes: fit for tests and
 * single-instance apps only.
 */
export class MemoryLockBackend implements LockBackend {
  readonly name = 'memory';
  readonly fencing = true;
  readonly sharedHolders = true;
  readonly storesIdentity = true;

  private readonly states = new Map<string, KeyHolders>();
  /** Per key, who listens for it to admit them: each callback with the owner it waits as (if it said). */
  private readonly watchers = new Map<string, Map<() => void, string | undefined>>();
  /** Owners let in while nobody listened for them: woken as soon as they watch (see `watching`). */
  private readonly pendingWakes = new Set<string>();
  /**
   * One counter for all keys is still strictly increasing per key, and costs no memory per key.
   * Never below the clock in µs (see nextToken): the process that comes after a restart starts
   * above every token this one gave.
   */
  private lastToken = 0;
  /** Size of `keys` past which keys nobody holds or waits for any more are dropped (see sweep). */
  private sweepAbove = SWEEP_FLOOR;
  /** tryAcquire and release without their promises (see `immediate`). */
  private readonly steps: ImmediateLockSteps = {
    // Exclusive only: the steps carry no limits (the service sends shared locks through tryAcquire).
    // A caller here has not said it waits, so it stays out of the line; the service's next
    // attempt, through tryAcquire, puts it there if it does wait.
    tryAcquire: (keys, owner, ttlMs, now, holder) => this.acquireAt(keys, owner, ttlMs, now, undefined, false, holder),
    release: (keys, owner) => this.free(keys, owner),
  };

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    return this.acquireAt(keys, owner, ttlMs, performance.now(), options?.limits, options?.willWait ?? true, options?.holder);
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const now = performance.now();
    const held = keys.map((key) => this.live(key, now)?.holder(owner));
    if (!held.every((holder) => holder !== undefined)) return { extended: false };
    for (const holder of held) holder!.expiresAt = now + ttlMs;
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

  /**
   * The wake-up of an owner let in before it listened is kept until it does (pendingWakes), so the
   * service needs no second attempt after subscribing.
   */
  watching(): boolean {
    return true;
  }

  /** `now` may be taken before the call: the lease then ends no later than the caller counts it. */
  private acquireAt(
    keys: readonly string[],
    owner: string,
    ttlMs: number,
    now: number,
    limits: readonly number[] | undefined,
    willWait: boolean,
    holder: LockHolderIdentity | undefined,
  ): AcquireResult {
    const states = keys.map((key) => this.live(key, now) ?? new KeyHolders());
    let retryAfterMs: number | undefined;
    let admitted = true;
    /** The first key (in the caller's order: the service's is sorted) that does not admit it now. */
    let blocked = -1;
    for (const [i, state] of states.entries()) {
      const limit = limits?.[i] ?? 1;
      const theirs = state.mismatch(limit);
      // Waiting cannot heal it: no place in the line.
      if (theirs !== undefined) return { acquired: false, limitMismatch: { key: keys[i], limit: theirs } };
      // A second hold by the same owner (an attempt applied twice) is refused, as a held key is.
      if (state.holder(owner) === undefined && state.admits(owner, limit)) continue;
      admitted = false;
      if (blocked < 0) blocked = i;
      const after = state.retryAfter(limit, now);
      if (after !== undefined) retryAfterMs = Math.max(retryAfterMs ?? 0, after);
    }
    if (!admitted) {
      if (willWait) {
        // A place in line up to the first key that keeps it out, none after it: a place in the line
        // of a later key would keep that key from a holder of an earlier one that takes it next
        // (sorted order), while this caller waits for the earlier one: both would wait for good.
        for (const [i, state] of states.entries()) {
          if (state.holder(owner)) continue;
          if (i <= blocked) {
            state.join(owner, limits?.[i] ?? 1, now + ttlMs, holder, now);
            this.states.set(keys[i], state);
          } else if (state.remove(owner).changed) {
            if (state.empty) this.states.delete(keys[i]);
            this.notify(keys[i]);
          }
        }
      }
      return { acquired: false, retryAfterMs: retryAfterMs === undefined ? undefined : Math.ceil(retryAfterMs) };
    }
    const fencingToken = this.nextToken();
    for (const [i, state] of states.entries()) {
      state.remove(owner);
      state.holders.push({ owner, expiresAt: now + ttlMs, fencingToken, limit: limits?.[i] ?? 1, holder, since: now });
      this.states.set(keys[i], state);
    }
    this.pendingWakes.delete(owner);
    if (this.states.size > this.sweepAbove) this.sweep(now);
    return { acquired: true, fencingToken };
  }

  /**
   * One more than the last token, but never below the wall clock in microseconds (as the Redis
   * backend does with its server's clock). The counter alone would start again at 1 in the next
   * process, and storage that checks tokens would refuse every write of it. Tokens given so far
   * are at most the clock when they were given, plus one per acquisition taken faster than one
   * per µs, so the next process's first token is above them unless the clock was set back (or the
   * process ran ahead of it by more than the restart took). Near 1.8e15: exact in a JavaScript
   * number until the year 2255. One counter for every kind of holder: a writer's token is above
   * every earlier reader's, and a reader's above every earlier writer's.
   */
  private nextToken(): number {
    const token = Math.max(this.lastToken + 1, Date.now() * 1_000);
    this.lastToken = token;
    return token;
  }

  /** Off the holders and out of the line of each key; true if it held any of them. */
  private free(keys: readonly string[], owner: string): boolean {
    let released = false;
    this.pendingWakes.delete(owner);
    for (const key of keys) {
      const state = this.states.get(key);
      if (!state) continue;
      const { held, changed } = state.remove(owner);
      released ||= held;
      if (state.empty) this.states.delete(key);
      if (changed) this.notify(key);
    }
    return released;
  }

  async inspect(key: string): Promise<LockState | undefined> {
    const now = performance.now();
    const state = this.live(key, now);
    if (!state?.holders.length) return undefined;
    const holders = state.holders;
    const ttl = (expiresAt: number) => Math.max(0, Math.ceil(expiresAt - now));
    // performance.now() readings as wall-clock times: this process's clock is the store's.
    const epoch = (at: number) => Math.round(performance.timeOrigin + at);
    const limit = holders[0].limit;
    return {
      key,
      owner: holders[0].owner,
      ttlMs: Math.max(...holders.map((h) => ttl(h.expiresAt))),
      fencingToken: Math.max(...holders.map((h) => h.fencingToken)),
      ...(limit !== 1 && { limit }),
      holders: holders.map((h) => ({
        owner: h.owner,
        ttlMs: ttl(h.expiresAt),
        fencingToken: h.fencingToken,
        acquiredAt: epoch(h.since),
        ...h.holder,
      })),
      waiters: state.waiters.map((w) => ({
        owner: w.owner,
        waitingSince: epoch(w.since),
        ...(w.limit !== 1 && { limit: w.limit }),
        ...w.holder,
      })),
    };
  }

  /** Keys in sorted order after the cursor: one pass over the keys in memory per page (see listPage). Changes nothing. */
  async list(options: LockListOptions): Promise<LockListPage> {
    const now = performance.now();
    return listPage(this.states, options, (state) => state.holders.some((h) => h.expiresAt > now));
  }

  /**
   * `onRelease` runs when one of `keys` may admit `owner` now: when it waits in a key's line,
   * only once it is among those that fit (a release wakes exactly the callers that can enter);
   * otherwise at every release of the key.
   */
  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    for (const key of keys) {
      let map = this.watchers.get(key);
      if (!map) this.watchers.set(key, (map = new Map()));
      map.set(onRelease, owner);
    }
    if (owner !== undefined && this.pendingWakes.delete(owner)) onRelease();
    return () => {
      for (const key of keys) {
        const map = this.watchers.get(key);
        if (map?.delete(onRelease) && map.size === 0) this.watchers.delete(key);
      }
    };
  }

  /** @internal How many keys are held or waited for (live or not yet seen expired) and how many are watched. */
  get footprint(): { keys: number; watchedKeys: number } {
    return { keys: this.states.size, watchedKeys: this.watchers.size };
  }

  async close(): Promise<void> {
    this.watchers.clear();
    this.states.clear();
    this.pendingWakes.clear();
  }

  /**
   * A lease that runs out instead of being released (kept for minHold, or its holder stopped)
   * stays until its key is used again: over many keys that would grow without end. A sweep each
   * time the map doubles since the last one drops them, at a constant cost per acquisition.
   */
  private sweep(now: number): void {
    for (const [key, state] of this.states) {
      for (const owner of state.prune(now, this.listening(key))) this.pendingWakes.delete(owner);
      if (state.empty) this.states.delete(key);
    }
    this.sweepAbove = Math.max(SWEEP_FLOOR, 2 * this.states.size);
  }

  /**
   * The key's holders and line without those whose time ran out. Dropping one may let a waiter
   * in: it is woken now, not at its next poll.
   */
  private live(key: string, now: number): KeyHolders | undefined {
    const state = this.states.get(key);
    if (!state) return undefined;
    const dropped = state.prune(now, this.listening(key));
    if (dropped.length === 0) return state;
    for (const owner of dropped) this.pendingWakes.delete(owner);
    if (state.empty) this.states.delete(key);
    this.notify(key);
    return state.empty ? undefined : state;
  }

  /** Whether an owner listens for `key` to admit it (watch with its owner): a waiter that has not gone. */
  private listening(key: string): (owner: string) => boolean {
    const map = this.watchers.get(key);
    if (!map) return () => false;
    return (owner) => [...map.values()].includes(owner);
  }

  /** Wakes the waiters of `key` that fit now, and every watcher not waiting in its line. */
  private notify(key: string): void {
    const state = this.states.get(key);
    const admitted = new Set(state?.admissible());
    const map = this.watchers.get(key);
    if (map) {
      for (const [onRelease, owner] of [...map]) {
        if (owner !== undefined && state?.inLine(owner) && !admitted.has(owner)) continue;
        if (owner !== undefined) admitted.delete(owner);
        onRelease();
      }
    }
    for (const owner of admitted) this.pendingWakes.add(owner);
  }
}

const ownTryAcquire = MemoryLockBackend.prototype.tryAcquire;
const ownRelease = MemoryLockBackend.prototype.release;
