import type { ICompare, IKeyValue, IRequestOp, ITxnRequest, ITxnResponse } from 'etcd3';
import { entryValue, HANDED, isHeldValue, parseValue, waitingValue } from './etcd.kinds.js';
import type { EtcdKeys } from './etcd.keys.js';

/** One acquisition's entries, as the transactions need them. */
export interface LineRequest {
  readonly keys: readonly string[];
  readonly owner: string;
  /** How many holders each key admits (TryAcquireOptions.limits). */
  readonly limits: readonly number[];
  /** The create revision of its entries: place in every line, and fencing token. */
  readonly revision: number;
  /** Its entries from this index on are pending (keys.length: none is). */
  readonly pendingFrom: number;
}

/**
 * The transactions of the etcd lock recipe. An acquisition puts one entry per key, all in one
 * transaction, so they share one create revision: it orders the lines and is the fencing token.
 * Who is in follows from the entries ahead (etcd.kinds.ts); an exclusive caller is in when first.
 * Two requests on overlapping keys are ordered the same way in every line they share.
 *
 * Each transaction that puts an entry onto a lease puts its identity key (etcd.identity.ts) onto
 * the same lease, and each one that deletes an entry deletes its identity key: in the same
 * request, so who asks costs no request of its own.
 */
export class EtcdLine {
  constructor(private readonly keys: EtcdKeys) {}

  /**
   * The first attempt: when every line is empty, the entries go on the holder's lease as held.
   * Otherwise, for a caller that waits, they go on the waiter lease as waiting, and every line is
   * read. A caller that does not wait reads the lines and puts nothing (it may still enter: beside
   * readers or permit holders, or ahead of pending entries).
   *
   * Either way a waiting caller's transaction puts a key on the holder's lease (the entries, or the
   * anchor), and etcd refuses a transaction that names a lease it no longer has: once that lease
   * is revoked, an attempt whose answer was lost can no longer land. Without the anchor it could
   * put its waiting entries on the waiter lease after its owner had started over and won (turning
   * the holder's entry into a waiter's, on a lease the holder does not keep), or after it gave up.
   */
  firstAttempt(
    keys: readonly string[],
    owner: string,
    limits: readonly number[],
    identity: Buffer,
    holdLease: string,
    waitLease?: string,
  ): ITxnRequest {
    const reads = keys.map((key) => this.lineRead(key));
    const failure: IRequestOp[] =
      waitLease === undefined
        ? reads
        : [
            ...keys.map((key, i): IRequestOp => ({
              request_put: { key: this.keys.entry(key, owner), value: waitingValue(limits, i), lease: waitLease, prev_kv: true },
            })),
            ...reads,
            { request_put: { key: this.keys.anchor(owner), value: entryValue('waiting', 1), lease: holdLease } },
            ...this.putIdentities(keys, owner, identity, waitLease),
          ];
    return {
      compare: keys.map((key) => ({ ...this.keys.line(key), target: 'Create', result: 'Equal', create_revision: 0 })),
      success: [
        ...keys.map((key, i) => this.put(key, owner, entryValue('held', limits[i]), holdLease)),
        ...this.putIdentities(keys, owner, identity, holdLease),
      ],
      failure,
    };
  }

  /** The waiter's revision after a failed first attempt (an entry it already had keeps its own). */
  placedRevision(response: ITxnResponse, keys: readonly string[]): number {
    const previous = response.responses
      .slice(0, keys.length)
      .map((r) => r.response_put.prev_kv)
      .find((kv) => kv);
    return Number(previous ? previous.create_revision : response.header.revision);
  }

  /**
   * Puts a caller that does not wait in every line as a holder, if nothing came into them since
   * they were read at `readRevision` (entries that left meanwhile only make room), deleting the
   * pending entries ahead if they are still pending. Otherwise reads its own entries: a copy of
   * this request applied before (a client that retried it) may have put them.
   */
  enterAtEnd(
    keys: readonly string[],
    owner: string,
    limits: readonly number[],
    identity: Buffer,
    holdLease: string,
    readRevision: number,
    pending: readonly IKeyValue[],
  ): ITxnRequest {
    return {
      compare: [
        ...keys.map((key): ICompare => ({ ...this.keys.line(key), target: 'Create', result: 'Less', create_revision: readRevision + 1 })),
        ...this.stillPending(pending),
      ],
      success: [
        ...keys.map((key, i) => this.put(key, owner, entryValue('held', limits[i]), holdLease)),
        ...this.putIdentities(keys, owner, identity, holdLease),
        ...this.deletes(pending),
      ],
      failure: this.ownEntries(keys, owner).success,
    };
  }

  /**
   * Reads where a waiter stands: its own entries, and what is ahead of each. When it has an
   * exclusive entry in every line of its keys, it holds them if it is first in every one (the
   * transaction succeeds, and reads nothing).
   */
  check(request: LineRequest): ITxnRequest {
    const reads = this.standingReads(request);
    if (!this.exclusiveEverywhere(request)) return { success: reads };
    return { compare: this.firstInEveryLine(request), success: [], failure: reads };
  }

  /** Whether `check` can tell "first in every line" by its compare (an exclusive entry in every line). */
  exclusiveEverywhere(request: LineRequest): boolean {
    return request.pendingFrom === request.keys.length && request.limits.every((limit) => limit === 1);
  }

  /**
   * A waiter that is in on every line of its keys takes them: its entries, still there, still
   * waiting, go onto `holdLease`, marked held, and the pending entries ahead of it (`pending`,
   * read by its last look) are deleted if still pending. Without a look (`pending` undefined: its
   * watches said every exclusive line is clear), it is checked first in its lines; after one,
   * nothing more is needed: who is in only grows, as nobody can come in ahead. "Still waiting"
   * keeps an attempt whose answer was lost from landing after its owner took the keys and moved
   * them to another lease: it would put them back on the lease that move revokes. Its identity
   * keys go onto `holdLease` with them, now saying when it took the keys. `held`: entries ahead
   * that did not hold at its last look, and must hold now (a reader let in once they do).
   */
  promote(
    request: LineRequest,
    identity: Buffer,
    holdLease: string,
    pending: readonly IKeyValue[] | undefined,
    held: readonly IKeyValue[] = [],
  ): ITxnRequest {
    const { keys, owner, limits } = request;
    return {
      compare:
        pending === undefined
          ? this.firstInEveryLine(request)
          : [...this.ownEntriesAsPlaced(request), ...this.stillPending(pending), ...this.nowHeld(held)],
      // Its anchor has served: the first attempt it guarded landed long ago.
      success: [
        ...keys.map((key, i) => this.put(key, owner, entryValue('held', limits[i]), holdLease)),
        ...this.putIdentities(keys, owner, identity, holdLease),
        { request_delete_range: { key: this.keys.anchor(owner) } },
        ...this.deletes(pending ?? []),
      ],
      failure: this.standingReads(request),
    };
  }

  /**
   * Sets the waiter's entries pending from `to` on, and waiting before it (they keep their place
   * and token either way; pending ones keep nobody out): only while they are as it left them.
   */
  repend(request: LineRequest, to: number, waitLease: string): ITxnRequest {
    const { keys, owner, limits, pendingFrom } = request;
    const changed = keys.flatMap((key, i) => (i < pendingFrom === i < to ? [] : [i]));
    return {
      compare: this.ownEntriesAsPlaced(request),
      success: changed.map((i) => this.put(keys[i], owner, waitingValue(limits, i, i < to ? 'waiting' : 'pending'), waitLease)),
    };
  }

  /** Reads the owner's entries (one per key, in order; undefined where there is none). */
  ownEntries(keys: readonly string[], owner: string): ITxnRequest {
    return { success: keys.map((key) => ({ request_range: { key: this.keys.entry(key, owner) } })) };
  }

  ownEntriesOf(response: ITxnResponse): (IKeyValue | undefined)[] {
    return response.responses.map((r) => r.response_range.kvs[0]);
  }

  /**
   * Reads the owner's entries, then who it is beside each (one per key, in order; undefined where
   * there is none): ownEntriesOf() of the answer has the entries, then the identity keys.
   */
  ownEntriesAndIdentities(keys: readonly string[], owner: string): ITxnRequest {
    return {
      success: [
        ...this.ownEntries(keys, owner).success!,
        ...keys.map((key): IRequestOp => ({ request_range: { key: this.keys.identity(key, owner) } })),
      ],
    };
  }

  /** Deletes the owner's entries, answering what they were (see deletedOf), and who it is beside them. */
  deleteOwn(keys: readonly string[], owner: string): ITxnRequest {
    return {
      success: [
        ...keys.map((key): IRequestOp => ({ request_delete_range: { key: this.keys.entry(key, owner), prev_kv: true } })),
        ...keys.map((key): IRequestOp => ({ request_delete_range: { key: this.keys.identity(key, owner) } })),
      ],
    };
  }

  /**
   * Deletes the owner's entries of revision `revision` (and who it is beside each), each only while
   * it is of that revision: what is left of a place it gives up. Landing late, after its owner took
   * a new place (a new revision), it leaves that place, or the lock it became, alone.
   */
  deletePlaced(keys: readonly string[], owner: string, revision: number): ITxnRequest {
    return {
      success: keys.map((key): IRequestOp => ({
        request_txn: {
          compare: [{ key: this.keys.entry(key, owner), target: 'Create', result: 'Equal', create_revision: revision }],
          success: [
            { request_delete_range: { key: this.keys.entry(key, owner) } },
            { request_delete_range: { key: this.keys.identity(key, owner) } },
          ],
        },
      })),
    };
  }

  /**
   * Deletes the owner's entry of `key` (and who it is) only while it is a waiter's: a deletion sent again for a
   * waiter whose release failed (see FailedReleases) may land after its owner asked again and took
   * the key, and must leave that lock alone. ("waiting…" and "pending…" sort after "held~",
   * "held…" before it.)
   */
  deleteWaiting(key: string, owner: string): ITxnRequest {
    const entry = this.keys.entry(key, owner);
    return {
      compare: [{ key: entry, target: 'Value', result: 'Greater', value: Buffer.from('held~') }],
      success: [{ request_delete_range: { key: entry } }, { request_delete_range: { key: this.keys.identity(key, owner) } }],
    };
  }

  /**
   * A holder's release that keeps its lease for another lock (etcd.spare-leases.ts): deletes its
   * entries, who it is beside them and its anchor (gone already, unless a request that put it was
   * lost), while its entries are still the ones of its revision on `lease`. Otherwise nothing.
   */
  deleteHeld(keys: readonly string[], owner: string, revision: number, lease: string): ITxnRequest {
    return {
      compare: keys.flatMap((key): ICompare[] => [
        { key: this.keys.entry(key, owner), target: 'Create', result: 'Equal', create_revision: revision },
        { key: this.keys.entry(key, owner), target: 'Lease', result: 'Equal', lease },
      ]),
      success: [
        ...keys.map((key): IRequestOp => ({ request_delete_range: { key: this.keys.entry(key, owner) } })),
        ...keys.map((key): IRequestOp => ({ request_delete_range: { key: this.keys.identity(key, owner) } })),
        { request_delete_range: { key: this.keys.anchor(owner) } },
      ],
    };
  }

  /**
   * Deletes the owner's entry of `key` (and who it is) while it is the one of revision `revision`:
   * a lock handed over (etcd.handover.ts) whose release failed, sent again, leaves alone a later lock
   * of the same owner.
   */
  deleteRevision(key: string, owner: string, revision: number): ITxnRequest {
    const entry = this.keys.entry(key, owner);
    return {
      compare: [{ key: entry, target: 'Create', result: 'Equal', create_revision: revision }],
      success: [{ request_delete_range: { key: entry } }, { request_delete_range: { key: this.keys.identity(key, owner) } }],
    };
  }

  /**
   * Deletes the owner's entry of `key` (and who it is) while it is handed over to it
   * (etcd.handover.ts) on waiter lease `lease`: what a waiter that gave up leaves when a release
   * handed it the key before its own deletion got through. Its owner, asking again, stands on
   * another waiter lease (see EtcdReleases), so a lock it got since is left alone.
   */
  deleteHandedOn(key: string, owner: string, lease: string): ITxnRequest {
    const entry = this.keys.entry(key, owner);
    return {
      compare: [
        { key: entry, target: 'Value', result: 'Equal', value: HANDED },
        { key: entry, target: 'Lease', result: 'Equal', lease },
      ],
      success: [{ request_delete_range: { key: entry } }, { request_delete_range: { key: this.keys.identity(key, owner) } }],
    };
  }

  /** The entries deleteOwn() deleted, as they were (not the identity keys after them). */
  deletedOf(response: ITxnResponse, keys: readonly string[]): IKeyValue[] {
    return response.responses.slice(0, keys.length).flatMap((r) => r.response_delete_range.prev_kvs);
  }

  /**
   * Moves held entries from one lease to another (a different ttl), if they are still on the
   * first, each with its value, and their identity keys with theirs (`identities`, per key; none
   * where undefined: an entry of an earlier release has none); otherwise reads the entries, so that
   * a move applied twice (a client that retried it) is seen as done (see moved()).
   */
  moveLease(
    keys: readonly string[],
    owner: string,
    values: readonly Buffer[],
    identities: readonly (Buffer | undefined)[],
    from: string,
    to: string,
  ): ITxnRequest {
    return {
      compare: keys.map((key) => ({ key: this.keys.entry(key, owner), target: 'Lease', result: 'Equal', lease: from })),
      success: [
        ...keys.map((key, i) => this.put(key, owner, values[i], to)),
        ...keys.flatMap((key, i): IRequestOp[] => {
          const value = identities[i];
          return value ? [{ request_put: { key: this.keys.identity(key, owner), value, lease: to } }] : [];
        }),
      ],
      failure: this.ownEntries(keys, owner).success,
    };
  }

  /** Whether the entries are on lease `to` after moveLease(): moved by it, or by an earlier copy of it. */
  moved(response: ITxnResponse, to: string): boolean {
    return response.succeeded || this.ownEntriesOf(response).every((kv) => kv && isHeldValue(kv.value) && kv.lease === to);
  }

  /** Every entry of a key's line, first first, with its value; then every identity key beside them. */
  wholeLine(key: string): ITxnRequest {
    return { success: [this.lineRead(key), { request_range: this.keys.identities(key) }] };
  }

  private put(key: string, owner: string, value: Buffer, lease: string): IRequestOp {
    return { request_put: { key: this.keys.entry(key, owner), value, lease } };
  }

  private putIdentities(keys: readonly string[], owner: string, value: Buffer, lease: string): IRequestOp[] {
    return keys.map((key) => ({ request_put: { key: this.keys.identity(key, owner), value, lease } }));
  }

  /** Its entries still exist with its revision (the waiter lease did not run out), as it left them (waiting, or pending). */
  private ownEntriesAsPlaced(request: LineRequest): ICompare[] {
    const { keys, owner, limits, revision, pendingFrom } = request;
    return keys.flatMap((key, i): ICompare[] => [
      { key: this.keys.entry(key, owner), target: 'Create', result: 'Equal', create_revision: revision },
      {
        key: this.keys.entry(key, owner),
        target: 'Value',
        result: 'Equal',
        value: waitingValue(limits, i, i < pendingFrom ? 'waiting' : 'pending'),
      },
    ]);
  }

  /** Its own entries as `ownEntriesAsPlaced`, and no entry of any of its lines older. */
  private firstInEveryLine(request: LineRequest): ICompare[] {
    return [
      ...this.ownEntriesAsPlaced(request),
      ...request.keys.map((key): ICompare => ({
        ...this.keys.line(key),
        target: 'Create',
        result: 'Greater',
        create_revision: request.revision - 1,
      })),
    ];
  }

  /** Other callers' pending entries, as read. */
  private stillPending(pending: readonly IKeyValue[]): ICompare[] {
    return pending.flatMap((kv): ICompare[] => [
      { key: kv.key, target: 'Create', result: 'Equal', create_revision: kv.create_revision },
      { key: kv.key, target: 'Value', result: 'Equal', value: kv.value },
    ]);
  }

  /** Other callers' entries, as read (create revision), holding the key now. */
  private nowHeld(entries: readonly IKeyValue[]): ICompare[] {
    return entries.flatMap((kv): ICompare[] => [
      { key: kv.key, target: 'Create', result: 'Equal', create_revision: kv.create_revision },
      { key: kv.key, target: 'Value', result: 'Equal', value: entryValue('held', parseValue(kv.value).limit) },
    ]);
  }

  /** Other callers' entries, and who they are beside them. */
  private deletes(entries: readonly IKeyValue[]): IRequestOp[] {
    return entries.flatMap((kv): IRequestOp[] => [
      { request_delete_range: { key: kv.key } },
      { request_delete_range: { key: this.keys.identityOf(kv.key) } },
    ]);
  }

  /** Its own entries, and every line. */
  private standingReads(request: LineRequest): IRequestOp[] {
    return [
      ...request.keys.map((key): IRequestOp => ({ request_range: { key: this.keys.entry(key, request.owner) } })),
      ...request.keys.map((key) => this.lineRead(key)),
    ];
  }

  /** Every entry of a line, first first, with its value. */
  private lineRead(key: string): IRequestOp {
    return { request_range: { ...this.keys.line(key), sort_target: 'Create', sort_order: 'Ascend' } };
  }
}
