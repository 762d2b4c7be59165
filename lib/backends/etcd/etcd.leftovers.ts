import type { EtcdConnection } from './etcd.connection.js';
import type { EtcdLine } from './etcd.line.js';

/** Entries whose deletion failed: an owner's, and the lease a late request of its could still land on. */
interface Leftover {
  keys: readonly string[];
  owner: string;
  /** Revoked before the entries are deleted: a request of the owner may still land until it goes. */
  hold?: string;
}

/**
 * Deletes again, until etcd answers, the entries of waiters whose release failed. A waiter's
 * entries sit on the process's waiter lease, which stays alive for as long as any other caller of
 * this process waits: left there, they would stand in line, first at some point, for nobody, and
 * every other process would wait behind them. (A holder's keys need no such care: its own lease
 * runs out with the ttl.) Tried again every third of the waiter lease's time, as often as a dead
 * process would hold a line up.
 */
export class EtcdLeftovers {
  private readonly leftovers = new Map<string, Leftover>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly connection: EtcdConnection,
    private readonly line: EtcdLine,
    private readonly periodMs: number,
  ) {}

  add(leftover: Leftover): void {
    this.leftovers.set(leftover.owner, leftover);
    this.schedule();
  }

  /** The owner asks again (its own later request): its entries are its place, not leftovers. */
  forget(owner: string): void {
    this.leftovers.delete(owner);
  }

  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.leftovers.clear();
  }

  private schedule(): void {
    if (this.timer || this.connection.closed) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      for (const leftover of [...this.leftovers.values()]) {
        this.delete(leftover).then(
          () => this.leftovers.get(leftover.owner) === leftover && this.leftovers.delete(leftover.owner),
          () => this.schedule(),
        );
      }
    }, this.periodMs).unref();
  }

  private async delete({ keys, owner, hold }: Leftover): Promise<void> {
    const what = { op: 'clean-up', keys };
    if (hold !== undefined) await this.connection.revoke(hold, what);
    // Its waiting entries only: a lock its owner took since (asking again) is that owner's.
    await Promise.all(keys.map((key) => this.connection.txn(this.line.deleteWaiting(key, owner), what)));
  }
}
