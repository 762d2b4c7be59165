import { performance } from 'node:perf_hooks';
import type { LockListOptions, LockListPage } from '../lock-backend.interface.js';
import { listEtcd } from './etcd.listing.js';
import { inspect } from 'node:util';
import { LockBackendError } from '../../lock.errors.js';
import type { AcquireResult, BackendHealth, ExtendResult, LockBackend, LockState, TryAcquireOptions } from '../lock-backend.interface.js';
import { EtcdAccess } from './etcd.access.js';
import { EtcdConnection, type Operation } from './etcd.connection.js';
import { EtcdKeys, HELD } from './etcd.keys.js';
import { EtcdLine, type Standing } from './etcd.line.js';
import {
  checkConnection,
  leaseSeconds,
  resolveBackendOptions,
  type EtcdLockBackendOptions,
  type EtcdLockConnection,
} from './etcd.options.js';
import { EtcdPlaces, type HoldLease, type Place } from './etcd.places.js';
import { EtcdReleases } from './etcd.releases.js';

/**
 * Locks in etcd, through the `etcd3` client. Each acquisition gets a lease of its own and puts one
 * entry per key, `<prefix><key>/<owner>`, in one transaction: the entries share one create
 * revision, which is the fencing token (strictly increasing across the cluster) and the order of
 * the line of every key. A request first in every line of its keys holds them; the others wait,
 * each watching only the entry just ahead of it (fair and herd-free). Extending is a keepalive of
 * the lease, releasing revokes it, and a holder that dies loses its keys when the lease runs out.
 *
 * Exclusive as long as etcd keeps a quorum: a minority of members may be lost, partitioned or
 * restarted without a second holder, since every step is a Raft write or a linearizable read.
 */
export class EtcdLockBackend implements LockBackend {
  readonly name = 'etcd';
  readonly fencing = true;

  private readonly connection: EtcdConnection;
  private readonly line: EtcdLine;
  private readonly keys: EtcdKeys;
  private readonly places: EtcdPlaces;
  private readonly releases: EtcdReleases;
  private readonly access: EtcdAccess;
  private readonly prefix: string;
  private readonly commandTimeout: number;

  /**
   * `new EtcdLockBackend(client)` uses your `Etcd3` client and leaves it open;
   * `new EtcdLockBackend('http://etcd:2379')`, an array of member URLs or `etcd3` settings
   * (`{ hosts, credentials, auth }`) create a client (etcd3 must be installed) and close it on
   * application shutdown.
   */
  constructor(connection: EtcdLockConnection, options?: EtcdLockBackendOptions) {
    const checked = checkConnection(connection);
    const resolved = resolveBackendOptions(options);
    this.prefix = resolved.prefix;
    this.commandTimeout = resolved.commandTimeout;
    this.connection = new EtcdConnection(checked, resolved, this.name);
    this.keys = new EtcdKeys(resolved.prefix);
    this.line = new EtcdLine(this.keys);
    this.places = new EtcdPlaces(this.connection, leaseSeconds(resolved.waiterTimeout), resolved.commandTimeout);
    this.access = new EtcdAccess(this.connection, resolved.prefix);
    this.releases = new EtcdReleases(this.connection, this.line, this.places, resolved.waiterTimeout);
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    if (this.connection.closed) throw this.connection.closedError('acquire', keys);
    const what = { op: 'acquire', keys };
    // Deleting them later would take this request's own place.
    this.releases.forget(owner);
    let place = this.places.get(owner);
    if (place?.state === 'unknown') place = await this.settle(place, what);
    if (place?.state === 'held') {
      // Its own lock already (an earlier attempt won after it was reported as failed): a
      // keepalive restarts the lease, so it is valid from this attempt on.
      if (await this.renew(place, what)) return { acquired: true, fencingToken: place.revision, validityMs: ttlMs };
      place = undefined;
    }
    if (place) return this.nextAttempt(place, ttlMs, what);
    return this.firstAttempt(keys, owner, ttlMs, options?.willWait ?? true, what);
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const what = { op: 'extend', keys };
    let place = this.places.get(owner);
    if (place?.state === 'unknown') place = await this.settle(place, what);
    if (!place) return this.extendUnknown(keys, owner, ttlMs, what);
    if (place.state !== 'held') return { extended: false };
    if (place.movingTo !== undefined && !(await this.settleMove(place, what))) {
      this.places.drop(place);
      return { extended: false };
    }
    const seconds = leaseSeconds(ttlMs);
    if (seconds === place.hold.seconds)
      return (await this.renew(place, what)) ? { extended: true, validityMs: ttlMs } : { extended: false };
    // Another ttl needs another lease: the entries move to a new one in one transaction (their
    // create revision, the token, stays), and the old one is revoked.
    const from = place.hold;
    // From here until the move is settled, a release deletes the entries wherever they are: a
    // revoke of the old lease alone would miss them if the move reached etcd first.
    place.moving = true;
    const to = await this.grant(seconds, what).catch((error: unknown) => {
      place.moving = false;
      throw error;
    });
    place.movingTo = to;
    // Unanswered, it may have been applied: the next extend or the release finds out (movingTo stays).
    const moved = this.line.moved(await this.connection.txn(this.line.moveLease(place.keys, owner, from.id, to.id), what), to.id);
    place.movingTo = undefined;
    place.moving = false;
    if (!moved || this.places.get(owner) !== place) {
      // Not moved, or released meanwhile (the release deleted the entries, moved or not).
      this.connection.revokeQuietly(to.id, what);
      this.places.drop(place);
      return { extended: false };
    }
    place.hold = to;
    this.connection.revokeQuietly(from.id, what);
    return { extended: true, validityMs: ttlMs };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    return this.releases.release(keys, owner);
  }

  async inspect(key: string): Promise<LockState | undefined> {
    const what = { op: 'inspect', keys: [key] };
    const [head] = (await this.connection.txn(this.line.head(key), what)).responses[0].response_range.kvs;
    // First in line but waiting for another of its keys: nobody holds this one.
    if (!head?.value.equals(HELD)) return undefined;
    const seconds = await this.connection.timeToLive(head.lease, what);
    if (seconds <= 0) return undefined;
    return { key, owner: this.keys.ownerOf(head.key), ttlMs: seconds * 1000, fencingToken: Number(head.create_revision) };
  }

  /** Range reads in key order after the cursor (see listEtcd). Read-only. */
  list(options: LockListOptions): Promise<LockListPage> {
    return listEtcd(this.connection, this.keys, options);
  }

  async watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    if (this.connection.closed) throw this.connection.closedError('watch', keys);
    // A waiter's watches are set by its failed attempt, and a wake-up that comes before it
    // listens is kept: nothing after that attempt is missed. Without the owner, the caller polls.
    if (owner === undefined) return () => undefined;
    return this.places.listen(owner, onRelease);
  }

  /**
   * Always, while open: a waiter watches the entry ahead of it from its failed attempt on, and a
   * wake-up that comes before it listens is kept until it does.
   */
  watching(): boolean {
    return !this.connection.closed;
  }

  /**
   * At start-up: etcd takes the backend's credentials and lets it read and write its prefix.
   * Rejects with a permanent LockBackendError naming the fix; resolves when no member answers.
   */
  verify(): Promise<void> {
    return this.access.verify();
  }

  /** For health checks: down, with the fix, while etcd refuses the credentials or the rights a lock needs. */
  health(): Promise<BackendHealth> {
    return this.access.health();
  }

  /** Stops watches and the waiter lease (its places leave their lines), and closes the client if the backend created it. */
  async close(): Promise<void> {
    if (!this.connection.stop()) return;
    // The waiter lease goes with the places, and every entry on it.
    this.releases.close();
    await this.places.close();
    this.connection.closeClient();
  }

  /** What logs show of the backend: its prefix, not its connection settings (they may hold a password) nor owners. */
  toJSON(): { name: string; prefix: string; commandTimeout: number } {
    return { name: this.name, prefix: this.prefix, commandTimeout: this.commandTimeout };
  }

  [inspect.custom](depth: number, options: object): string {
    return `EtcdLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  private async firstAttempt(
    keys: readonly string[],
    owner: string,
    ttlMs: number,
    willWait: boolean,
    what: Operation,
  ): Promise<AcquireResult> {
    const [hold, wait] = await Promise.all([this.grant(leaseSeconds(ttlMs), what), willWait ? this.places.waiterLease(what) : undefined]);
    let response;
    try {
      response = await this.connection.txn(this.line.firstAttempt(keys, owner, hold.id, wait), what);
    } catch (error) {
      if (wait !== undefined && this.connection.isLeaseGone(error)) {
        // The waiter lease ran out while nobody waited: a new one, and again.
        this.places.waiterLeaseGone(wait);
        this.connection.revokeQuietly(hold.id, what);
        return this.firstAttempt(keys, owner, ttlMs, willWait, what);
      }
      // Applied or not, nobody knows: a caller that waits asks again or releases, and either
      // looks first; for one that does not, the lease goes, and with it a lock it may have won.
      // (etcd refused it outright, for its size or for the user's rights: not applied.)
      if (wait !== undefined && error instanceof LockBackendError && !error.permanent) this.places.unknown(keys, owner, hold, wait);
      else this.connection.revokeQuietly(hold.id, what);
      throw error;
    }
    const revision = Number(response.header.revision);
    if (response.succeeded) {
      this.places.held(keys, owner, revision, hold);
      return { acquired: true, fencingToken: revision, validityMs: ttlMs };
    }
    if (wait === undefined) {
      this.connection.revokeQuietly(hold.id, what);
      return { acquired: false };
    }
    const placed = this.line.placedRevision(response, keys);
    const place = this.places.waiting(keys, owner, placed, wait, hold);
    const standing = this.line.standingAfterFirst(response, keys, owner, placed);
    if (standing) this.places.stand(place, standing);
    return { acquired: false };
  }

  /**
   * A waiter asks again. When its watches said everything ahead of it went, it goes straight for
   * the keys: one transaction moves its entries onto its hold lease if it is first, while a
   * keepalive restarts that lease. Otherwise it looks first, in a read-only transaction.
   */
  private async nextAttempt(place: Place, ttlMs: number, what: Operation, retried = false): Promise<AcquireResult> {
    const started = performance.now();
    const { keys, owner } = place;
    const revision = place.revision!;
    if (!place.clear) {
      const check = await this.connection.txn(this.line.nextAttempt(keys, owner, revision, undefined), what);
      if (!check.succeeded) return this.stillWaiting(place, this.line.standing(check, keys, place.hold.id), ttlMs, what);
    }
    if (place.hold.lost) this.places.replaceHold(place, await this.grant(place.hold.seconds, what));
    const hold = place.hold;
    let response, kept;
    try {
      [response, kept] = await Promise.all([
        this.connection.txn(this.line.nextAttempt(keys, owner, revision, hold.id), what),
        this.connection.keepAlive(hold.id, what).catch(() => false),
      ]);
    } catch (error) {
      if (this.connection.isLeaseGone(error) && !retried) {
        hold.lost = true;
        return this.nextAttempt(place, ttlMs, what, true);
      }
      this.places.unanswered(place);
      throw error;
    }
    if (!response.succeeded) return this.stillWaiting(place, this.line.standing(response, keys, hold.id), ttlMs, what);
    if (this.places.get(owner) !== place) {
      // Released while the attempt was out: nobody wants the lock it won.
      this.connection.revokeQuietly(hold.id, what);
      return { acquired: false };
    }
    this.places.promoted(place, revision);
    // The keepalive sent with it restarted the lease; without its answer, the last one counts.
    const validityMs = kept ? ttlMs : Math.max(0, Math.min(ttlMs, hold.aliveSince + hold.ttl * 1000 - started));
    return { acquired: true, fencingToken: revision, validityMs };
  }

  private async stillWaiting(place: Place, standing: Standing, ttlMs: number, what: Operation): Promise<AcquireResult> {
    if (this.places.get(place.owner) !== place) return { acquired: false };
    if (standing.won) {
      // An attempt of its own whose answer was lost took the keys meanwhile.
      this.places.promoted(place, place.revision!);
      if (await this.renew(place, what)) return { acquired: true, fencingToken: place.revision, validityMs: ttlMs };
      return { acquired: false };
    }
    if (standing.lost) {
      // Its place is gone (the waiter lease ran out): it takes a new one, at the back.
      this.places.drop(place);
      return this.firstAttempt(place.keys, place.owner, ttlMs, true, what);
    }
    this.places.stand(place, standing);
    return { acquired: false };
  }

  /**
   * An owner whose last request went unanswered: reads its entries to learn what that request
   * did. Held on its hold lease: it won. On the waiter lease: it waits. Neither: it starts over.
   */
  private async settle(place: Place, what: Operation): Promise<Place | undefined> {
    const entries = this.line.ownEntriesOf(await this.connection.txn(this.line.ownEntries(place.keys, place.owner), what));
    const [first] = entries;
    const whole =
      first !== undefined && entries.every((kv) => kv && kv.create_revision === first.create_revision && kv.lease === first.lease);
    if (whole && first.lease === place.hold.id && first.value.equals(HELD)) {
      this.places.promoted(place, Number(first.create_revision));
      return place;
    }
    if (whole && first.lease === place.waitLease) {
      this.places.settledWaiting(place, Number(first.create_revision));
      return place;
    }
    // Its request may still land while its hold lease exists: it starts over once that lease is
    // gone (an entry that landed on the waiter lease meanwhile is kept by the next attempt).
    await this.connection.revoke(place.hold.id, what);
    if (entries.some(Boolean)) await this.connection.txn(this.line.deleteOwn(place.keys, place.owner), what);
    this.places.drop(place);
    return undefined;
  }

  /**
   * An earlier move to another lease went unanswered: which lease are the entries on? On the new
   * one, it is kept. Otherwise the move may still land until the new lease is revoked (revoking it
   * would then delete the entries): so it is revoked first, and the entries are looked at again.
   * False when they are gone.
   */
  private async settleMove(place: Place, what: Operation): Promise<boolean> {
    const moving = place.movingTo!;
    const leases = async () =>
      this.line.ownEntriesOf(await this.connection.txn(this.line.ownEntries(place.keys, place.owner), what)).map((kv) => kv?.lease);
    if ((await leases()).every((lease) => lease === moving.id)) {
      place.movingTo = undefined;
      place.moving = false;
      this.connection.revokeQuietly(place.hold.id, what);
      place.hold = moving;
      return true;
    }
    await this.connection.revoke(moving.id, what);
    place.movingTo = undefined;
    place.moving = false;
    return (await leases()).every((lease) => lease === place.hold.id);
  }

  /**
   * Restarts a holder's lease and checks, at the same time, that its entries are still on it, as
   * it left them: a keepalive alone would keep a lease whose keys were deleted (by hand, or by a
   * request of its own that landed late) and tell the holder nothing. When not, it is dropped, and
   * its lease revoked with whatever is left on it (a key deleted by hand and its other keys not).
   */
  private async renew(place: Place, what: Operation): Promise<boolean> {
    const [kept, response] = await Promise.all([
      this.connection.keepAlive(place.hold.id, what),
      this.connection.txn(this.line.ownEntries(place.keys, place.owner), what),
    ]);
    const intact = this.line
      .ownEntriesOf(response)
      .every((kv) => kv?.value.equals(HELD) && kv.lease === place.hold.id && Number(kv.create_revision) === place.revision);
    if (kept && intact) return true;
    this.places.drop(place);
    if (kept) this.connection.revokeQuietly(place.hold.id, what);
    return false;
  }

  /** Extending for an owner this client did not acquire for: its entries say which lease, if held. */
  private async extendUnknown(keys: readonly string[], owner: string, ttlMs: number, what: Operation): Promise<ExtendResult> {
    const entries = this.line.ownEntriesOf(await this.connection.txn(this.line.ownEntries(keys, owner), what));
    const [first] = entries;
    if (!first || !entries.every((kv) => kv?.value.equals(HELD) && kv.lease === first.lease)) return { extended: false };
    const next = await this.grant(leaseSeconds(ttlMs), what);
    const moved = this.line.moved(await this.connection.txn(this.line.moveLease(keys, owner, first.lease, next.id), what), next.id);
    this.connection.revokeQuietly(moved ? first.lease : next.id, what);
    return moved ? { extended: true, validityMs: ttlMs } : { extended: false };
  }

  private async grant(seconds: number, what: Operation): Promise<HoldLease> {
    const aliveSince = performance.now();
    const { id, ttl } = await this.connection.grant(seconds, what);
    return { id, seconds, ttl, aliveSince };
  }
}
