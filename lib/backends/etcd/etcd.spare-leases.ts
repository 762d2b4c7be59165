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
 *   costs etcd a lease until its ttl runs out, nothing else. close() revokes them (and waits for a
 *   grant still out, to revoke that too).
 * - A released lock's lease comes back as a spare (giveBack()) when its keys were deleted and
 *   nothing else can be on it (EtcdConnection.reusable): then a lock costs etcd its two writes, the
 *   transaction that puts its keys and the one that deletes them, and no grant or revoke. At most
 *   two are kept per ttl: a lock taken while another of its ttl is held finds one, and a process
 *   that locks in a loop grants none after its first.
 */
/** Spares kept per ttl at most. */
const MAX_KEPT = 2;

export class EtcdSpareLeases {
  /** Per ttl, the one with most life left last. */
  private readonly spares = new Map<number, HoldLease[]>();
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
   * nobody else's. A spare with less left is revoked (it holds nothing).
   */
  take(seconds: number): HoldLease | undefined {
    const kept = this.spares.get(seconds) ?? [];
    const now = performance.now();
    for (let spare = kept.pop(); spare; spare = kept.pop()) {
      if (kept.length === 0) this.spares.delete(seconds);
      if (spare.aliveSince + spare.ttl * 500 >= now) return spare;
      // Too old to count on: it goes now rather than when it runs out (etcd deletes it then just the same).
      this.revoke(spare.id).catch(() => undefined);
    }
    return undefined;
  }

  /**
   * A released lock's lease, which holds nothing any more: kept as a spare of its ttl, unless two
   * are kept already (then revoked). It lives on from its last restart, as it did for its lock.
   */
  giveBack(lease: HoldLease): void {
    const kept = this.spares.get(lease.seconds) ?? [];
    if (this.closed || kept.length >= MAX_KEPT) {
      this.revoke(lease.id).catch(() => undefined);
      return;
    }
    kept.push({ id: lease.id, seconds: lease.seconds, ttl: lease.ttl, aliveSince: lease.aliveSince });
    kept.sort((a, b) => a.aliveSince + a.ttl * 1000 - (b.aliveSince + b.ttl * 1000));
    this.spares.set(lease.seconds, kept);
  }

  /** Revokes the spares, and those of grants still out once they are answered. */
  async close(): Promise<void> {
    this.closed = true;
    const spares = [...this.spares.values()].flat();
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
        else this.giveBack(spare);
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
