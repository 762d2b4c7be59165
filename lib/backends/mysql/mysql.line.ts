import type { MysqlConnection } from './mysql.connection.js';

/** An owner of this process waiting for its keys. */
interface Watcher {
  keys: readonly Buffer[];
  wake: () => void;
}

/** What one look found of a key. */
interface KeyState {
  owner: string;
  live: boolean;
  /** The first waiter still in the key's line, if any. */
  head: string | undefined;
}

/**
 * This process's wake-ups. MySQL has no notifications, so while owners of this process wait, it
 * asks the server every `wakeUpInterval`, in one statement for all of them and by primary key,
 * what their keys look like. An owner is woken when its attempt would now win: every key it waits
 * for is its own (a release handed it over, in its own transaction) or free with nobody ahead of
 * it in line. The look reads committed rows and takes no lock.
 *
 * What it looks at stays in the tables until the owner acts on it, so nothing is missed between
 * a failed attempt and the watch: a hand-over made meanwhile is found by the next look.
 */
export class MysqlWaiterLine {
  private readonly watchers = new Map<string, Watcher>();
  private timer: NodeJS.Timeout | undefined;
  private looking = false;
  private closed = false;

  constructor(
    private readonly connection: MysqlConnection,
    private readonly intervalMs: number,
  ) {}

  /** Calls `onRelease` when `owner` may take `keys`; returns the function that stops it. */
  watch(keys: readonly Buffer[], onRelease: () => void, owner: string): () => void {
    const watcher = { keys, wake: onRelease };
    this.watchers.set(owner, watcher);
    this.schedule();
    return () => {
      if (this.watchers.get(owner) === watcher) this.watchers.delete(owner);
      if (this.watchers.size === 0) this.stopTimer();
    };
  }

  /** A release by this process handed `owner` its lock: woken now, if it waits here. */
  wake(owner: string): void {
    this.watchers.get(owner)?.wake();
  }

  close(): void {
    this.closed = true;
    this.watchers.clear();
    this.stopTimer();
  }

  private schedule(): void {
    if (this.timer || this.looking || this.closed || this.watchers.size === 0) return;
    this.timer = setTimeout(() => void this.look(), this.intervalMs);
    // The waiting callers keep the process alive; this timer need not.
    this.timer.unref();
  }

  private stopTimer(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async look(): Promise<void> {
    this.timer = undefined;
    this.looking = true;
    try {
      const keys = new Map<string, Buffer>();
      for (const watcher of this.watchers.values()) for (const key of watcher.keys) keys.set(key.toString('hex'), key);
      const states = await this.read([...keys.values()]).catch(() => undefined);
      // The server did not answer: the callers poll meanwhile, and the next look tries again.
      if (states) {
        for (const [owner, watcher] of [...this.watchers]) {
          if (watcher.keys.every((key) => mayTake(states.get(key.toString('hex')), owner))) watcher.wake();
        }
      }
    } finally {
      this.looking = false;
      this.schedule();
    }
  }

  private async read(keys: readonly Buffer[]): Promise<Map<string, KeyState>> {
    const { locks, waiters } = this.connection.names;
    const rows = await this.connection.run({
      op: 'wake-up look',
      keys: [],
      sql:
        `SELECT l.lock_key, l.owner, l.expires_at > UTC_TIMESTAMP(6) AS live, ` +
        `(SELECT w.owner FROM ${waiters} w WHERE w.lock_key = l.lock_key AND w.deadline > UTC_TIMESTAMP(6) ` +
        `ORDER BY w.place LIMIT 1) AS head FROM ${locks} l WHERE l.lock_key IN (?)`,
      values: [keys],
    });
    const states = new Map<string, KeyState>();
    for (const row of rows) {
      states.set((row.lock_key as Buffer).toString('hex'), {
        owner: text(row.owner),
        live: Number(row.live) === 1,
        head: row.head === null ? undefined : text(row.head),
      });
    }
    return states;
  }
}

/** Whether `owner`'s attempt would win this key: it holds it, or it is free and nobody else is first in line. */
function mayTake(state: KeyState | undefined, owner: string): boolean {
  if (!state) return true;
  if (state.live) return state.owner === owner;
  return state.head === undefined || state.head === owner;
}

/** A VARBINARY column comes back as a Buffer. */
function text(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}
