import type { IKeyValue, IRangeRequest, ITxnRequest, Watcher } from 'etcd3';
import type { EtcdConnection, Operation } from './etcd.connection.js';
import type { EtcdKeys } from './etcd.keys.js';
import { HANDED, isHandedValue, takesHandover, WAITING_FOR_HANDOVER } from './etcd.kinds.js';

/** What a hand-over needs of a place: its one key, its token, and what it learned of the line behind it. */
export interface HandoverPlace {
  readonly keys: readonly string[];
  readonly owner: string;
  readonly limits: readonly number[];
  revision?: number;
  /** The entry just behind it in its line, read once it held the key (undefined: nobody, or not read). */
  next?: Promise<IKeyValue | undefined>;
}

/**
 * Hand-over on release. Without it, a hot key changes hands in three steps: the release deletes
 * the holder's entry, the next waiter's watch tells it, and the waiter sends the transaction that
 * takes the key, one more Raft write before the new holder may count on it. With it, the release
 * itself makes the next waiter the holder, in the transaction that deletes its own entry, and the
 * waiter learns from a watch on its own entry: the same steps as a bare delete and a watch event.
 *
 * - Only a waiter for one key, exclusively, that says it takes a hand-over (its entry's value,
 *   etcd.kinds.ts), is handed the key: a waiter of several keys takes them all at once itself, and
 *   processes of earlier releases are only woken, as before.
 * - The holder learns who is behind it once it holds (a read from the member it talks to, sent in
 *   the background), not at release: whoever came into the line since comes after that waiter.
 *   The transaction hands over only while both entries are as read; otherwise the release deletes
 *   the holder's entry as it would have (etcd.releases.ts), and the waiter takes the key itself.
 * - The waiter's entry stays on its process's waiter lease, marked held: a waiter that died in
 *   line goes with that lease within `waiterTimeout`, whether it was handed the key or not. Its
 *   owner moves it onto its own lease at its first extension (etcd.backend.ts).
 */
export class EtcdHandover {
  constructor(
    private readonly connection: EtcdConnection,
    private readonly keys: EtcdKeys,
  ) {}

  /** A place now holds its key (after waiting): reads who waits just behind it, for its release. */
  lookBehind(place: HandoverPlace): void {
    if (!takesHandover(place.limits) || place.revision === undefined) return;
    const what = { op: 'read the line', keys: place.keys };
    place.next = this.connection
      .range(this.nextAfter(place.keys[0], place.revision), what)
      .then((kvs) => kvs[0])
      .catch(() => undefined);
  }

  /**
   * Hands the key of `place` (held on `lease`) to the waiter behind it: true when its entry is
   * gone and that waiter holds. False when nobody was read behind it, or the line changed since
   * (nothing changed then). Rejects when etcd did not answer (it may have been applied).
   */
  async handOver(place: HandoverPlace, lease: string, what: Operation): Promise<boolean> {
    const next = await place.next;
    // Anyone else behind it (a waiter of several keys, a reader, a process of an earlier release) takes the key itself.
    if (!next || !next.value.equals(WAITING_FOR_HANDOVER) || place.revision === undefined) return false;
    const request = this.handOverRequest(place.keys[0], place.owner, place.revision, lease, next);
    const { succeeded } = await this.connection.txn(request, what);
    return succeeded;
  }

  /** For a waiter that takes a hand-over: calls `handed` once a release marks its entry held. */
  watchOwn(place: HandoverPlace, handed: () => void): Watcher | undefined {
    if (!takesHandover(place.limits)) return undefined;
    const watcher = this.connection.watchChanges(this.keys.entry(place.keys[0], place.owner));
    watcher.on('put', (kv: IKeyValue) => {
      if (isHandedValue(kv.value) && Number(kv.create_revision) === place.revision) handed();
    });
    // A watch that fails says nothing: the waiter's watch on the entry ahead wakes it, and its
    // next attempt finds the key handed to it (etcd.standing.ts).
    watcher.on('error', () => undefined);
    return watcher;
  }

  /**
   * The entry that comes next in the line of `key` after revision `revision` (its holder's), from
   * the member asked, without a round of its cluster: a member behind the others may miss entries
   * put since, and those come after any it shows (create revisions only grow). Whether it still
   * waits as read is checked by the transaction that hands it the key.
   */
  private nextAfter(key: string, revision: number): IRangeRequest {
    return {
      ...this.keys.line(key),
      sort_target: 'Create',
      sort_order: 'Ascend',
      min_create_revision: revision + 1,
      limit: 1,
      serializable: true,
    };
  }

  /**
   * A holder of one key hands it to `next`, the waiter just behind it, read by nextAfter(): while
   * the holder's entry is still the one of its revision on `lease`, and `next` is as read (waiting
   * for a hand-over, on its process's waiter lease), the holder's entry goes and `next`'s is marked
   * held where it is, its anchor gone (as taking the key deletes it). Nothing else changes:
   * `next`'s create revision, its token, stays.
   */
  private handOverRequest(key: string, owner: string, revision: number, lease: string, next: IKeyValue): ITxnRequest {
    const entry = this.keys.entry(key, owner);
    return {
      compare: [
        { key: entry, target: 'Create', result: 'Equal', create_revision: revision },
        { key: entry, target: 'Lease', result: 'Equal', lease },
        { key: next.key, target: 'Mod', result: 'Equal', mod_revision: next.mod_revision },
        { key: next.key, target: 'Value', result: 'Equal', value: WAITING_FOR_HANDOVER },
      ],
      success: [
        { request_delete_range: { key: entry } },
        { request_delete_range: { key: this.keys.identity(key, owner) } },
        { request_put: { key: next.key, value: HANDED, lease: next.lease } },
        { request_delete_range: { key: this.keys.anchor(this.keys.ownerOf(next.key)) } },
      ],
    };
  }
}
