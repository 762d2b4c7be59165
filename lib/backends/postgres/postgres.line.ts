import type { PostgresConnection } from './postgres.connection.js';
import { PostgresListener } from './postgres.listener.js';

/**
 * This process's side of the lines of waiters in PostgreSQL: which of its owners may stand in
 * one, and their wake-ups, heard on the backend's LISTEN connection. A release names the owner
 * whose turn it is; only that owner is woken, and a wake-up that comes before it listens is kept.
 */
export class PostgresWaiterLine {
  private readonly listener: PostgresListener;
  /**
   * Owners of this process that are trying for a lock and may be in a line in PostgreSQL; true
   * once a release named one that was not listening yet.
   */
  private readonly entries = new Map<string, boolean>();
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
  attemptStarting(owner: string, willWait: boolean): void {
    if (willWait) this.entries.set(owner, this.entries.get(owner) === true || !this.listener.active);
  }

  /** The owner won, released, or gave up: it no longer waits. */
  leave(owner: string): void {
    this.entries.delete(owner);
  }

  /** Calls `onRelease` when a release names `owner`; resolves once that message cannot be missed. */
  async watch(onRelease: () => void, owner: string): Promise<() => void> {
    await this.listener.listen();
    this.wakers.set(owner, onRelease);
    if (this.entries.get(owner) === true) {
      this.entries.set(owner, false);
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

  /** A release told one of our waiters that it is its turn. */
  private readonly onMessage = (owner: string): void => {
    const wake = this.wakers.get(owner);
    if (wake) wake();
    else if (this.entries.has(owner)) this.entries.set(owner, true);
  };

  /**
   * Every waiter of this process tries again, those that listen now and those that will: a
   * release meant for one of them may be lost.
   */
  private wakeAllWaiters(): void {
    for (const owner of this.entries.keys()) this.entries.set(owner, true);
    for (const wake of [...this.wakers.values()]) wake();
  }
}
