import type { IKeyValue, Watcher } from 'etcd3';
import { performance } from 'node:perf_hooks';
import type { EtcdConnection, Operation } from './etcd.connection.js';
import type { EtcdHandover } from './etcd.handover.js';
import { EtcdLeaseKeeper } from './etcd.lease-keeper.js';
import type { UntilHeld } from './etcd.kinds.js';
import type { LineRequest } from './etcd.line.js';
import { PredecessorWatches } from './etcd.predecessor-watch.js';

/** The lease an owner holds its keys on, or will once its turn comes. */
export interface HoldLease {
  id: string;
  /** The seconds asked for (the lock's ttl, rounded up): an extension with the same keeps it. */
  seconds: number;
  /** The seconds etcd granted (its minimum when more than asked): what a keepalive restores. */
  ttl: number;
  /** When the last keepalive answered (or the grant) was sent: alive until at least then plus `ttl`. */
  aliveSince: number;
  /** A keepalive found it gone while its owner waited. */
  lost?: boolean;
}

/** One acquisition: its keys, its kind, and who asks. */
export interface Ask {
  readonly keys: readonly string[];
  readonly owner: string;
  /** How many holders each key admits (TryAcquireOptions.limits). */
  readonly limits: readonly number[];
  /** Who asks (identityBytes of TryAcquireOptions.holder), for its identity keys. */
  readonly who: Buffer | undefined;
}

/** What this process knows of one owner's entries in etcd. */
export interface Place extends Ask {
  /**
   * What its identity keys say (etcd.identity.ts): who asks, and when the request that last put
   * them was sent. A move to another lease puts it again.
   */
  identity: Buffer;
  /** Its entries from this index on are pending: it keeps nobody out in the lines after the first that keeps it out. */
  pendingFrom: number;
  /** 'unknown': its last request went unanswered, so whether it applied is not known. */
  state: 'waiting' | 'held' | 'unknown';
  /** The create revision of its entries: place in line, and fencing token. */
  revision?: number;
  /** The waiter lease its entries sit on while it waits. */
  waitLease?: string;
  /** The lease of its first attempt: kept alive while it waits, the keys go onto it when it is first. */
  hold: HoldLease;
  /** A move to another lease (an extension with another ttl) that went unanswered. */
  movingTo?: HoldLease;
  /** A move to another lease is out (its grant or its transaction), or went unanswered. */
  moving?: boolean;
  /** A revoke of its hold lease went unanswered: it may still land, and take the keys on that lease with it. */
  revokeOut?: boolean;
  /** Its watches saw every entry ahead of it go (or hold, with `untilHeld`): the next attempt goes straight for the keys. */
  clear: boolean;
  /**
   * Its last look found it in on every line of its keys but for entries ahead in the last one that
   * did not hold yet: once they hold, it takes the keys without another look.
   */
  untilHeld?: UntilHeld;
  watches?: PredecessorWatches;
  /** A watch on its own entry, for a hand-over (etcd.handover.ts). */
  ownWatch?: Watcher;
  /** Held, handed over by a release: its entry is on `waitLease`, marked so, until moved onto `hold`. */
  handed?: boolean;
  /** Extensions out: its lease is not used again while one may still revoke it. */
  extending?: number;
  /** Who waits just behind it, read once it held (etcd.handover.ts). */
  next?: Promise<IKeyValue | undefined>;
}

/**
 * This process's owners with entries in etcd, their wake-ups and the leases kept alive while they
 * wait. A wake-up that comes before its owner listens is kept until it does.
 */
export class EtcdPlaces {
  private readonly places = new Map<string, Place>();
  private readonly listeners = new Map<string, () => void>();
  private readonly pendingWakes = new Set<string>();
  private readonly keeper: EtcdLeaseKeeper;
  /** Watches being cancelled, for close() to wait for. */
  private readonly stopping = new Set<Promise<void>>();

  constructor(
    private readonly connection: EtcdConnection,
    private readonly handover: EtcdHandover,
    waiterSeconds: number,
    /** The longest wait for etcd to confirm a cancelled watch. */
    private readonly timeoutMs: number,
  ) {
    this.keeper = new EtcdLeaseKeeper(connection, waiterSeconds, (lost) => this.waiterLeaseLost(lost));
  }

  get(owner: string): Place | undefined {
    return this.places.get(owner);
  }

  /** A place that stands in line, as the line's transactions take it. */
  static request(place: Place): LineRequest {
    return place as LineRequest;
  }

  waiterLease(what: Operation): Promise<string> {
    return this.keeper.waiterLease(what);
  }

  waiterLeaseGone(lease: string): void {
    this.keeper.gone(lease);
  }

  /**
   * A release of a place on waiter lease `lease` went unanswered: new places go on another one,
   * so that this one runs out once the places on it now are gone, with whatever that release
   * left on it (a lock a release handed over to the owner that gave up, see EtcdReleases).
   */
  retireWaiterLease(lease: string): void {
    this.keeper.retire(lease);
  }

  held(ask: Ask, identity: Buffer, revision: number, hold: HoldLease): void {
    this.places.set(ask.owner, { ...asked(ask), identity, pendingFrom: ask.keys.length, state: 'held', revision, hold, clear: false });
  }

  waiting(ask: Ask, identity: Buffer, revision: number, waitLease: string, hold: HoldLease): Place {
    const place: Place = {
      ...asked(ask),
      identity,
      pendingFrom: ask.keys.length,
      state: 'waiting',
      revision,
      waitLease,
      hold,
      clear: false,
    };
    this.enterLine(place);
    this.places.set(ask.owner, place);
    return place;
  }

  /** A first attempt went unanswered: its entries may be held on `hold`, waiting on `waitLease`, or absent. */
  unknown(ask: Ask, identity: Buffer, hold: HoldLease, waitLease: string): void {
    const place: Place = { ...asked(ask), identity, pendingFrom: ask.keys.length, state: 'unknown', waitLease, hold, clear: false };
    this.enterLine(place);
    this.places.set(ask.owner, place);
  }

  /** A waiter's attempt to take the keys went unanswered. */
  unanswered(place: Place): void {
    place.state = 'unknown';
  }

  /** What an unanswered request did, once read back: it waits, at `revision`, its entries pending from `pendingFrom` on. */
  settledWaiting(place: Place, revision: number, pendingFrom: number): void {
    place.state = 'waiting';
    place.revision = revision;
    place.pendingFrom = pendingFrom;
    place.clear = false;
  }

  /** It holds the keys now (on its hold lease): it leaves the line, and looks who waits behind it. */
  promoted(place: Place, revision: number): void {
    this.leaveLine(place);
    place.state = 'held';
    place.handed = false;
    place.revision = revision;
    this.handover.lookBehind(place);
  }

  /**
   * A release handed it the key: it holds, on the waiter lease, which stays kept alive for it
   * until its entry moves onto its hold lease (moved()). Its owner is woken.
   */
  handed(place: Place, revision: number, wake = true): boolean {
    if (this.places.get(place.owner) !== place || place.waitLease === undefined || place.state === 'held') return false;
    this.stopWatching(place);
    place.state = 'held';
    place.handed = true;
    place.revision = revision;
    this.handover.lookBehind(place);
    if (wake) this.wake(place.owner);
    return true;
  }

  /** How long a lock handed over is certainly valid from now: while the waiter lease it is on lives. */
  handedValidity(place: Place, ttlMs: number): number {
    if (place.waitLease === undefined) return 0;
    return Math.max(0, Math.min(ttlMs, this.keeper.waiterLeaseAliveUntil(place.waitLease) - performance.now()));
  }

  /** A lock handed over is on its hold lease now: the waiter lease and the hold lease are no longer kept for it. */
  moved(place: Place): void {
    place.handed = false;
    this.leaveLine(place);
  }

  /**
   * Where a waiter stands now: it watches the entries ahead whose going (or being held, with
   * `untilHeld`) may let it in, read at `readRevision`.
   */
  stand(place: Place, waitFor: readonly Buffer[], readRevision: number, untilHeld = false): void {
    place.clear = waitFor.length === 0;
    place.watches?.arm(waitFor, readRevision, untilHeld);
  }

  /** A waiter's hold lease was found gone: a new one replaces it. */
  replaceHold(place: Place, hold: HoldLease): void {
    this.keeper.release(place.hold.id);
    this.connection.revokeQuietly(place.hold.id, { op: 'clean-up', keys: [] });
    place.hold = hold;
    this.keepHold(place);
  }

  /**
   * This process forgets the owner (released, or its place is gone). The hold lease of a waiter
   * carries no key: it is revoked here; the caller sees to any other.
   */
  drop(place: Place): void {
    if (this.places.get(place.owner) === place) this.places.delete(place.owner);
    this.pendingWakes.delete(place.owner);
    const waiting = place.state === 'waiting';
    this.leaveLine(place);
    if (waiting) this.connection.revokeQuietly(place.hold.id, { op: 'clean-up', keys: place.keys });
  }

  /**
   * This process forgets the owner at once (a release); the leases kept for it are let go by
   * drop(), once its entries are gone: a lock handed over sits on the waiter lease until then.
   */
  detach(place: Place): void {
    if (this.places.get(place.owner) === place) this.places.delete(place.owner);
    this.pendingWakes.delete(place.owner);
  }

  /** Calls `wake` when something ahead of `owner` changed; returns the function that stops it. */
  listen(owner: string, wake: () => void): () => void {
    this.listeners.set(owner, wake);
    if (this.pendingWakes.delete(owner)) queueMicrotask(wake);
    return () => {
      if (this.listeners.get(owner) === wake) this.listeners.delete(owner);
      this.pendingWakes.delete(owner);
    };
  }

  async close(): Promise<void> {
    for (const place of this.places.values()) this.leaveLine(place);
    this.places.clear();
    this.listeners.clear();
    this.pendingWakes.clear();
    await Promise.all([...this.stopping, this.keeper.close()]);
  }

  private enterLine(place: Place): void {
    this.keeper.join(place.waitLease!);
    this.keepHold(place);
    place.watches = new PredecessorWatches(this.connection, (clear) => this.changed(place, clear));
    place.ownWatch = this.handover.watchOwn(place, () => this.handed(place, place.revision!));
  }

  private keepHold(place: Place): void {
    const hold = place.hold;
    this.keeper.keep(hold.id, {
      alive: (sentAt) => void (hold.aliveSince = Math.max(hold.aliveSince, sentAt)),
      lost: () => void (hold.lost = true),
    });
  }

  private leaveLine(place: Place): void {
    if (place.waitLease !== undefined) this.keeper.leave(place.waitLease);
    place.waitLease = undefined;
    this.keeper.release(place.hold.id);
    this.stopWatching(place);
  }

  private stopWatching(place: Place): void {
    if (place.ownWatch) {
      // Bounded as the other watches' cancels are (PredecessorWatches.stop): a member that does not answer holds up no shutdown.
      let timer: NodeJS.Timeout | undefined;
      const cancel = place.ownWatch.cancel().catch(() => undefined);
      const cancelled: Promise<void> = Promise.race([cancel, new Promise<void>((resolve) => (timer = setTimeout(resolve, this.timeoutMs)))])
        .finally(() => clearTimeout(timer))
        .finally(() => this.stopping.delete(cancelled));
      this.stopping.add(cancelled);
      place.ownWatch = undefined;
    }
    if (!place.watches) return;
    const stopped: Promise<void> = place.watches.stop(this.timeoutMs).finally(() => this.stopping.delete(stopped));
    this.stopping.add(stopped);
    place.watches = undefined;
  }

  private changed(place: Place, clear: boolean): void {
    if (this.places.get(place.owner) !== place || place.state !== 'waiting') return;
    place.clear = clear;
    // A release that hands this waiter the key deletes the entry ahead and marks its own in one
    // revision, which etcd tells the two watches apart: the wake-up waits for the events already
    // received to be read, so that a hand-over is taken as such, not as a clear line to take.
    if (place.ownWatch) setImmediate(() => this.wakeWaiting(place));
    else this.wake(place.owner);
  }

  private wakeWaiting(place: Place): void {
    if (this.places.get(place.owner) === place && place.state === 'waiting') this.wake(place.owner);
  }

  private wake(owner: string): void {
    const listener = this.listeners.get(owner);
    if (listener) listener();
    else this.pendingWakes.add(owner);
  }

  /** The waiter lease ran out: the places on it are gone, and their owners ask again to take new ones. */
  private waiterLeaseLost(lease: string): void {
    for (const place of this.places.values()) {
      if (place.waitLease !== lease) continue;
      place.waitLease = undefined;
      place.clear = false;
      this.wake(place.owner);
    }
  }
}

/** An acquisition's own fields, and none of a place it may be (a place that starts over is passed as its ask). */
function asked({ keys, owner, limits, who }: Ask): Ask {
  return { keys, owner, limits, who };
}
