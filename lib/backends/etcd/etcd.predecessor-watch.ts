import type { IKeyValue, Watcher } from 'etcd3';
import type { EtcdConnection } from './etcd.connection.js';
import { isHeldValue, isPendingValue } from './etcd.kinds.js';

interface Watch {
  entry: Buffer;
  /** Its being marked held counts as its deletion. */
  untilHeld: boolean;
  watcher: Watcher;
  /** etcd confirmed the watch once: later 'connected' events are reconnections. */
  started: boolean;
  /** The stream dropped: deletions until it is back may be lost (etcd3 resumes from the last revision it saw). */
  disconnected: boolean;
  dead: boolean;
}

/**
 * One waiter's watches: on the deletion of each entry whose going may let it in (etcd.kinds.ts
 * says which: for an exclusive lock, the entry just ahead of it). A release or an expiry deletes
 * an entry, so only the waiters that watch it hear of it (no herd); an entry set pending keeps
 * nobody out any more, which counts as its deletion. A reader or a permit caller that waits for an
 * entry ahead to hold the key (etcd.kinds.ts) counts its being marked held the same way.
 *
 * A watch starts at the current revision, not at the one the waiter read its line at: etcd serves
 * a watch that starts in the past from its history, in a loop that runs every 100 ms, which would
 * add up to 100 ms to every hand-over. So when etcd confirms the watch at a later revision than
 * that read, the entry is read once more: if it went in between, that counts as its deletion.
 *
 * What etcd3 cannot replay is reported as a change to look at: the watch stream dropped and came
 * back (etcd3 resumes from the last revision it saw), or etcd cancelled the watch (that revision
 * was compacted meanwhile). The waiter then reads its lines again and watches from there.
 */
export class PredecessorWatches {
  /** By entry watched (its etcd key, in hex). */
  private readonly watches = new Map<string, Watch>();
  /** A watch ended without a deletion since the last arm(): whether the waiter is first is unknown. */
  private broken = false;
  private readonly cancelling = new Set<Promise<void>>();

  constructor(
    private readonly connection: EtcdConnection,
    /** Something changed ahead: `clear` when every entry watched was deleted and none was lost. */
    private readonly onChange: (clear: boolean) => void,
  ) {}

  /** Watches `entries` (read at `readRevision`), until they are held too with `untilHeld`; stops watching the others. */
  arm(entries: readonly Buffer[], readRevision: number, untilHeld = false): void {
    this.broken = false;
    const wanted = new Map(entries.map((entry) => [`${entry.toString('hex')}${untilHeld ? ' held' : ''}`, entry]));
    for (const id of [...this.watches.keys()]) if (!wanted.has(id)) this.drop(id);
    for (const [id, entry] of wanted) if (!this.watches.has(id)) this.add(id, entry, readRevision, untilHeld);
  }

  /** Stops every watch; resolves once etcd confirmed, or after `timeoutMs`. */
  async stop(timeoutMs: number): Promise<void> {
    for (const id of [...this.watches.keys()]) this.drop(id);
    if (this.cancelling.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(this.cancelling), new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)))]).finally(
      () => clearTimeout(timer),
    );
  }

  private add(id: string, entry: Buffer, readRevision: number, untilHeld: boolean): void {
    const watcher = this.connection.watchChanges(entry);
    const watch: Watch = { entry, untilHeld, watcher, started: false, disconnected: false, dead: false };
    watcher.on('delete', () => this.deleted(id, watch));
    // Set pending, it keeps nobody out any more: as good as deleted (etcd.kinds.ts); held, for one that waits for that.
    watcher.on('put', (kv: IKeyValue) => {
      if (this.letsIn(watch, kv.value)) this.deleted(id, watch);
    });
    // etcd cancelled the watch: its start revision was compacted, or the watch was refused.
    watcher.on('error', () => {
      if (watch.dead) return;
      watch.dead = true;
      this.watches.delete(id);
      this.broken = true;
      this.onChange(false);
    });
    watcher.on('disconnected', () => void (watch.disconnected = true));
    watcher.on('connected', (created: { header: { revision: string } }) => {
      if (watch.dead) return;
      if (!watch.started) {
        watch.started = true;
        if (Number(created.header.revision) > readRevision) void this.confirm(id, watch, readRevision);
      } else if (watch.disconnected) {
        watch.disconnected = false;
        this.onChange(false);
      }
    });
    this.watches.set(id, watch);
  }

  private deleted(id: string, watch: Watch): void {
    if (watch.dead) return;
    this.drop(id);
    this.onChange(this.watches.size === 0 && !this.broken);
  }

  /**
   * The watch started after the read: did the entry change in between as its events would have
   * told? Deleted, set pending (or held, watched until then), or deleted and put again by its owner
   * starting over (created after the read): each lets the waiter look again.
   */
  private async confirm(id: string, watch: Watch, readRevision: number): Promise<void> {
    let gone: boolean;
    try {
      const entry = await this.connection.entry(watch.entry);
      gone = entry === undefined || this.letsIn(watch, entry.value) || entry.createRevision > readRevision;
    } catch {
      gone = true;
      this.broken = true;
    }
    if (gone) this.deleted(id, watch);
  }

  /** Whether the watched entry, now of this value, lets the waiter look again. */
  private letsIn(watch: Watch, value: Buffer): boolean {
    return isPendingValue(value) || (watch.untilHeld && isHeldValue(value));
  }

  private drop(id: string): void {
    const watch = this.watches.get(id);
    if (!watch) return;
    this.watches.delete(id);
    watch.dead = true;
    const cancelled: Promise<void> = watch.watcher
      .cancel()
      .catch(() => undefined)
      .finally(() => this.cancelling.delete(cancelled));
    this.cancelling.add(cancelled);
  }
}
