import type { IKeyValue, Watcher } from 'etcd3';
import type { EtcdConnection, Operation } from './etcd.connection.js';
import type { EtcdKeys } from './etcd.keys.js';
import { isHandedValue, takesHandover, WAITING_FOR_HANDOVER } from './etcd.kinds.js';
import type { EtcdLine } from './etcd.line.js';

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
 * Hand-over on release. Without it, a hot key changes hands in three steps: the release revokes
 * the holder's lease, the next waiter's watch tells it, and the waiter sends the transaction that
 * takes the key, one more Raft write before the new holder may count on it. With it, the release
 * itself makes the next waiter the holder, in the transaction that deletes its own entry, and the
 * waiter learns from a watch on its own entry: the same steps as a bare delete and a watch event.
 *
 * - Only a waiter for one key, exclusively, that says it takes a hand-over (its entry's value,
 *   etcd.kinds.ts), is handed the key: a waiter of several keys takes them all at once itself, and
 *   processes of earlier releases are only woken, as before.
 * - The holder learns who is behind it once it holds (a read from the member it talks to, sent in
 *   the background), not at release: whoever came into the line since comes after that waiter.
 *   The transaction hands over only while both entries are as read; otherwise the release revokes
 *   the lease as before, and the waiter takes the key itself.
 * - The waiter's entry stays on its process's waiter lease, marked held: a waiter that died in
 *   line goes with that lease within `waiterTimeout`, whether it was handed the key or not. Its
 *   owner moves it onto its own lease at its first extension (etcd.backend.ts).
 */
export class EtcdHandover {
  constructor(
    private readonly connection: EtcdConnection,
    private readonly line: EtcdLine,
    private readonly keys: EtcdKeys,
  ) {}

  /** A place now holds its key (after waiting): reads who waits just behind it, for its release. */
  lookBehind(place: HandoverPlace): void {
    if (!takesHandover(place.limits) || place.revision === undefined) return;
    const what = { op: 'read the line', keys: place.keys };
    place.next = this.connection
      .range(this.line.nextAfter(place.keys[0], place.revision), what)
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
    const { succeeded } = await this.connection.txn(this.line.handOver(place.keys[0], place.owner, place.revision, lease, next), what);
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
}
