import { InvalidLockKeyError, LockBackendError } from '../../lock.errors.js';
import { FailedReleases } from '../failed-releases.js';
import type { EtcdConnection } from './etcd.connection.js';
import type { EtcdHandover } from './etcd.handover.js';
import { isHandedValue, isHeldValue } from './etcd.kinds.js';
import type { EtcdLine } from './etcd.line.js';
import type { EtcdPlaces, HoldLease, Place } from './etcd.places.js';

/** What a failed release leaves to free: the leases its owner may hold keys on, and whether it may have waiting entries. */
interface Leftover {
  leases: readonly string[];
  waiting: boolean;
  /** A lock handed over, on a waiter lease that stays (etcd.handover.ts): its entry of this revision goes. */
  handed?: number;
  /**
   * The waiter lease of a waiter's place, which a release may have handed the key to meanwhile
   * (etcd.handover.ts): its entry goes if it is marked so, on that lease still.
   */
  handedOn?: string;
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
    private readonly handover: EtcdHandover,
    /** Keeps a released lock's lease, which holds nothing any more, for another lock. */
    private readonly giveBack: (lease: HoldLease) => void,
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
    if (place && state === 'held' && !place.moving) return this.releaseHeld(place, what);
    // Read before drop() forgets them.
    const handedOn = place?.keys.length === 1 ? place.waitLease : undefined;
    // A waiter's hold lease carries only its anchor: drop() revokes it.
    if (place) this.places.drop(place);
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
      // Retired, that lease runs out once the places on it now are gone, with whatever a release handed
      // over to this waiter on it: its owner, asking again, stands on another.
      if (handedOn !== undefined) this.places.retireWaiterLease(handedOn);
      this.later(keys, owner, { leases, waiting: state !== 'held', handedOn }, error);
      throw error;
    }
    const deleted = this.line.deletedOf(response, keys);
    const held = deleted.filter((kv) => isHeldValue(kv.value));
    // A lock handed over sits on a waiter lease, which other places of its process may share.
    const leases = new Set(held.filter((kv) => !isHandedValue(kv.value)).map((kv) => kv.lease));
    if (place && state !== 'waiting') for (const lease of [place.hold, place.movingTo]) if (lease) leases.add(lease.id);
    for (const lease of leases) this.connection.revokeQuietly(lease, what);
    return held.length > 0;
  }

  /**
   * A holder's release: it hands the key to the waiter behind it if it can (etcd.handover.ts),
   * otherwise its entry goes: with its lease, revoked, or, for a lock handed over to it that still
   * sits on the waiter lease, deleted by its revision. Its leases are let go after that: the
   * waiter lease lives on until the entry is gone.
   */
  private async releaseHeld(place: Place, what: { op: string; keys: readonly string[] }): Promise<boolean> {
    const { keys, owner } = place;
    this.places.detach(place);
    // Its lease serves another lock once its keys are gone (etcd.spare-leases.ts), unless a request
    // that named it may still land, or an extension is still out (which revokes it if it finds the
    // keys gone).
    const reuse = (place.extending ?? 0) === 0 && this.connection.reusable(place.hold.id);
    const letGo = () => (reuse ? this.giveBack(place.hold) : this.connection.revokeQuietly(place.hold.id, what));
    try {
      const lease = place.handed ? place.waitLease : place.hold.id;
      // Unanswered, it may land later, but only while the entry is there: what follows deletes it.
      const handedOver = lease !== undefined && (await this.handover.handOver(place, lease, what).catch(() => false));
      if (handedOver) {
        letGo();
        return true;
      }
      if (!place.handed) {
        if (reuse) {
          const request = this.line.deleteHeld(keys, owner, place.revision!, place.hold.id);
          const deleted = await this.connection.txn(request, what).catch(() => undefined);
          if (deleted?.succeeded) {
            letGo();
            return true;
          }
        }
        try {
          return await this.connection.revoke(place.hold.id, what);
        } catch (error) {
          // Not revoked, the lease lives on: until its ttl, which an election restarts in full.
          this.later(keys, owner, { leases: [place.hold.id], waiting: false }, error);
          throw error;
        }
      }
      // Handed over to it: the entry may also have moved onto the hold lease (an extension beside
      // the release), which goes too.
      let response;
      try {
        response = await this.connection.txn(this.line.deleteRevision(keys[0], owner, place.revision!), what);
      } catch (error) {
        if (place.waitLease !== undefined) this.places.retireWaiterLease(place.waitLease);
        this.later(keys, owner, { leases: [place.hold.id], waiting: false, handed: place.revision }, error);
        throw error;
      }
      letGo();
      return response.succeeded;
    } finally {
      this.places.drop(place);
    }
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
      if (left.handed !== undefined) await this.connection.txn(this.line.deleteRevision(keys[0], owner, left.handed), what);
      if (left.waiting) await Promise.all(keys.map((key) => this.connection.txn(this.line.deleteWaiting(key, owner), what)));
      // After that deletion was answered, the entry is gone, or a release had handed it the key
      // before: no hand-over can come after, as one needs the entry still waiting.
      if (left.handedOn !== undefined) await this.connection.txn(this.line.deleteHandedOn(keys[0], owner, left.handedOn), what);
    } catch (error) {
      this.later(keys, owner, left, error);
    } finally {
      this.resending--;
    }
  }
}
