import { performance } from 'node:perf_hooks';
import type { HoldLease } from './etcd.places.js';

/**
 * One lease granted ahead of time per ttl (whole seconds, as etcd counts them), so that an
 * acquisition's first attempt need not wait for a grant: it takes the spare at once, and its caller
 * waits for one transaction. A first attempt asks for the next one (replenish()) once its
 * transaction is on its way, granted in the background, when its ttl is in demand: it took the
 * spare, or came within half a ttl of the last attempt of that ttl (a spare would still have been
 * young enough to take). A process that locks less often grants none: each of its spares would run
 * out unused, one more write per lock for nothing.
 *
 * - A spare is handed out by take(), which forgets it in the same step: it has one owner, and from
 *   then on it is that owner's lease like any other (its anchor, its keys, its revoke).
 * - Its deadline is counted from its grant (`aliveSince`), as every lease's is: take() hands out
 *   only a spare with at least half its ttl certainly left (should it run out all the same under
 *   the transaction that takes it, etcd refuses that transaction, and the attempt starts again on
 *   a lease of its own), and the caller counts what is left, or restarts it with a keepalive sent
 *   beside its transaction.
 * - A spare carries no key until taken: a grant whose answer is lost, or a spare nobody takes,
 *   costs etcd a lease until its ttl runs out, nothing else. At most one is kept per ttl, and
 *   close() revokes it (and waits for a grant still out, to revoke that too).
 */
export class EtcdSpareLeases {
  private readonly spares = new Map<number, HoldLease>();
  private readonly granting = new Map<number, Promise<void>>();
  /** When the last first attempt of each ttl asked (performance.now()). */
  private readonly asked = new Map<number, number>();
  private closed = false;

  constructor(
    private readonly grant: (seconds: number) => Promise<HoldLease>,
    private readonly revoke: (lease: string) => Promise<unknown>,
  ) {}

  /**
   * The spare for `seconds`, if it has at least half its ttl certainly left, and from now on
   * nobody else's. A spare with less left is dropped (it runs out by itself, holding nothing).
   */
  take(seconds: number): HoldLease | undefined {
    const spare = this.spares.get(seconds);
    this.spares.delete(seconds);
    if (spare === undefined || spare.aliveSince + spare.ttl * 500 < performance.now()) return undefined;
    return spare;
  }

  /** Revokes the spares, and those of grants still out once they are answered. */
  async close(): Promise<void> {
    this.closed = true;
    const spares = [...this.spares.values()];
    this.spares.clear();
    await Promise.all([...spares.map((spare) => this.revoke(spare.id).catch(() => undefined)), ...this.granting.values()]);
  }

  /**
   * A first attempt of `seconds` is on its way (`took`: on the spare): grants the next spare in the
   * background if that ttl is in demand, unless one is kept or being granted.
   */
  replenish(seconds: number, took: boolean): void {
    const now = performance.now();
    const last = this.asked.get(seconds);
    // Bounded for a process that locks with ever new ttls: it forgets them all at once.
    if (this.asked.size >= 1_000) this.asked.clear();
    this.asked.set(seconds, now);
    if (!took && (last === undefined || now - last > seconds * 500)) return;
    if (this.closed || this.granting.has(seconds) || this.spares.has(seconds)) return;
    const granting = this.grant(seconds).then(
      async (spare) => {
        if (this.closed) await this.revoke(spare.id).catch(() => undefined);
        else this.spares.set(seconds, spare);
      },
      // Unanswered, it may have been granted: that lease holds nothing, and runs out. The next
      // acquisition of this ttl grants its own lease, and asks for a spare again.
      () => undefined,
    );
    this.granting.set(
      seconds,
      granting.finally(() => this.granting.delete(seconds)),
    );
  }
}
