import type { Watcher } from 'etcd3';
import type { EtcdConnection } from './etcd.connection.js';

interface Watch {
  entry: Buffer;
  watcher: Watcher;
  /** etcd confirmed the watch once: later 'connected' events are reconnections. */
  started: boolean;
  /** The stream dropped: deletions until it is back may be lost (etcd3 resumes from the last revision it saw). */
  disconnected: boolean;
  dead: boolean;
}

/**
 * One waiter's watches: in each line where it is not first, on the deletion of the entry just
 * ahead of it. A release or an expiry deletes an entry, so only the next waiter hears of it (no
 * herd).
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
  /** By line (the key of the lock). */
  private readonly watches = new Map<string, Watch>();
  /** A watch ended without a deletion since the last arm(): whether the waiter is first is unknown. */
  private broken = false;
  private readonly cancelling = new Set<Promise<void>>();

  constructor(
    private readonly connection: EtcdConnection,
    /** Something changed ahead: `clear` when every entry watched was deleted and none was lost. */
    private readonly onChange: (clear: boolean) => void,
  ) {}

  /** Watches the entry ahead in each line (`predecessors`, by line, read at `readRevision`); stops watching the others. */
  arm(predecessors: ReadonlyMap<string, Buffer>, readRevision: number): void {
    this.broken = false;
    for (const [line, watch] of this.watches) if (!predecessors.get(line)?.equals(watch.entry)) this.drop(line);
    for (const [line, entry] of predecessors) if (!this.watches.has(line)) this.add(line, entry, readRevision);
  }

  /** Stops every watch; resolves once etcd confirmed, or after `timeoutMs`. */
  async stop(timeoutMs: number): Promise<void> {
    for (const line of [...this.watches.keys()]) this.drop(line);
    if (this.cancelling.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(this.cancelling), new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)))]).finally(
      () => clearTimeout(timer),
    );
  }

  private add(line: string, entry: Buffer, readRevision: number): void {
    const watcher = this.connection.watchDeletes(entry);
    const watch: Watch = { entry, watcher, started: false, disconnected: false, dead: false };
    watcher.on('delete', () => this.deleted(line, watch));
    // etcd cancelled the watch: its start revision was compacted, or the watch was refused.
    watcher.on('error', () => {
      if (watch.dead) return;
      watch.dead = true;
      this.watches.delete(line);
      this.broken = true;
      this.onChange(false);
    });
    watcher.on('disconnected', () => void (watch.disconnected = true));
    watcher.on('connected', (created: { header: { revision: string } }) => {
      if (watch.dead) return;
      if (!watch.started) {
        watch.started = true;
        if (Number(created.header.revision) > readRevision) void this.confirm(line, watch);
      } else if (watch.disconnected) {
        watch.disconnected = false;
        this.onChange(false);
      }
    });
    this.watches.set(line, watch);
  }

  private deleted(line: string, watch: Watch): void {
    if (watch.dead) return;
    this.drop(line);
    this.onChange(this.watches.size === 0 && !this.broken);
  }

  /** The watch started after the read: was the entry deleted in between? */
  private async confirm(line: string, watch: Watch): Promise<void> {
    let exists: boolean;
    try {
      exists = await this.connection.exists(watch.entry);
    } catch {
      exists = false;
      this.broken = true;
    }
    if (!exists) this.deleted(line, watch);
  }

  private drop(line: string): void {
    const watch = this.watches.get(line);
    if (!watch) return;
    this.watches.delete(line);
    watch.dead = true;
    const cancelled: Promise<void> = watch.watcher
      .cancel()
      .catch(() => undefined)
      .finally(() => this.cancelling.delete(cancelled));
    this.cancelling.add(cancelled);
  }
}
