import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { Cluster, Redis } from 'ioredis';
import type { RedisConnection } from './redis.connection.js';
import { lockKeyLayouts } from './redis.keys.js';
import { RedisReleaseSubscriber } from './redis-release.subscriber.js';

/**
 * An owner of this process that is trying for a lock or waiting in its line in Redis: what is
 * needed to accept a lock the release script hands it (see RELEASE).
 */
export interface LineEntry {
  /** The keys it wants, joined by newlines. */
  keys: string;
  /** When its last failed attempt was sent (performance.now()), and the key's last token then. */
  sentAt?: number;
  lastToken?: number;
  /** A hand-over announced before the answer to the attempt in flight came back. */
  early?: Handover;
  /** A hand-over it may take without asking Redis again. */
  granted?: { fencingToken: number; leaseMs: number; deadline: number };
  /** A wake-up that came before the waiter listened for one. */
  woken?: boolean;
}

interface Handover {
  fencingToken: number;
  leaseMs: number;
  /** When the release that handed it over was sent, if this process sent it: the lease runs from no earlier. */
  notBefore?: number;
}

/** A release of this process going out while a waiter of this process waits for its keys. */
export interface HandoffStart {
  /** Whether that waiter may go before waiters of other processes (see RELEASE). */
  readonly mayPass: boolean;
  /** The release's answer: until it comes, that waiter asks it rather than Redis. */
  sent(reply: Promise<unknown>): void;
}

/**
 * This process's side of the lines in Redis: which of its owners may stand in one, the hand-overs
 * the release script announced to them, and the wake-ups, heard over one shared subscriber
 * connection per backend.
 */
export class RedisWaiterLine {
  /** Names this backend's wake-up channel: releases tell the first waiter in line through it. */
  readonly id = randomBytes(9).toString('base64url');
  /** Owners of this process that are trying for a lock and may be in its line in Redis. */
  private readonly entries = new Map<string, LineEntry>();
  /** How to wake each waiting owner of this process. */
  private readonly wakers = new Map<string, () => void>();
  private readonly subscriber: RedisReleaseSubscriber;
  /** Outside Cluster one channel serves every key, subscribed at the first wait until close. */
  private processChannel: Promise<unknown> | undefined;
  /** That channel is confirmed: what `watching()` reports. */
  private listening = false;
  /**
   * Holders of this process that did not take a free key of the usual case (a hand-over, or a key
   * with a line): others are likely waiting, so their release is sent whole at once, and outside
   * Cluster behind a PING (see RedisLockBackend.release).
   */
  private readonly contended = new Set<string>();
  /** Releases of this process in flight, by key, while a waiter of this process waits for it. */
  private readonly handoffs = new Map<string, Promise<unknown>>();
  /**
   * Keys whose last releases here handed the lock to a waiter of this process ahead of waiters of
   * other processes: how many times in a row. Only keys in such a run are kept.
   */
  private readonly passes = new Map<string, number>();

  constructor(
    private readonly connection: RedisConnection,
    commandTimeout: number,
    /** How many times in a row a waiter of this process may go before waiters of others. */
    private readonly localHandoffs = 0,
  ) {
    this.subscriber = new RedisReleaseSubscriber(
      () => this.connection.createSubscriber((subscriber) => this.recoverLostReleases(subscriber)),
      connection.cluster,
      commandTimeout,
    );
  }

  /**
   * A lock the release script handed to `owner` since its last failed attempt, if enough of the
   * lease is left to take it without asking Redis again.
   */
  takeHandover(owner: string): { fencingToken: number; validityMs: number } | undefined {
    const entry = this.entries.get(owner);
    const granted = entry?.granted;
    if (!granted) return undefined;
    entry.granted = undefined;
    // Counted from a moment before Redis handed it over, so it never outlasts the real lease.
    // With too little of it left, asking Redis again (it finds the lock ours) renews it.
    const validityMs = granted.deadline - performance.now();
    if (validityMs <= granted.leaseMs / 2) return undefined;
    this.entries.delete(owner);
    this.holdsContended(owner);
    return { fencingToken: granted.fencingToken, validityMs };
  }

  /** An attempt is going out: an owner that will wait may stand in the line from it on. */
  attemptStarting(owner: string, keys: readonly string[], willWait: boolean): LineEntry | undefined {
    let entry = this.entries.get(owner);
    if (willWait && !entry) this.entries.set(owner, (entry = { keys: keys.join('\n') }));
    return entry;
  }

  /** The attempt won; `hadLine`: others were waiting for a key (see `releasing`). */
  acquired(owner: string, hadLine: boolean): void {
    this.entries.delete(owner);
    if (hadLine) this.holdsContended(owner);
  }

  /**
   * The attempt sent at `sentAt` failed, and saw `lastToken` as the key's last token (single key
   * only): a hand-over with a greater token came after it.
   */
  attemptFailed(entry: LineEntry | undefined, keys: readonly string[], sentAt: number, lastToken: number | undefined): void {
    if (!entry || keys.length !== 1) return;
    entry.sentAt = sentAt;
    entry.lastToken = lastToken;
    const early = entry.early;
    entry.early = undefined;
    if (early) this.handOver(entry, early);
  }

  /**
   * A release of `keys` is about to go out. If a waiter of this process waits for them (a single
   * key), the release may hand it the lock (see RELEASE): that waiter's next attempt waits for the
   * release's answer instead of asking Redis behind it.
   */
  handoffStarting(keys: readonly string[]): HandoffStart | undefined {
    if (keys.length !== 1 || this.entries.size === 0 || !this.waitsHere(keys)) return undefined;
    const [key] = keys;
    return {
      mayPass: (this.passes.get(key) ?? 0) < this.localHandoffs,
      sent: (reply) => {
        const settled = reply.then(ignore, ignore);
        this.handoffs.set(key, settled);
        void settled.then(() => {
          if (this.handoffs.get(key) === settled) this.handoffs.delete(key);
        });
      },
    };
  }

  /** The answer to a release of this process that may hand `owner` its lock, if one is out. */
  handoffInFlight(owner: string): Promise<unknown> | undefined {
    if (this.handoffs.size === 0) return undefined;
    const keys = this.entries.get(owner)?.keys;
    return keys === undefined ? undefined : this.handoffs.get(keys);
  }

  /**
   * A release of this process handed the lock on `keys` to `owner`, one of its waiters, in Redis:
   * taken without a message, as one that came through pub/sub (see onMessage). `passed`: it went
   * before waiters of other processes.
   */
  handedHere(keys: readonly string[], owner: string, handover: Handover, passed: boolean): void {
    const [key] = keys;
    if (passed) {
      // Bounded for keys nobody releases again here (a lease lost with its process's waiters gone).
      if (this.passes.size >= 10_000) this.passes.clear();
      this.passes.set(key, (this.passes.get(key) ?? 0) + 1);
    } else this.passes.delete(key);
    // A waiter that gave up meanwhile has no entry: its release, sent after this one, frees the lock.
    this.turnOf(owner, handover);
  }

  /**
   * The owner releases, or gives up: it no longer waits. How its release goes out: in the usual
   * case's short form (see RELEASE) unless something here says that others may wait for its keys:
   * several keys, the owner itself waited (it gives up, and leaves a line), it took its key with
   * others in line (the release is then sent behind a PING, outside Cluster; see
   * RedisLockBackend.release), or a waiter of this process wants the key.
   */
  releasing(owner: string, keys: readonly string[]): { usual: boolean; behindPing: boolean } {
    const waited = this.entries.delete(owner);
    const contended = this.contended.delete(owner);
    const waitsHere = this.entries.size > 0 && this.waitsHere(keys);
    return {
      usual: keys.length === 1 && !waited && !contended && !waitsHere,
      behindPing: contended && !waitsHere && !this.connection.cluster,
    };
  }

  /** Calls `onRelease` when a release names `owner`; resolves once that message cannot be missed. */
  async watch(keys: readonly string[], onRelease: () => void, owner: string): Promise<() => void> {
    this.wakers.set(owner, onRelease);
    let unsubscribe: (() => void) | undefined;
    const stop = () => {
      unsubscribe?.();
      if (this.wakers.get(owner) === onRelease) this.wakers.delete(owner);
    };
    try {
      unsubscribe = await this.subscribe(keys, owner);
    } catch (error) {
      stop();
      throw error;
    }
    const entry = this.entries.get(owner);
    if (entry?.woken) {
      entry.woken = false;
      onRelease();
    }
    return stop;
  }

  /**
   * Outside Cluster, once this process listens on its channel: a release that names one of its
   * waiters reaches it from then on, and is kept (see onMessage) until that waiter watches.
   */
  watching(): boolean {
    return this.listening && !this.connection.closed;
  }

  close(): Promise<void> {
    return this.subscriber.close();
  }

  /** Makes sure this process hears the releases that name `owner`; returns how to stop, if needed. */
  private async subscribe(keys: readonly string[], owner: string): Promise<(() => void) | undefined> {
    const client = await this.connection.connected('watch', keys);
    if (!this.connection.cluster) {
      this.processChannel ??= this.subscriber.watch([this.processChannelName()], this.onMessage).then(
        () => (this.listening = true),
        (error: unknown) => {
          this.processChannel = undefined;
          throw error;
        },
      );
      await this.processChannel;
      return undefined;
    }
    // Sharded channels live in a slot, so there is one per lock (its line key as Redis sees it,
    // client key prefix included), shared by this process's waiters on it.
    const prefix = client.options.keyPrefix ?? '';
    return this.subscriber.watch(
      lockKeyLayouts(keys, prefix, true).map((layout) => `${prefix}${layout.line}:${this.id}`),
      (message) => {
        if (message === owner || message.startsWith(`${owner} `)) this.onMessage(message);
      },
    );
  }

  private processChannelName(): string {
    return `nest-distributed-lock:${this.id}`;
  }

  /** A release told one of our waiters that it is its turn, maybe handing it the lock. */
  private readonly onMessage = (message: string): void => {
    const [owner, token, lease] = message.split(' ');
    this.turnOf(owner, lease === undefined ? undefined : { fencingToken: Number(token), leaseMs: Number(lease) });
  };

  /** It is the turn of `owner`, maybe with the lock handed over: it is woken, or will be when it watches. */
  private turnOf(owner: string, handover: Handover | undefined): void {
    const entry = this.entries.get(owner);
    if (!entry) return;
    if (handover) this.handOver(entry, handover);
    const wake = this.wakers.get(owner);
    if (wake) wake();
    else entry.woken = true;
  }

  /**
   * Takes a hand-over for a waiter if it came after the waiter's last failed attempt (its token is
   * greater than the one that attempt saw). Then the lock was handed over after that attempt was
   * sent, so the lease counted from the send time is certainly within the real one.
   */
  private handOver(entry: LineEntry, handover: Handover): void {
    if (entry.sentAt === undefined || entry.lastToken === undefined) {
      entry.early = handover;
    } else if (handover.fencingToken > entry.lastToken) {
      const from = Math.max(entry.sentAt, handover.notBefore ?? 0);
      entry.granted = { fencingToken: handover.fencingToken, leaseMs: handover.leaseMs, deadline: from + handover.leaseMs };
    }
  }

  private waitsHere(keys: readonly string[]): boolean {
    const id = keys.join('\n');
    for (const entry of this.entries.values()) if (entry.keys === id) return true;
    return false;
  }

  private holdsContended(owner: string): void {
    // Bounded for callers of the backend that never release (LockService always does).
    if (this.contended.size >= 10_000) this.contended.clear();
    this.contended.add(owner);
  }

  private recoverLostReleases(subscriber: Redis | Cluster): void {
    if (subscriber.isCluster) this.recoverAfterSlotMove(subscriber as Cluster);
    else this.recoverAfterReconnect(subscriber as Redis);
  }

  /**
   * Releases published while the subscriber reconnects are lost. Until the process channel is
   * confirmed again, `watching()` says no, so a new waiter tries again after it subscribes; once it
   * is, every waiter of this process tries again, as a release meant for it may have been lost.
   */
  private recoverAfterReconnect(subscriber: Redis): void {
    let lost = false;
    subscriber.on('close', () => {
      lost ||= this.listening;
      this.listening = false;
    });
    subscriber.on('ready', () => {
      if (!lost || this.connection.closed) return;
      // ioredis subscribes again by itself; ours goes out after it, so its answer covers both.
      subscriber.subscribe(this.processChannelName()).then(
        () => {
          lost = false;
          this.listening = true;
          this.wakeAllWaiters();
        },
        () => undefined, // still lost: the next reconnection tries again
      );
    });
  }

  /**
   * On Cluster a slot that moves to another master takes its sharded subscriptions along: the old
   * master drops them (an SUNSUBSCRIBE nobody asked for, which ioredis reports as a node error),
   * and ioredis subscribes them again on the new master only once it reloads its slot map. So a
   * node error reloads the map; when ioredis reports its subscriptions ready again, every waiter
   * of this process tries again, as a release meant for it may have been lost meanwhile.
   */
  private recoverAfterSlotMove(subscriber: Cluster): void {
    subscriber.on('nodeError', () => {
      if (!this.connection.closed) subscriber.refreshSlotsCache();
    });
    subscriber.on('subscribersReady', () => {
      if (!this.connection.closed) this.wakeAllWaiters();
    });
  }

  /** Every waiter of this process tries again: a release meant for one of them may be lost. */
  private wakeAllWaiters(): void {
    for (const wake of [...this.wakers.values()]) wake();
  }
}

function ignore(): undefined {
  return undefined;
}
