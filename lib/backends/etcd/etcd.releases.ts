import { InvalidLockKeyError, LockBackendError } from '../../lock.errors.js';
import { FailedReleases } from '../failed-releases.js';
import type { EtcdConnection } from './etcd.connection.js';
import { isHeldValue } from './etcd.kinds.js';
import type { EtcdLine } from './etcd.line.js';
import type { EtcdPlaces } from './etcd.places.js';

/** What a failed release leaves to free: the leases its owner may hold keys on, and whether it may have waiting entries. */
interface Leftover {
  leases: readonly string[];
  waiting: boolean;
}

/**
 * How an owner's entries and leases go on release, and, when etcd did not answer, what is sent
 * again once it does (FailedReleases): without it, a holder's lease would keep its keys for its
 * ttl, which every election restarts in full, and a waiter's entries would sit on the waiter lease
 * for as long as any other caller of this process waits.
 */
export class EtcdReleases {
  private readonly failed: FailedReleases<Leftover>;
  /** Releases sent again and still out: their own answers say nothing new (see the constructor). */
  private resending = 0;

  constructor(
    private readonly connection: EtcdConnection,
    private readonly line: EtcdLine,
    private readonly places: EtcdPlaces,
    waiterTimeout: number,
  ) {
    // etcd3 says nothing when a member answers again: a call answered says etcd is back, and while
    // nothing else is sent, a try every third of waiterTimeout (as often as a dead process holds a
    // line up) finds out.
    this.failed = new FailedReleases<Leftover>((keys, owner, left) => this.releaseAgain(keys, owner, left!), {
      retryEveryMs: waiterTimeout / 3,
    });
    // Not the answers of a batch sent again: one that fails again at once after its revoke was
    // answered would start the next batch at once, and so on without end. What fails again waits
    // for the next other answer, or the timer.
    connection.onAnswer = () => {
      if (this.resending === 0) this.failed.sendAgain();
    };
  }

  /** The owner asks again (its own later request): its entries are its place, not leftovers. */
  forget(owner: string): void {
    this.failed.forget(owner);
  }

  close(): void {
    this.failed.close();
  }

  /** Deletes the owner's entries; true when it held the keys. Rejects when etcd did not answer. */
  async release(keys: readonly string[], owner: string): Promise<boolean> {
    const what = { op: 'release', keys };
    const place = this.places.get(owner);
    const state = place?.state;
    // A waiter's hold lease carries only its anchor: drop() revokes it.
    if (place) this.places.drop(place);
    if (place && state === 'held' && !place.moving) {
      try {
        return await this.connection.revoke(place.hold.id, what);
      } catch (error) {
        // Not revoked, the lease lives on: until its ttl, which an election restarts in full.
        this.later(keys, owner, { leases: [place.hold.id], waiting: false }, error);
        throw error;
      }
    }
    let response;
    try {
      // Its last request went unanswered and may still land, as long as its hold lease exists (that
      // request puts a key on it): the lease goes first, then whatever landed before.
      if (place && state === 'unknown') await this.connection.revoke(place.hold.id, what);
      // A waiter, an owner whose last request went unanswered, or one another client placed: its
      // entries go (what they were says whether it held the keys), then any lease it may hold them on.
      response = await this.connection.txn(this.line.deleteOwn(keys, owner), what);
    } catch (error) {
      const leases = place && state !== 'waiting' ? [place.hold.id, ...(place.movingTo ? [place.movingTo.id] : [])] : [];
      this.later(keys, owner, { leases, waiting: state !== 'held' }, error);
      throw error;
    }
    const deleted = this.line.deletedOf(response, keys);
    const held = deleted.filter((kv) => isHeldValue(kv.value));
    const leases = new Set(held.map((kv) => kv.lease));
    if (place && state !== 'waiting') for (const lease of [place.hold, place.movingTo]) if (lease) leases.add(lease.id);
    for (const lease of leases) this.connection.revokeQuietly(lease, what);
    return held.length > 0;
  }

  /** A release that reached nothing: sent again once etcd answers. */
  private later(keys: readonly string[], owner: string, left: Leftover, error: unknown): void {
    // Refused (credentials, rights): sending it again cannot help, nor after shutdown.
    if (this.connection.closed || (error instanceof LockBackendError && error.permanent)) return;
    // Keys too large for a request of etcd's (the caller's mistake, told to it): no resend can
    // delete its entries. Its leases, if any, still go.
    if (error instanceof InvalidLockKeyError) {
      if (left.leases.length === 0) return;
      left = { leases: left.leases, waiting: false };
    }
    this.failed.add(keys, owner, left);
  }

  /**
   * A failed release, sent again: its leases first (a late request of its owner may land until
   * they go), then its waiting entries, only while they are a waiter's: this may land after the
   * owner asked again and took the key, and must leave that lock alone.
   */
  private async releaseAgain(keys: readonly string[], owner: string, left: Leftover): Promise<void> {
    const what = { op: 'release', keys };
    this.resending++;
    try {
      for (const lease of left.leases) await this.connection.revoke(lease, what);
      if (left.waiting) await Promise.all(keys.map((key) => this.connection.txn(this.line.deleteWaiting(key, owner), what)));
    } catch (error) {
      this.later(keys, owner, left, error);
    } finally {
      this.resending--;
    }
  }
}
