import { performance } from 'node:perf_hooks';
import type { PostgresConnection } from './postgres.connection.js';
import { PostgresListener } from './postgres.listener.js';

/** An owner of this process that is trying for a lock and may be in a line in PostgreSQL. */
export interface LineEntry {
  /** A release named it before it listened: it tries again once it watches. */
  woken: boolean;
  /** When its last failed attempt was sent (performance.now()), and the last token then. */
  sentAt?: number;
  lastToken?: number;
  /** A hand-over announced before the answer to the attempt in flight came back. */
  early?: Handover;
  /** A hand-over it may take without asking PostgreSQL again. */
  granted?: Handover & { deadline: number };
}

interface Handover {
  fencingToken: number;
  leaseMs: number;
}

/**
 * This process's side of the lines of waiters in PostgreSQL: which of its owners may stand in
 * one, the locks releases handed them, and their wake-ups, heard on the backend's LISTEN
 * connection. A release names the owner whose turn it is; only that owner is woken, and a wake-up
 * that comes before it listens is kept.
 */
export class PostgresWaiterLine {
  private readonly listener: PostgresListener;
  /** Owners of this process that are trying for a lock and may be in a line in PostgreSQL. */
  private readonly entries = new Map<string, LineEntry>();
  /** How to wake each listening owner of this process. */
  private readonly wakers = new Map<string, () => void>();

  constructor(connection: PostgresConnection, timeoutMs: number, listen: boolean) {
    this.listener = new PostgresListener(
      connection,
      timeoutMs,
      !listen,
      this.onMessage,
      () => this.wakeAllWaiters(),
      () => this.wakers.size > 0,
    );
  }

  /** The channel that releases NOTIFY to reach this process's waiters. */
  get channel(): string {
    return this.listener.channel;
  }

  /**
   * An attempt is going out: an owner that will wait may stand in a line from it on. While this
   * process does not listen yet, a release that names it would be lost: it counts as woken, so it
   * tries again once it watches. (The service does so by itself only for the first waiter of its
   * queue; another one that a release names would sleep through its turn.)
   */
  attemptStarting(owner: string, willWait: boolean): LineEntry | undefined {
    if (!willWait) return this.entries.get(owner);
    let entry = this.entries.get(owner);
    if (!entry) this.entries.set(owner, (entry = { woken: false }));
    entry.woken ||= !this.listener.active;
    return entry;
  }

  /**
   * The attempt sent at `sentAt` failed, when `lastToken` was the last token handed out: a
   * hand-over with a greater token came after it. One with a smaller token came before it and is
   * no longer ours (the attempt would have found the lock its own).
   */
  attemptFailed(entry: LineEntry | undefined, sentAt: number, lastToken: number): void {
    if (!entry) return;
    entry.sentAt = sentAt;
    entry.lastToken = lastToken;
    if (entry.granted && entry.granted.fencingToken <= lastToken) entry.granted = undefined;
    const early = entry.early;
    entry.early = undefined;
    if (early) this.handOver(entry, early);
  }

  /**
   * A lock a release handed to `owner` since its last failed attempt, if enough of the lease is
   * left to take it without asking PostgreSQL again.
   */
  takeHandover(owner: string): { fencingToken: number; validityMs: number } | undefined {
    const entry = this.entries.get(owner);
    const granted = entry?.granted;
    if (!granted) return undefined;
    entry.granted = undefined;
    // Counted from a moment before PostgreSQL handed it over, so it never outlasts the real lease.
    // With too little of it left, asking again (the lock is found to be ours) renews it.
    const validityMs = granted.deadline - performance.now();
    if (validityMs <= granted.leaseMs / 2) return undefined;
    this.entries.delete(owner);
    return { fencingToken: granted.fencingToken, validityMs };
  }

  /** The owner won, released, or gave up: it no longer waits. */
  leave(owner: string): void {
    this.entries.delete(owner);
  }

  /** Calls `onRelease` when a release names `owner`; resolves once that message cannot be missed. */
  async watch(onRelease: () => void, owner: string): Promise<() => void> {
    let listening = true;
    try {
      await this.listener.listen();
    } catch (error) {
      // Polling (LISTEN delivers nothing, or is off): the caller polls. A connection that dropped
      // or went unanswered is made again in the background; once it is back, every waiter of this
      // process is woken to ask again (a release meanwhile was not heard), this one included.
      if (!this.listener.retrying) throw error;
      listening = false;
    }
    this.wakers.set(owner, onRelease);
    if (!listening) this.listener.retry();
    const entry = this.entries.get(owner);
    if (entry?.woken) {
      entry.woken = false;
      onRelease();
    }
    return () => {
      if (this.wakers.get(owner) === onRelease) this.wakers.delete(owner);
    };
  }

  /**
   * Once this process listens on its channel: a release that names one of its waiters reaches it
   * from then on, and is kept (see onMessage) until that waiter watches.
   */
  watching(): boolean {
    return this.listener.active;
  }

  close(): Promise<void> {
    this.wakers.clear();
    return this.listener.close();
  }

  /** A release told one of our waiters that it is its turn, maybe handing it the lock. */
  private readonly onMessage = (message: string): void => {
    const [owner, token, lease] = message.split(' ');
    const entry = this.entries.get(owner);
    if (entry && lease !== undefined) this.handOver(entry, { fencingToken: Number(token), leaseMs: Number(lease) });
    const wake = this.wakers.get(owner);
    if (wake) wake();
    else if (entry) entry.woken = true;
  };

  /**
   * Takes a hand-over for a waiter if it came after the waiter's last failed attempt (its token is
   * greater than the last one when that attempt ran). Then the lock was handed over after that
   * attempt was sent, so the lease counted from the send time is certainly within the real one.
   */
  private handOver(entry: LineEntry, handover: Handover): void {
    if (entry.sentAt === undefined || entry.lastToken === undefined) {
      entry.early = handover;
    } else if (handover.fencingToken > entry.lastToken) {
      entry.granted = { ...handover, deadline: entry.sentAt + handover.leaseMs };
    }
  }

  /**
   * Every waiter of this process tries again, those that listen now and those that will: a
   * release meant for one of them may be lost.
   */
  private wakeAllWaiters(): void {
    for (const entry of this.entries.values()) entry.woken = true;
    for (const wake of [...this.wakers.values()]) wake();
  }
}
