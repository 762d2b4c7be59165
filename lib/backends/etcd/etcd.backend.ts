import { inspect } from 'node:util';
import { identityBytes } from '../../lock-identity.js';
import type {
  AcquireResult,
  BackendHealth,
  ExtendResult,
  LockBackend,
  LockListOptions,
  LockListPage,
  LockState,
  TryAcquireOptions,
} from '../lock-backend.interface.js';
import { EtcdAccess } from './etcd.access.js';
import { EtcdAdmission } from './etcd.admission.js';
import { EtcdConnection, type Operation } from './etcd.connection.js';
import { inspectEtcd } from './etcd.inspection.js';
import { EtcdHandover } from './etcd.handover.js';
import { entryValue, isHandedValue, isHeldValue } from './etcd.kinds.js';
import { EtcdKeys } from './etcd.keys.js';
import { EtcdLine } from './etcd.line.js';
import { listEtcd } from './etcd.listing.js';
import {
  checkConnection,
  leaseSeconds,
  resolveBackendOptions,
  type EtcdLockBackendOptions,
  type EtcdLockConnection,
} from './etcd.options.js';
import { EtcdPlaces, type Place } from './etcd.places.js';
import { EtcdReleases } from './etcd.releases.js';

/**
 * Locks in etcd, through the `etcd3` client. Each acquisition gets a lease of its own and puts one
 * entry per key, `<prefix><key>/<owner>`, in one transaction: the entries share one create
 * revision, which is the fencing token (strictly increasing across the cluster) and the order of
 * the line of every key. A request first in every line of its keys holds them; the others wait,
 * each watching only the entry just ahead of it (fair and herd-free). Extending is a keepalive of
 * the lease, releasing revokes it, and a holder that dies loses its keys when the lease runs out.
 * Who asks sits beside each entry, on the same lease (etcd.identity.ts).
 *
 * Exclusive as long as etcd keeps a quorum: a minority of members may be lost, partitioned or
 * restarted without a second holder, since every step is a Raft write or a linearizable read.
 */
export class EtcdLockBackend implements LockBackend {
  readonly name = 'etcd';
  readonly fencing = true;
  readonly sharedHolders = true;
  readonly storesIdentity = true;

  private readonly connection: EtcdConnection;
  private readonly line: EtcdLine;
  private readonly keys: EtcdKeys;
  private readonly places: EtcdPlaces;
  private readonly admission: EtcdAdmission;
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
    const handover = new EtcdHandover(this.connection, this.keys);
    this.places = new EtcdPlaces(this.connection, handover, leaseSeconds(resolved.waiterTimeout), resolved.commandTimeout);
    this.access = new EtcdAccess(this.connection, resolved.prefix);
    this.admission = new EtcdAdmission(this.connection, this.line, this.places);
    this.releases = new EtcdReleases(
      this.connection,
      this.line,
      this.places,
      handover,
      (lease) => this.admission.giveBack(lease),
      resolved.waiterTimeout,
    );
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    if (this.connection.closed) throw this.connection.closedError('acquire', keys);
    // Checked first: names too long are refused before anything is made.
    const who = identityBytes(options?.holder, this.name);
    const what = { op: 'acquire', keys };
    // Deleting them later would take this request's own place.
    this.releases.forget(owner);
    let place = this.places.get(owner);
    if (place?.state === 'unknown') place = await this.admission.settle(place, what);
    if (place?.state === 'held' && place.handed) return this.admission.handedLock(place, ttlMs, what);
    if (place?.state === 'held') {
      // Its own lock already (an earlier attempt won after it was reported as failed): a
      // keepalive restarts the lease, so it is valid from this attempt on.
      if (await this.admission.renew(place, what)) return { acquired: true, fencingToken: place.revision, validityMs: ttlMs };
      place = undefined;
    }
    if (place) return this.admission.nextAttempt(place, ttlMs, what);
    const limits = keys.map((_, i) => options?.limits?.[i] ?? 1);
    return this.admission.firstAttempt({ keys, owner, limits, who }, ttlMs, options?.willWait ?? true, what);
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    // Counted while out: a release beside it then revokes the lease instead of keeping it for
    // another lock, which this extension would revoke in turn if it finds the keys gone.
    const counted = this.places.get(owner);
    if (counted) counted.extending = (counted.extending ?? 0) + 1;
    try {
      return await this.extendOwner(keys, owner, ttlMs);
    } finally {
      if (counted) counted.extending! -= 1;
    }
  }

  private async extendOwner(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const what = { op: 'extend', keys };
    let place = this.places.get(owner);
    if (place?.state === 'unknown') place = await this.admission.settle(place, what);
    if (!place) return this.extendUnknown(keys, owner, ttlMs, what);
    if (place.state !== 'held') return { extended: false };
    if (place.handed) {
      // Handed over on release, the lock is on the waiter lease: it moves onto its own lease now.
      // When a move to a lease of another ttl follows, a release meanwhile deletes the entry
      // wherever it is (see below), from now on.
      const another = leaseSeconds(ttlMs) !== place.hold.seconds;
      if (another) place.moving = true;
      const moved = await this.admission.moveHanded(place, what);
      if (!moved || this.places.get(owner) !== place) return { extended: false };
      if (!another) return { extended: true, validityMs: moved.validityMs(ttlMs) };
    }
    if (place.movingTo !== undefined && !(await this.settleMove(place, what))) {
      this.places.drop(place);
      return { extended: false };
    }
    const seconds = leaseSeconds(ttlMs);
    if (seconds === place.hold.seconds)
      return (await this.admission.renew(place, what)) ? { extended: true, validityMs: ttlMs } : { extended: false };
    // Another ttl needs another lease: the entries move to a new one in one transaction (their
    // create revision, the token, stays), and the old one is revoked.
    const from = place.hold;
    // From here until the move is settled, a release deletes the entries wherever they are: a
    // revoke of the old lease alone would miss them if the move reached etcd first.
    place.moving = true;
    const to = await this.admission.grant(seconds, what).catch((error: unknown) => {
      place.moving = false;
      throw error;
    });
    place.movingTo = to;
    // Unanswered, it may have been applied: the next extend or the release finds out (movingTo stays).
    const values = place.limits.map((limit) => entryValue('held', limit));
    const move = this.line.moveLease(
      place.keys,
      owner,
      values,
      place.keys.map(() => place.identity),
      from.id,
      to.id,
    );
    const moved = this.line.moved(await this.connection.txn(move, what), to.id);
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
    return inspectEtcd(this.connection, this.line, this.keys, key);
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

  /** Stops watches and the waiter lease (its places leave their lines), revokes the spare leases, and closes the client if the backend created it. */
  async close(): Promise<void> {
    if (!this.connection.stop()) return;
    // The waiter lease goes with the places, and every entry on it.
    this.releases.close();
    await Promise.all([this.places.close(), this.admission.close()]);
    // Those sent in the background, by releases and attempts that gave up, too.
    await this.connection.revokesAnswered();
    this.connection.closeClient();
  }

  /** What logs show of the backend: its prefix, not its connection settings (they may hold a password) nor owners. */
  toJSON(): { name: string; prefix: string; commandTimeout: number } {
    return { name: this.name, prefix: this.prefix, commandTimeout: this.commandTimeout };
  }

  [inspect.custom](depth: number, options: object): string {
    return `EtcdLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
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
   * Extending for an owner this client did not acquire for: its entries say which lease, if held,
   * and move with who it is (read with them, where it is on the same lease).
   */
  private async extendUnknown(keys: readonly string[], owner: string, ttlMs: number, what: Operation): Promise<ExtendResult> {
    const read = this.line.ownEntriesOf(await this.connection.txn(this.line.ownEntriesAndIdentities(keys, owner), what));
    const entries = read.slice(0, keys.length);
    const [first] = entries;
    if (!first || !entries.every((kv) => kv && isHeldValue(kv.value) && kv.lease === first.lease)) return { extended: false };
    const identities = read.slice(keys.length).map((kv) => (kv?.lease === first.lease ? kv.value : undefined));
    const next = await this.admission.grant(leaseSeconds(ttlMs), what);
    // A lock handed over sits on its owner's waiter lease (etcd.handover.ts): it moves like the
    // others, marked held as usual, but that lease stays, for the owner's other places.
    const handed = isHandedValue(first.value);
    const values = entries.map((kv) => (isHandedValue(kv!.value) ? entryValue('held', 1) : kv!.value));
    const move = this.line.moveLease(keys, owner, values, identities, first.lease, next.id);
    const moved = this.line.moved(await this.connection.txn(move, what), next.id);
    if (!moved || !handed) this.connection.revokeQuietly(moved ? first.lease : next.id, what);
    return moved ? { extended: true, validityMs: ttlMs } : { extended: false };
  }
}
