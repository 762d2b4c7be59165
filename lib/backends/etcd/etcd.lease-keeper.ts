import { performance } from 'node:perf_hooks';
import type { EtcdConnection, Operation } from './etcd.connection.js';

/** A lease the keeper keeps alive for a waiter, and what to tell it. */
export interface KeptLease {
  /** The keepalive sent at `sentAt` (performance.now()) was answered: alive until at least then plus its ttl. */
  alive(sentAt: number): void;
  /** The lease is gone. */
  lost(): void;
}

/**
 * The leases this process keeps alive for its waiters, in one round every third of
 * `waiterTimeout`:
 *
 * - the waiter lease, which every place in line of this process sits on. A place must outlive
 *   its waiter's attempts (a waiter asks again only when woken, or after pollInterval) but not
 *   its process: a process that dies, stalls or loses etcd stops keeping it alive, and its places
 *   leave every line once it runs out.
 * - each waiter's own lease, granted by its first attempt: the lease it will hold the keys on.
 *   Kept alive while it waits, so that its turn takes one transaction, not a grant first.
 */
export class EtcdLeaseKeeper {
  /** The waiter lease new places go on, and until when it is certainly alive (performance.now()). */
  private current: { id: string; validUntil: number } | undefined;
  private granting: Promise<string> | undefined;
  /** Places per waiter lease: every one with a place on it is kept alive (a new one may have replaced it as current). */
  private readonly places = new Map<string, number>();
  /** Until when each waiter lease with places is certainly alive (performance.now()). */
  private readonly aliveUntil = new Map<string, number>();
  private readonly kept = new Map<string, KeptLease>();
  private timer: NodeJS.Timeout | undefined;
  /** A round is out: the next one is scheduled when it is done. */
  private running = false;
  private stopped = false;

  constructor(
    private readonly connection: EtcdConnection,
    private readonly seconds: number,
    /** A keepalive found a waiter lease gone: its places left their lines. */
    private readonly onWaiterLeaseLost: (lease: string) => void,
  ) {}

  /**
   * The waiter lease for a new place in line: the current one while it has at least half its
   * ttl certainly left, else a new one (the old one runs out by itself once it has no place).
   */
  waiterLease(what: Operation): Promise<string> {
    const current = this.current;
    if (current && current.validUntil - performance.now() > this.seconds * 500) return Promise.resolve(current.id);
    this.granting ??= (async () => {
      const sentAt = performance.now();
      const { id } = await this.connection.grant(this.seconds, what);
      this.current = { id, validUntil: sentAt + this.seconds * 1000 };
      this.aliveUntil.set(id, this.current.validUntil);
      return id;
    })().finally(() => (this.granting = undefined));
    return this.granting;
  }

  /** A place went onto waiter lease `lease`. */
  join(lease: string): void {
    this.places.set(lease, (this.places.get(lease) ?? 0) + 1);
    this.schedule();
  }

  /** A place on waiter lease `lease` left (its waiter won, gave up or lost it). */
  leave(lease: string): void {
    const count = (this.places.get(lease) ?? 0) - 1;
    if (count > 0) {
      this.places.set(lease, count);
      return;
    }
    this.places.delete(lease);
    if (this.current?.id !== lease) {
      this.aliveUntil.delete(lease);
      this.connection.revokeQuietly(lease, { op: 'clean-up', keys: [] });
    }
    this.idle();
  }

  /** Until when waiter lease `lease` is certainly alive (performance.now()): its grant or last keepalive answered, plus its ttl. */
  waiterLeaseAliveUntil(lease: string): number {
    return this.aliveUntil.get(lease) ?? 0;
  }

  /** New places go on another waiter lease than `lease`, which lives on while places are on it. */
  retire(lease: string): void {
    if (this.current?.id === lease) this.current = undefined;
    if (this.places.has(lease)) return;
    this.aliveUntil.delete(lease);
    this.connection.revokeQuietly(lease, { op: 'clean-up', keys: [] });
  }

  /** A request found waiter lease `lease` gone: new places go on a new one. */
  gone(lease: string): void {
    if (this.current?.id === lease) this.current = undefined;
    this.aliveUntil.delete(lease);
  }

  /** Keeps a waiter's own lease alive until release(). */
  keep(lease: string, kept: KeptLease): void {
    this.kept.set(lease, kept);
    this.schedule();
  }

  release(lease: string): void {
    this.kept.delete(lease);
    this.idle();
  }

  /** Stops keeping leases alive and revokes the waiter leases, so this process's places leave at once. */
  async close(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    const leases = new Set([...this.places.keys(), ...(this.current ? [this.current.id] : [])]);
    this.places.clear();
    this.aliveUntil.clear();
    this.kept.clear();
    this.current = undefined;
    await Promise.all([...leases].map((lease) => this.connection.revoke(lease, { op: 'clean-up', keys: [] }).catch(() => false)));
  }

  private schedule(): void {
    if (this.timer || this.running || this.stopped) return;
    this.timer = setTimeout(() => void this.round(), (this.seconds * 1000) / 3);
    this.timer.unref();
  }

  private idle(): void {
    if (this.places.size > 0 || this.kept.size > 0) return;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async round(): Promise<void> {
    this.timer = undefined;
    this.running = true;
    try {
      const waiterLeases = [...this.places.keys()].map((lease) => this.keepAlive(lease, () => this.waiterLeaseAlive(lease)));
      const own = [...this.kept].map(([lease, kept]) => this.keepAlive(lease, () => this.kept.get(lease) === kept && kept));
      await Promise.all([...waiterLeases, ...own]);
    } finally {
      this.running = false;
    }
    if (this.places.size > 0 || this.kept.size > 0) this.schedule();
  }

  /** One keepalive; `still` says, once answered, whom to tell (nobody: the lease was let go meanwhile). */
  private async keepAlive(lease: string, still: () => KeptLease | false | undefined): Promise<void> {
    const sentAt = performance.now();
    let alive: boolean;
    try {
      alive = await this.connection.keepAlive(lease, { op: 'keep alive', keys: [] });
    } catch {
      // Tried again at the next round; a lease that runs out meanwhile is found by the next attempt.
      return;
    }
    const whom = still();
    if (!whom) return;
    if (alive) whom.alive(sentAt);
    else whom.lost();
  }

  private waiterLeaseAlive(lease: string): KeptLease | undefined {
    if (!this.places.has(lease)) return undefined;
    return {
      alive: (sentAt) => {
        const until = sentAt + this.seconds * 1000;
        if (this.current?.id === lease) this.current.validUntil = until;
        if (this.places.has(lease)) this.aliveUntil.set(lease, Math.max(until, this.aliveUntil.get(lease) ?? 0));
      },
      lost: () => {
        this.gone(lease);
        this.places.delete(lease);
        this.idle();
        this.onWaiterLeaseLost(lease);
      },
    };
  }
}
