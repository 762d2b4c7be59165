import type { ICompare, IKeyValue, IRequestOp, ITxnRequest, ITxnResponse } from 'etcd3';
import { HELD, WAITING, type EtcdKeys } from './etcd.keys.js';

/** Where a waiter stands: its revision, and the entry just ahead of it in each line where it is not first. */
export interface Standing {
  /** Its entries are gone (its lease ran out, or they were deleted): it has no place any more. */
  lost: boolean;
  /** Its entries are held on its own lease already: it has the keys. */
  won?: boolean;
  /** Ahead of it, by line (lock key); empty when it is first in every line. */
  predecessors: Map<string, Buffer>;
  /** The revision the lines were read at: watches start after it. */
  readRevision: number;
}

/**
 * The transactions of the etcd lock recipe. One acquisition puts one entry per key, all in one
 * transaction, so they share one create revision: it orders the lines and is the fencing token.
 * An entry is first in its line when no entry of that line has a smaller create revision; a
 * request first in every line of its keys holds them. Two requests on overlapping keys are
 * ordered the same way in every line they share, so they never wait for each other.
 */
export class EtcdLine {
  constructor(private readonly keys: EtcdKeys) {}

  /**
   * The first attempt: when every line is empty, the entries go on the holder's lease as held.
   * Otherwise, for a caller that waits, they go on the waiter lease as waiting, and each line's
   * two newest entries are read: the waiter's own and the one just ahead of it.
   *
   * Either way the transaction puts a key on the holder's lease (the entries, or the anchor), and
   * etcd refuses a transaction that names a lease it no longer has: once that lease is revoked, an
   * attempt whose answer was lost can no longer land. Without the anchor it could put its waiting
   * entries on the waiter lease after its owner had started over and won (turning the holder's
   * entry into a waiter's, on a lease the holder does not keep), or after its owner gave up.
   */
  firstAttempt(keys: readonly string[], owner: string, holdLease: string, waitLease: string | undefined): ITxnRequest {
    return {
      compare: keys.map((key) => ({ ...this.keys.line(key), target: 'Create', result: 'Equal', create_revision: 0 })),
      success: keys.map((key) => this.put(key, owner, HELD, holdLease)),
      failure:
        waitLease === undefined
          ? []
          : [
              ...keys.map((key): IRequestOp => ({
                request_put: { ...this.put(key, owner, WAITING, waitLease).request_put, prev_kv: true },
              })),
              ...keys.map((key): IRequestOp => ({
                request_range: { ...this.keys.line(key), sort_target: 'Create', sort_order: 'Descend', limit: 2, keys_only: true },
              })),
              { request_put: { key: this.keys.anchor(owner), value: WAITING, lease: holdLease } },
            ],
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

  /** Where a waiter placed by `firstAttempt` stands, from that transaction's answer. */
  standingAfterFirst(response: ITxnResponse, keys: readonly string[], owner: string, revision: number): Standing | undefined {
    const predecessors = new Map<string, Buffer>();
    for (const [i, key] of keys.entries()) {
      const kvs = response.responses[keys.length + i].response_range.kvs;
      const ahead = kvs.filter((kv) => Number(kv.create_revision) < revision);
      // It had an entry before this attempt, and newer entries crowd the two read: read again.
      if (ahead.length === 0 && kvs.some((kv) => Number(kv.create_revision) > revision)) return undefined;
      if (ahead.length > 0 && this.keys.ownerOf(ahead[0].key) !== owner) predecessors.set(key, ahead[0].key);
    }
    return { lost: false, predecessors, readRevision: Number(response.header.revision) };
  }

  /**
   * A waiter's next attempt: it holds the keys when its entries are still there, still waiting,
   * and first in every line; then, given `holdLease`, they go onto it, marked held. Otherwise the
   * answer says where it stands (see standing()). "Still waiting" keeps an attempt whose answer
   * was lost from landing after its owner took the keys and moved them to another lease: it would
   * put them back on the lease that move revokes.
   */
  nextAttempt(keys: readonly string[], owner: string, revision: number, holdLease: string | undefined): ITxnRequest {
    return {
      compare: this.firstInEveryLine(keys, owner, revision),
      // Its anchor has served: the first attempt it guarded landed long ago.
      success:
        holdLease === undefined
          ? []
          : [...keys.map((key) => this.put(key, owner, HELD, holdLease)), { request_delete_range: { key: this.keys.anchor(owner) } }],
      failure: this.standingReads(keys, owner, revision),
    };
  }

  /**
   * Where the waiter stands, from the failure branch of nextAttempt(). Its entries already held
   * on `holdLease`: an earlier attempt of its own, whose answer was lost, took the keys.
   */
  standing(response: ITxnResponse, keys: readonly string[], holdLease: string): Standing {
    const own = response.responses.slice(0, keys.length).map((r) => r.response_range.kvs[0]);
    const predecessors = new Map<string, Buffer>();
    for (const [i, key] of keys.entries()) {
      const [ahead] = response.responses[keys.length + i].response_range.kvs;
      if (ahead) predecessors.set(key, ahead.key);
    }
    const won = own.every((kv) => kv?.value.equals(HELD) && kv.lease === holdLease);
    return { lost: own.some((kv) => kv === undefined), won, predecessors, readRevision: Number(response.header.revision) };
  }

  /** Reads the owner's entries (one per key, in order; undefined where there is none). */
  ownEntries(keys: readonly string[], owner: string): ITxnRequest {
    return { success: keys.map((key) => ({ request_range: { key: this.keys.entry(key, owner) } })) };
  }

  ownEntriesOf(response: ITxnResponse): (IKeyValue | undefined)[] {
    return response.responses.map((r) => r.response_range.kvs[0]);
  }

  /** Deletes the owner's entries, answering what they were. */
  deleteOwn(keys: readonly string[], owner: string): ITxnRequest {
    return { success: keys.map((key) => ({ request_delete_range: { key: this.keys.entry(key, owner), prev_kv: true } })) };
  }

  /**
   * Deletes the owner's entry of `key` only while it is a waiter's: a deletion sent again for a
   * waiter whose release failed (see FailedReleases) may land after its owner asked again and took
   * the key, and must leave that lock alone.
   */
  deleteWaiting(key: string, owner: string): ITxnRequest {
    const entry = this.keys.entry(key, owner);
    return {
      compare: [{ key: entry, target: 'Value', result: 'Equal', value: WAITING }],
      success: [{ request_delete_range: { key: entry } }],
    };
  }

  deletedOf(response: ITxnResponse): IKeyValue[] {
    return response.responses.flatMap((r) => r.response_delete_range.prev_kvs);
  }

  /**
   * Moves held entries from one lease to another (a different ttl), if they are still on the
   * first; otherwise reads them, so that a move applied twice (a client that retried it) is seen
   * as done (see moved()).
   */
  moveLease(keys: readonly string[], owner: string, from: string, to: string): ITxnRequest {
    return {
      compare: keys.map((key) => ({ key: this.keys.entry(key, owner), target: 'Lease', result: 'Equal', lease: from })),
      success: keys.map((key) => this.put(key, owner, HELD, to)),
      failure: this.ownEntries(keys, owner).success,
    };
  }

  /** Whether the entries are on lease `to` after moveLease(): moved by it, or by an earlier copy of it. */
  moved(response: ITxnResponse, to: string): boolean {
    return response.succeeded || this.ownEntriesOf(response).every((kv) => kv?.value.equals(HELD) && kv.lease === to);
  }

  /** The first entry of a key's line. */
  head(key: string): ITxnRequest {
    return { success: [{ request_range: { ...this.keys.line(key), sort_target: 'Create', sort_order: 'Ascend', limit: 1 } }] };
  }

  private put(key: string, owner: string, value: Buffer, lease: string): IRequestOp {
    return { request_put: { key: this.keys.entry(key, owner), value, lease } };
  }

  /**
   * Its entries still exist with its revision (the waiter lease did not run out), marked waiting,
   * and no entry of any of its lines is older.
   */
  private firstInEveryLine(keys: readonly string[], owner: string, revision: number): ICompare[] {
    return [
      ...keys.map((key): ICompare => ({ key: this.keys.entry(key, owner), target: 'Create', result: 'Equal', create_revision: revision })),
      ...keys.map((key): ICompare => ({ key: this.keys.entry(key, owner), target: 'Value', result: 'Equal', value: WAITING })),
      ...keys.map((key): ICompare => ({ ...this.keys.line(key), target: 'Create', result: 'Greater', create_revision: revision - 1 })),
    ];
  }

  /** Its own entries, and in each line the newest entry older than it. */
  private standingReads(keys: readonly string[], owner: string, revision: number): IRequestOp[] {
    return [
      ...keys.map((key): IRequestOp => ({ request_range: { key: this.keys.entry(key, owner) } })),
      ...keys.map((key): IRequestOp => ({
        request_range: {
          ...this.keys.line(key),
          max_create_revision: revision - 1,
          sort_target: 'Create',
          sort_order: 'Descend',
          limit: 1,
          keys_only: true,
        },
      })),
    ];
  }
}
