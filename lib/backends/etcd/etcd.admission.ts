import type { IKeyValue } from 'etcd3';
import { performance } from 'node:perf_hooks';
import { LockBackendError } from '../../lock.errors.js';
import type { AcquireResult } from '../lock-backend.interface.js';
import type { EtcdConnection, Operation } from './etcd.connection.js';
import { entryValue, isHandedValue, isHeldValue, isPendingValue, type UntilHeld } from './etcd.kinds.js';
import type { EtcdLine } from './etcd.line.js';
import { enterAtEnd } from './etcd.no-wait.js';
import { leaseSeconds } from './etcd.options.js';
import { identityValue } from './etcd.identity.js';
import { EtcdPlaces, type Ask, type HoldLease, type Place } from './etcd.places.js';
import { EtcdSpareLeases } from './etcd.spare-leases.js';
import { standing, standingAfterFirst, type Standing } from './etcd.standing.js';

/** Steps one attempt may take in a row (look, trim, put later entries, take): past it, the caller asks again later. */
const MAX_STEPS = 8;
/** Looks a caller that does not wait takes at lines others keep joining (see enterAtEnd). */
const MAX_LOOKS = 3;
/**
 * A waiter's hold lease with at least this share of the lock's ttl certainly left (the lease
 * keeper restarted it, or it was granted, a moment ago) is taken as it is, without a keepalive:
 * the lock's validity is then counted from that restart, and the service takes a lease within 5%
 * of the ttl as it is (lock-lease.ts, ready()), so nothing is spent on it later either.
 */
const FRESH_HOLD = 0.95;

/**
 * How an acquisition gets its keys on etcd: a first attempt, then, for a caller that waits, the
 * next ones, each from where it stands in the lines of its keys (etcd.line.ts, etcd.kinds.ts).
 *
 * A caller of several keys stands in the lines of its keys up to the first that keeps it out,
 * and in none after it: a place in a later key's line would keep that key from a holder of an
 * earlier one that asks for it next (sorted order), while this caller waits for the earlier one,
 * and both would wait for good. Its first attempt puts an entry in every line (one transaction),
 * and takes back those after the first line that keeps it out; once it is in on every line it
 * stands in, it puts the rest, only while their lines hold nothing newer than its token (its first
 * entries' revision, which stays its token), else it starts over at the back. So every line stays
 * ordered by token, and whoever enters a key after a holder has a greater token. Readers and permit
 * callers, who may enter beside others, also wait for every entry ahead of them to hold
 * (etcd.kinds.ts): nobody holds and leaves a key before an entry with a smaller token takes it.
 */
export class EtcdAdmission {
  private readonly spares: EtcdSpareLeases;

  constructor(
    private readonly connection: EtcdConnection,
    private readonly line: EtcdLine,
    private readonly places: EtcdPlaces,
  ) {
    this.spares = new EtcdSpareLeases(
      (seconds) => this.grant(seconds, { op: 'grant a spare lease', keys: [] }),
      (lease) => this.connection.revoke(lease, { op: 'clean-up', keys: [] }),
    );
  }

  /**
   * The first attempt takes the spare lease of its ttl (etcd.spare-leases.ts) when there is one,
   * else grants its own: either way its transaction puts the keys (or the anchor) on that lease.
   * A spare granted a while ago is restarted by a keepalive sent beside the transaction, unless
   * nearly the whole ttl is left (FRESH_HOLD); the validity reported is counted from that
   * keepalive, or else from the spare's grant, never from this call alone.
   */
  async firstAttempt(ask: Ask, ttlMs: number, willWait: boolean, what: Operation, looks = 1, spare = true): Promise<AcquireResult> {
    const { keys, owner, limits } = ask;
    const started = performance.now();
    const seconds = leaseSeconds(ttlMs);
    const taken = spare ? this.spares.take(seconds) : undefined;
    const [hold, wait] = await Promise.all([taken ?? this.grant(seconds, what), willWait ? this.places.waiterLease(what) : undefined]);
    // Both branches put it: a holder took the keys, a waiter its place, when this was sent.
    const identity = identityValue(ask.who, Date.now());
    const fresh = leaseLeft(hold, started) >= ttlMs * FRESH_HOLD;
    const keptSince = performance.now();
    let response, kept;
    try {
      const sent = this.connection.txn(this.line.firstAttempt(keys, owner, limits, identity, hold.id, wait), what);
      // The next spare is asked for once this transaction is on its way: etcd takes that first.
      this.spares.replenish(seconds, taken !== undefined);
      [response, kept] = await Promise.all([sent, fresh ? false : this.connection.keepAlive(hold.id, what).catch(() => false)]);
    } catch (error) {
      if (this.connection.isLeaseGone(error) && (wait !== undefined || taken !== undefined)) {
        // The spare ran out, or the waiter lease did while nobody waited; etcd does not say which.
        // Without the spare first: the waiter lease, which the process's other waiters stand on, is
        // given up only when no spare was in the transaction.
        if (taken === undefined) this.places.waiterLeaseGone(wait!);
        this.connection.revokeQuietly(hold.id, what);
        return this.firstAttempt(ask, ttlMs, willWait, what, looks, false);
      }
      // Applied or not, nobody knows: a caller that waits asks again or releases, and either
      // looks first; for one that does not, the lease goes, and with it a lock it may have won.
      // (etcd refused it outright, for its size or for the user's rights: not applied.)
      if (wait !== undefined && error instanceof LockBackendError && !error.permanent) this.places.unknown(ask, identity, hold, wait);
      else this.connection.revokeQuietly(hold.id, what);
      throw error;
    }
    if (kept) hold.aliveSince = Math.max(hold.aliveSince, keptSince);
    const validityMs = Math.max(0, Math.min(ttlMs, leaseLeft(hold, started)));
    const revision = Number(response.header.revision);
    if (response.succeeded) {
      this.places.held(ask, identity, revision, hold);
      return { acquired: true, fencingToken: revision, validityMs };
    }
    if (wait === undefined) {
      const entered = await enterAtEnd(this.connection, this.line, {
        keys,
        owner,
        limits,
        identity,
        hold,
        validityMs,
        read: response,
        what,
      });
      if (entered === 'again') return looks < MAX_LOOKS ? this.firstAttempt(ask, ttlMs, false, what, looks + 1) : { acquired: false };
      if (entered.acquired) this.places.held(ask, identity, entered.fencingToken!, hold);
      return entered;
    }
    const placed = this.line.placedRevision(response, keys);
    const place = this.places.waiting(ask, identity, placed, wait, hold);
    return this.decide(place, standingAfterFirst(response, keys, limits, placed), ttlMs, what, 0);
  }

  /**
   * A waiter asks again. When its watches said everything ahead of it in its exclusive lines went,
   * it goes straight for the keys: one transaction moves its entries onto its hold lease if it is
   * first (with a keepalive of that lease, unless it is fresh). So does a reader or permit caller
   * whose watch said the entry ahead it waited for holds now, checking that every entry ahead that
   * did not hold at its last look holds now. Otherwise it looks first, in a read-only transaction.
   */
  async nextAttempt(place: Place, ttlMs: number, what: Operation, steps = 0): Promise<AcquireResult> {
    const request = EtcdPlaces.request(place);
    const exclusive = this.line.exclusiveEverywhere(request);
    if (place.clear && exclusive) return this.take(place, ttlMs, what, steps + 1, undefined);
    const until = place.untilHeld;
    if (place.clear && until) return this.take(place, ttlMs, what, steps + 1, until.pending, false, until.notHeld);
    const check = await this.connection.txn(this.line.check(request), what);
    if (exclusive && check.succeeded) return this.take(place, ttlMs, what, steps + 1, undefined);
    return this.decide(place, standing(check, request, place.hold.id), ttlMs, what, steps + 1);
  }

  /** What a waiter does from where it stands: take the keys, or wait, watching what may let it in. */
  private async decide(place: Place, standing: Standing, ttlMs: number, what: Operation, steps: number): Promise<AcquireResult> {
    if (this.places.get(place.owner) !== place) return { acquired: false };
    if (standing.won) {
      // An attempt of its own whose answer was lost took the keys meanwhile.
      this.places.promoted(place, place.revision!);
      if (await this.renew(place, what)) return { acquired: true, fencingToken: place.revision, validityMs: ttlMs };
      return { acquired: false };
    }
    // A release handed it the key before its watch said so.
    if (standing.handed) {
      // Its watch may have told it already, while this attempt was out.
      if (!place.handed && !this.places.handed(place, place.revision!, false)) return { acquired: false };
      return this.handedLock(place, ttlMs, what);
    }
    // Its place is gone (the waiter lease ran out, or a pending entry was passed and deleted): it
    // takes a new one, at the back, once what is left of the old one is gone.
    if (standing.lost || place.waitLease === undefined) return this.startOver(place, ttlMs, what);
    const lines = standing.lines;
    const mismatched = lines.findIndex((line) => 'mismatch' in line);
    if (mismatched >= 0) return this.refuse(place, mismatched, (lines[mismatched] as { mismatch: number }).mismatch, what);
    const blocked = lines.findIndex((line) => !line.in);
    // Waiting up to the first line that keeps it out and pending after it; waiting everywhere to
    // take the keys. (What is ahead does not depend on its own entries: the look stays good.)
    const pendingFrom = blocked >= 0 ? blocked + 1 : place.keys.length;
    if (pendingFrom !== place.pendingFrom && !(await this.repend(place, pendingFrom, what))) return this.startOver(place, ttlMs, what);
    place.untilHeld = undefined;
    if (blocked >= 0) {
      const { waitFor, untilHeld } = lines[blocked] as { waitFor: Buffer[]; untilHeld?: UntilHeld };
      // Kept out only by entries ahead in its last line that do not hold yet: their holding lets it in.
      if (untilHeld && blocked === lines.length - 1)
        place.untilHeld = {
          notHeld: untilHeld.notHeld,
          pending: [...lines.flatMap((line) => (line.in ? line.pending : [])), ...untilHeld.pending],
        };
      this.places.stand(place, waitFor, standing.readRevision, untilHeld !== undefined);
      return { acquired: false };
    }
    if (steps >= MAX_STEPS) return { acquired: false };
    return this.take(
      place,
      ttlMs,
      what,
      steps + 1,
      lines.flatMap((line) => (line.in ? line.pending : [])),
    );
  }

  /**
   * Sets its entries pending from `to` on. False when they are not as it left them: a pending one
   * was deleted by a caller that entered its key past it (whose token is greater than this one's,
   * so this one may no longer enter there after it), or its place is gone.
   */
  private async repend(place: Place, to: number, what: Operation): Promise<boolean> {
    const response = await this.connection.txn(this.line.repend(EtcdPlaces.request(place), to, place.waitLease!), what);
    if (response.succeeded) place.pendingFrom = to;
    return response.succeeded;
  }

  /** It leaves every line and takes a new place, at the back, with a new token. */
  private async startOver(place: Place, ttlMs: number, what: Operation): Promise<AcquireResult> {
    await this.connection.txn(this.line.deletePlaced(place.keys, place.owner, place.revision!), what);
    this.places.drop(place);
    return this.firstAttempt(place, ttlMs, true, what);
  }

  /** Its limit disagrees with the key's: it leaves every line, and is told. */
  private async refuse(place: Place, index: number, limit: number, what: Operation): Promise<AcquireResult> {
    await this.connection.txn(this.line.deletePlaced(place.keys, place.owner, place.revision!), what);
    this.places.drop(place);
    return { acquired: false, limitMismatch: { key: place.keys[index], limit } };
  }

  /**
   * In on every line of its keys: its entries go onto its hold lease, marked held, while a
   * keepalive restarts that lease, unless what is certainly left of it is nearly the whole ttl
   * (FRESH_HOLD): the validity reported is then what is left, counted from the last restart.
   */
  private async take(
    place: Place,
    ttlMs: number,
    what: Operation,
    steps: number,
    pending: readonly IKeyValue[] | undefined,
    retried = false,
    held: readonly IKeyValue[] = [],
  ): Promise<AcquireResult> {
    const started = performance.now();
    if (place.hold.lost) this.places.replaceHold(place, await this.grant(place.hold.seconds, what));
    const hold = place.hold;
    const request = EtcdPlaces.request(place);
    // It takes the keys now. Kept before the answer: when it is lost, what settle() finds held was put by this.
    place.identity = identityValue(place.who, Date.now());
    const left = (): number => leaseLeft(hold, started);
    const fresh = left() >= ttlMs * FRESH_HOLD;
    let response, kept;
    try {
      [response, kept] = await Promise.all([
        this.connection.txn(this.line.promote(request, place.identity, hold.id, pending, held), what),
        fresh ? false : this.connection.keepAlive(hold.id, what).catch(() => false),
      ]);
    } catch (error) {
      if (this.connection.isLeaseGone(error) && !retried) {
        hold.lost = true;
        return this.take(place, ttlMs, what, steps, pending, true, held);
      }
      this.places.unanswered(place);
      throw error;
    }
    if (!response.succeeded) return this.decide(place, standing(response, request, hold.id), ttlMs, what, steps);
    if (this.places.get(place.owner) !== place) {
      // Released while the attempt was out: nobody wants the lock it won.
      this.connection.revokeQuietly(hold.id, what);
      return { acquired: false };
    }
    this.places.promoted(place, place.revision!);
    // The keepalive sent with it restarted the lease; without one (fresh) or its answer, the last one counts.
    const validityMs = kept ? ttlMs : Math.max(0, Math.min(ttlMs, left()));
    return { acquired: true, fencingToken: place.revision, validityMs };
  }

  /**
   * A lock a release handed over (etcd.handover.ts), taken by its owner: valid for as long as the
   * waiter lease it sits on certainly lives. With nothing certainly left of that, it moves onto
   * its own lease first, as its first extension would.
   */
  async handedLock(place: Place, ttlMs: number, what: Operation): Promise<AcquireResult> {
    const validityMs = this.places.handedValidity(place, ttlMs);
    if (validityMs > 0) return { acquired: true, fencingToken: place.revision, validityMs };
    const moved = await this.moveHanded(place, what);
    if (!moved) return { acquired: false };
    return { acquired: true, fencingToken: place.revision, validityMs: moved.validityMs(ttlMs) };
  }

  /**
   * A lock handed over goes from the waiter lease onto its owner's hold lease, marked held as if
   * it had taken the key itself, with a keepalive of that lease beside it; who asks moves with it,
   * now saying when the owner took the key. Undefined when the lock is gone (the waiter lease ran
   * out): the place is dropped. Rejects when etcd did not answer: the move may land later, and the
   * next extension or the release finds out (both take the entry wherever it is).
   */
  async moveHanded(place: Place, what: Operation): Promise<{ validityMs: (ttlMs: number) => number } | undefined> {
    const from = place.waitLease;
    const hold = place.hold;
    if (from === undefined) return this.lostHanded(place, what);
    const identity = identityValue(place.who, Date.now());
    const started = performance.now();
    const move = this.line.moveLease(place.keys, place.owner, [entryValue('held', 1)], [identity], from, hold.id);
    let response, kept;
    try {
      [response, kept] = await Promise.all([this.connection.txn(move, what), this.connection.keepAlive(hold.id, what).catch(() => false)]);
    } catch (error) {
      if (!this.connection.isLeaseGone(error)) throw error;
      // Its hold lease ran out: the lock stays on the waiter lease, and goes.
      return this.lostHanded(place, what);
    }
    if (!this.line.moved(response, hold.id)) return this.lostHanded(place, what);
    place.identity = identity;
    if (kept) hold.aliveSince = Math.max(hold.aliveSince, started);
    this.places.moved(place);
    return { validityMs: (ttlMs) => Math.max(0, Math.min(ttlMs, leaseLeft(hold, started))) };
  }

  /** A lock handed over that its owner no longer has: whatever is left of it goes. */
  private async lostHanded(place: Place, what: Operation): Promise<undefined> {
    this.places.drop(place);
    this.connection.revokeQuietly(place.hold.id, what);
    await this.connection.txn(this.line.deleteRevision(place.keys[0], place.owner, place.revision!), what).catch(() => undefined);
    return undefined;
  }

  /**
   * An owner whose last request went unanswered: reads its entries to learn what that request
   * did. Held on its hold lease: it won. On the waiter lease: it waits, or a release handed it the
   * key. Neither: it starts over.
   */
  async settle(place: Place, what: Operation): Promise<Place | undefined> {
    // An earlier settle's revoke of the hold lease went unanswered: it may still land and take the
    // keys on that lease, so nothing on it may count as won. It goes again first.
    if (place.revokeOut) await this.revokeHold(place, what);
    const entries = this.line.ownEntriesOf(await this.connection.txn(this.line.ownEntries(place.keys, place.owner), what));
    const [first] = entries;
    const whole =
      first !== undefined && entries.every((kv) => kv && kv.create_revision === first.create_revision && kv.lease === first.lease);
    const revision = Number(first?.create_revision);
    if (whole && first.lease === place.hold.id && isHeldValue(first.value)) {
      this.places.promoted(place, revision);
      return place;
    }
    if (whole && first.lease === place.waitLease && isHandedValue(first.value)) {
      return this.places.handed(place, revision, false) ? place : undefined;
    }
    if (whole && first.lease === place.waitLease) {
      const pendingFrom = entries.findIndex((kv) => isPendingValue(kv!.value));
      this.places.settledWaiting(place, revision, pendingFrom < 0 ? place.keys.length : pendingFrom);
      return place;
    }
    // Its request may still land while its hold lease exists: it starts over once that lease is
    // gone (an entry that landed on the waiter lease meanwhile is kept by the next attempt).
    await this.revokeHold(place, what);
    if (entries.some(Boolean)) await this.connection.txn(this.line.deleteOwn(place.keys, place.owner), what);
    this.places.drop(place);
    return undefined;
  }

  /** Revokes the hold lease of an owner whose request went unanswered; until answered, `revokeOut` says it may land later. */
  private async revokeHold(place: Place, what: Operation): Promise<void> {
    place.revokeOut = true;
    await this.connection.revoke(place.hold.id, what);
    place.revokeOut = false;
  }

  /**
   * Restarts a holder's lease and checks, at the same time, that its entries are still on it, as
   * it left them: a keepalive alone would keep a lease whose keys were deleted (by hand, or by a
   * request of its own that landed late) and tell the holder nothing. When not, it is dropped, and
   * its lease revoked with whatever is left on it (a key deleted by hand and its other keys not).
   */
  async renew(place: Place, what: Operation): Promise<boolean> {
    const sentAt = performance.now();
    const [kept, response] = await Promise.all([
      this.connection.keepAlive(place.hold.id, what),
      this.connection.txn(this.line.ownEntries(place.keys, place.owner), what),
    ]);
    const intact = this.line
      .ownEntriesOf(response)
      .every((kv) => kv && isHeldValue(kv.value) && kv.lease === place.hold.id && Number(kv.create_revision) === place.revision);
    // Alive until at least then plus its ttl: what a spare made of it counts from (etcd.spare-leases.ts).
    if (kept) place.hold.aliveSince = Math.max(place.hold.aliveSince, sentAt);
    if (kept && intact) return true;
    this.places.drop(place);
    if (kept) this.connection.revokeQuietly(place.hold.id, what);
    return false;
  }

  async grant(seconds: number, what: Operation): Promise<HoldLease> {
    const aliveSince = performance.now();
    const { id, ttl } = await this.connection.grant(seconds, what);
    return { id, seconds, ttl, aliveSince };
  }

  /** A released lock's lease that holds nothing any more: kept as a spare (etcd.spare-leases.ts). */
  giveBack(lease: HoldLease): void {
    this.spares.giveBack(lease);
  }

  /** Revokes the spare leases (at shutdown). */
  close(): Promise<void> {
    return this.spares.close();
  }
}

/** What is certainly left of a lease at `at` (performance.now()): counted from its grant or its last keepalive answered. */
function leaseLeft(hold: HoldLease, at: number): number {
  return hold.aliveSince + hold.ttl * 1000 - at;
}
