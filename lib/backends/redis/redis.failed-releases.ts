import type { Cluster, Redis } from 'ioredis';

/** Releases kept at most: a Redis down for long under heavy traffic must not grow this for good. */
const MAX_KEPT = 10_000;

/**
 * Releases that failed, sent again each time the client is ready after a reconnection, until Redis
 * answers them. A release that failed while Redis was unreachable (ioredis fails what it queued
 * after `maxRetriesPerRequest` reconnection attempts) would otherwise leave the lock held by nobody
 * until its ttl: a holder's release, or the release of a lost lease whose last extension Redis
 * applied but never answered (ioredis sends requests that were on the connection again when it is
 * back, whatever became of their callers). The 'ready' event comes after ioredis has sent those
 * again, so the release goes out behind them. A release is compare-and-delete by owner, and an
 * owner token is never used again once released: sending it twice, or after the lease ran out,
 * frees nothing of anyone else.
 */
export class RedisFailedReleases {
  /** Keys by owner. */
  private readonly pending = new Map<string, readonly string[]>();
  private client: Redis | Cluster | undefined;

  constructor(private readonly release: (keys: readonly string[], owner: string) => Promise<unknown>) {}

  add(client: Redis | Cluster, keys: readonly string[], owner: string): void {
    if (this.pending.size >= MAX_KEPT) this.pending.delete(this.pending.keys().next().value!);
    this.pending.set(owner, keys);
    if (this.client === client) return;
    this.client?.off('ready', this.sendAgain);
    this.client = client;
    client.on('ready', this.sendAgain);
  }

  /** The owner asks for a lock again (a caller of the backend that reuses an owner): its keys are its own again. */
  forget(owner: string): void {
    if (this.pending.size > 0) this.pending.delete(owner);
  }

  close(): void {
    this.pending.clear();
    this.client?.off('ready', this.sendAgain);
    this.client = undefined;
  }

  /** One that fails again is added again by the release itself. */
  private readonly sendAgain = (): void => {
    const pending = [...this.pending];
    this.pending.clear();
    for (const [owner, keys] of pending) this.release(keys, owner).catch(() => undefined);
  };
}
