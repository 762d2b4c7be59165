import type { ICompare, IKeyValue, IRequestOp, ITxnRequest, ITxnResponse } from 'etcd3';
import { entryValue, isHeldValue, keyStanding, type KeyStanding } from './etcd.kinds.js';
import type { EtcdKeys } from './etcd.keys.js';

/** One acquisition's entries, as the transactions need them. */
export interface LineRequest {
  readonly keys: readonly string[];
  readonly owner: string;
  /** How many holders each key admits (TryAcquireOptions.limits). */
  readonly limits: readonly number[];
  /** Its fencing token: the create revision of its first entries. */
  readonly revision: number;
  /** How many of its keys (the first ones, in order) have an entry. */
  readonly placed: number;
  /** The create revision of each entry placed. */
  readonly created: readonly number[];
}

/** Where a waiter stands: in each line where it has an entry, from one read of them all. */
export interface Standing {
  /** An entry of its own is gone (its lease ran out, or it was deleted): it has no place any more. */
  lost: boolean;
  /** Its entries are held on its own lease already: it has the keys. */
  won?: boolean;
  /** Per line where it has an entry, in order (absent when not read, or lost). */
  lines: KeyStanding[];
  /** The revision the lines were read at: watches start after it. */
  readRevision: number;
}

/**
 * The transactions of the etcd lock recipe. An acquisition puts one entry per key in one
 * transaction, so they share one create revision: it orders the lines and is the fencing token.
 * Who is in follows from the entries ahead (etcd.kinds.ts); an exclusive caller is in when first.
 * A caller of several keys keeps entries only up to the first line that keeps it out (see
 * etcd.admission.ts), and puts its later ones, with its token in their value, once it is in on
 * the earlier ones, only while those later lines hold nothing newer than its token: every line
 * stays ordered by token, so whoever enters after a holder has a greater one.
 */
export class EtcdLine {
  constructor(private readonly keys: EtcdKeys) {}

  /**
   * The first attempt: when every line is empty, the entries go on the holder's lease as held.
   * Otherwise, for a caller that waits, they go on the waiter lease as waiting, and what is ahead
   * of them in each line is read (for an exclusive lock, the line's two newest entries: its own
   * and the one just ahead). A caller that does not wait reads the lines of a shared lock or a
   * semaphore (it may enter beside their holders) and puts nothing.
   *
   * Either way a waiting caller's transaction puts a key on the holder's lease (the entries, or the
   * anchor), and etcd refuses a transaction that names a lease it no longer has: once that lease
   * is revoked, an attempt whose answer was lost can no longer land. Without the anchor it could
   * put its waiting entries on the waiter lease after its owner had started over and won (turning
   * the holder's entry into a waiter's, on a lease the holder does not keep), or after it gave up.
   */
  firstAttempt(keys: readonly string[], owner: string, limits: readonly number[], holdLease: string, waitLease?: string): ITxnRequest {
    const reads = keys.map((key, i) => this.lineRead(key, limits[i], undefined));
    let failure: IRequestOp[] = [];
    if (waitLease !== undefined) {
      failure = [
        ...keys.map((key, i): IRequestOp => ({
          request_put: { key: this.keys.entry(key, owner), value: entryValue(false, limits[i]), lease: waitLease, prev_kv: true },
        })),
        ...reads,
        { request_put: { key: this.keys.anchor(owner), value: entryValue(false, 1), lease: holdLease } },
      ];
    } else if (limits.some((limit) => limit !== 1)) {
      failure = keys.map((key) => this.lineRead(key, 0, undefined));
    }
    return {
      compare: keys.map((key) => ({ ...this.keys.line(key), target: 'Create', result: 'Equal', create_revision: 0 })),
      success: keys.map((key, i) => this.put(key, owner, entryValue(true, limits[i]), holdLease)),
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
   * Where a waiter placed by `firstAttempt` stands, from that transaction's answer; undefined when
   * the two entries read of an exclusive line do not tell (it had an entry before this attempt,
   * and newer ones crowd them): the next attempt reads again.
   */
  standingAfterFirst(response: ITxnResponse, keys: readonly string[], limits: readonly number[], revision: number): Standing | undefined {
    const lines: KeyStanding[] = [];
    for (let i = 0; i < keys.length; i++) {
      const kvs = response.responses[keys.length + i].response_range.kvs;
      const ahead = this.aheadOf(kvs, limits[i], revision);
      if (limits[i] === 1 && ahead.length === 0 && kvs.some((kv) => Number(kv.create_revision) > revision)) return undefined;
      lines.push(keyStanding(ahead, limits[i]));
    }
    return { lost: false, lines, readRevision: Number(response.header.revision) };
  }

  /** For a caller that does not wait: where it would stand at the end of each line read by `firstAttempt`. */
  standingAtEnd(response: ITxnResponse, limits: readonly number[]): KeyStanding[] {
    return limits.map((limit, i) => keyStanding(response.responses[i].response_range.kvs, limit));
  }

  /**
   * Puts a caller that does not wait in every line as a holder, if nothing came into them since
   * they were read at `readRevision` (entries that left meanwhile only make room). Otherwise
   * reads its own entries: a copy of this request applied before (a client that retried it) may
   * have put them.
   */
  enterAtEnd(keys: readonly string[], owner: string, limits: readonly number[], holdLease: string, readRevision: number): ITxnRequest {
    return {
      compare: keys.map((key) => ({ ...this.keys.line(key), target: 'Create', result: 'Less', create_revision: readRevision + 1 })),
      success: keys.map((key, i) => this.put(key, owner, entryValue(true, limits[i]), holdLease)),
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
    return request.placed === request.keys.length && request.limits.every((limit) => limit === 1);
  }

  /**
   * A waiter that is in on every line of its keys takes them: its entries, still there, still
   * waiting, go onto `holdLease`, marked held. (An exclusive one is checked first in its lines
   * again; other kinds need no check: who is in only grows.) "Still waiting" keeps an attempt
   * whose answer was lost from landing after its owner took the keys and moved them to another
   * lease: it would put them back on the lease that move revokes.
   */
  promote(request: LineRequest, holdLease: string): ITxnRequest {
    const { keys, owner } = request;
    return {
      compare: this.firstInEveryLine(request),
      // Its anchor has served: the first attempt it guarded landed long ago.
      success: [
        ...keys.map((key, i) => this.put(key, owner, this.valueOf(request, i, true), holdLease)),
        { request_delete_range: { key: this.keys.anchor(owner) } },
      ],
      failure: this.standingReads(request),
    };
  }

  /**
   * Where the waiter stands, from the answer of `check` or `promote`. Its entries already held on
   * `holdLease`: an earlier attempt of its own, whose answer was lost, took the keys.
   */
  standing(response: ITxnResponse, request: LineRequest, holdLease: string): Standing {
    const { placed, created, limits } = request;
    const own = response.responses.slice(0, placed).map((r) => r.response_range.kvs[0]);
    const lost = own.some((kv, i) => kv === undefined || Number(kv.create_revision) !== created[i]);
    const won = placed === request.keys.length && own.every((kv) => kv && isHeldValue(kv.value) && kv.lease === holdLease);
    const lines = lost
      ? []
      : own.map((_, i) => keyStanding(this.aheadOf(response.responses[placed + i].response_range.kvs, limits[i], created[i]), limits[i]));
    return { lost, won, lines, readRevision: Number(response.header.revision) };
  }

  /**
   * A caller in on every line it stands in puts its entries in the lines of its remaining keys,
   * waiting, with its token: only while its own are still there, still waiting, and those lines
   * hold no entry newer than its token (see the class comment).
   */
  extend(request: LineRequest, waitLease: string): ITxnRequest {
    const { keys, owner, limits, placed, revision } = request;
    const rest = keys.slice(placed);
    return {
      compare: [
        ...this.ownStillWaiting(request),
        ...rest.map((key): ICompare => ({ ...this.keys.line(key), target: 'Create', result: 'Less', create_revision: revision })),
      ],
      success: rest.map((key, i) => this.put(key, owner, entryValue(false, limits[placed + i], revision), waitLease)),
    };
  }

  /** Deletes the waiter's entries in the lines of `keys[from..]`, where it may stand no longer (see etcd.admission.ts). */
  trim(request: LineRequest, from: number): ITxnRequest {
    const { keys, owner, created } = request;
    const trimmed = keys.slice(from, request.placed);
    return {
      compare: trimmed.map((key, i) => ({
        key: this.keys.entry(key, owner),
        target: 'Create',
        result: 'Equal',
        create_revision: created[from + i],
      })),
      success: trimmed.map((key) => ({ request_delete_range: { key: this.keys.entry(key, owner) } })),
    };
  }

  /** The value of the request's entry of `keys[i]`: its kind, and its token where that is not the entry's create revision. */
  valueOf(request: LineRequest, i: number, held: boolean): Buffer {
    return entryValue(held, request.limits[i], request.created[i] === request.revision ? undefined : request.revision);
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
   * the key, and must leave that lock alone. ("waiting…" sorts after "w", "held…" before it.)
   */
  deleteWaiting(key: string, owner: string): ITxnRequest {
    const entry = this.keys.entry(key, owner);
    return {
      compare: [{ key: entry, target: 'Value', result: 'Greater', value: Buffer.from('w') }],
      success: [{ request_delete_range: { key: entry } }],
    };
  }

  deletedOf(response: ITxnResponse): IKeyValue[] {
    return response.responses.flatMap((r) => r.response_delete_range.prev_kvs);
  }

  /**
   * Moves held entries from one lease to another (a different ttl), if they are still on the
   * first, each with its value; otherwise reads them, so that a move applied twice (a client that
   * retried it) is seen as done (see moved()).
   */
  moveLease(keys: readonly string[], owner: string, values: readonly Buffer[], from: string, to: string): ITxnRequest {
    return {
      compare: keys.map((key) => ({ key: this.keys.entry(key, owner), target: 'Lease', result: 'Equal', lease: from })),
      success: keys.map((key, i) => this.put(key, owner, values[i], to)),
      failure: this.ownEntries(keys, owner).success,
    };
  }

  /** Whether the entries are on lease `to` after moveLease(): moved by it, or by an earlier copy of it. */
  moved(response: ITxnResponse, to: string): boolean {
    return response.succeeded || this.ownEntriesOf(response).every((kv) => kv && isHeldValue(kv.value) && kv.lease === to);
  }

  /** Every entry of a key's line, first first, with its value. */
  wholeLine(key: string): ITxnRequest {
    return { success: [this.lineRead(key, 0, undefined)] };
  }

  private put(key: string, owner: string, value: Buffer, lease: string): IRequestOp {
    return { request_put: { key: this.keys.entry(key, owner), value, lease } };
  }

  /** Its entries still exist with their revisions (the waiter lease did not run out), marked waiting. */
  private ownStillWaiting(request: LineRequest): ICompare[] {
    const { keys, owner, placed, created } = request;
    return keys.slice(0, placed).flatMap((key, i): ICompare[] => [
      { key: this.keys.entry(key, owner), target: 'Create', result: 'Equal', create_revision: created[i] },
      { key: this.keys.entry(key, owner), target: 'Value', result: 'Equal', value: this.valueOf(request, i, false) },
    ]);
  }

  /** Its own entries as `ownStillWaiting`, and no entry of an exclusive line older. */
  private firstInEveryLine(request: LineRequest): ICompare[] {
    return [
      ...this.ownStillWaiting(request),
      ...request.keys
        .slice(0, request.placed)
        .flatMap((key, i): ICompare[] =>
          request.limits[i] === 1
            ? [{ ...this.keys.line(key), target: 'Create', result: 'Greater', create_revision: request.created[i] - 1 }]
            : [],
        ),
    ];
  }

  /** Its own entries, and in each line what is ahead of it. */
  private standingReads(request: LineRequest): IRequestOp[] {
    const placed = request.keys.slice(0, request.placed);
    return [
      ...placed.map((key): IRequestOp => ({ request_range: { key: this.keys.entry(key, request.owner) } })),
      ...placed.map((key, i) => this.lineRead(key, request.limits[i], request.created[i])),
    ];
  }

  /**
   * The entries of a line older than `revision` (all of them without it) that the rule for `limit`
   * needs: for an exclusive caller the newest (two, without a revision: its own may be among
   * them), for the others all of them, first first, with their values.
   */
  private lineRead(key: string, limit: number, revision: number | undefined): IRequestOp {
    const below = revision === undefined ? {} : { max_create_revision: revision - 1 };
    if (limit === 1)
      return {
        request_range: {
          ...this.keys.line(key),
          ...below,
          sort_target: 'Create',
          sort_order: 'Descend',
          limit: revision === undefined ? 2 : 1,
          keys_only: true,
        },
      };
    return { request_range: { ...this.keys.line(key), ...below, sort_target: 'Create', sort_order: 'Ascend' } };
  }

  /** The entries of a line read by lineRead() that are ahead of `revision`, first first. */
  private aheadOf(kvs: readonly IKeyValue[], limit: number, revision: number): IKeyValue[] {
    const ahead = kvs.filter((kv) => Number(kv.create_revision) < revision);
    return limit === 1 ? ahead.slice(0, 1) : ahead;
  }
}
