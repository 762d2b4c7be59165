import type { MysqlConnection } from './mysql.connection.js';

/** An owner of this process waiting for its keys. */
interface Watcher {
  keys: readonly Buffer[];
  wake: () => void;
}

/** What one look found of a key. */
interface KeyState {
  /** Its live holders: how many, and the least and the shared (above 1) of their limits. */
  holders: number;
  leastLimit: bigint | undefined;
  sharedLimit: bigint | undefined;
  /** The first waiter still in the key's line, and its limit, if any. */
  head: string | undefined;
  headLimit: bigint | undefined;
  /** The watched owners that hold it (a release handed it to them). */
  heldBy: Set<string>;
}

/**
 * This process's wake-ups. MySQL has no notifications, so while owners of this process wait, it
 * asks the server every `wakeUpInterval`, in one statement for all of them and by primary key,
 * what their keys look like. An owner is woken when its attempt would now win: every key it waits
 * for is its own (a release handed it over, in its own transaction), or it is first in the key's
 * line (or the line is empty) and the key has room for it. The look reads committed rows and takes
 * no lock.
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
    const { holders, waiters } = this.connection.names;
    const live = (table: string, column: string) => `FROM ${table} x WHERE x.lock_key = k.lock_key AND x.${column} > UTC_TIMESTAMP(6)`;
    const head = (column: string) => `(SELECT x.${column} ${live(waiters, 'deadline')} ORDER BY x.place LIMIT 1)`;
    const owners = [...this.watchers.keys()];
    const rows = await this.connection.run({
      op: 'wake-up look',
      keys: [],
      sql:
        `SELECT 'k' AS kind, k.lock_key, (SELECT COUNT(*) ${live(holders, 'expires_at')}) AS holders, ` +
        `(SELECT CAST(MIN(x.max_holders) AS CHAR) ${live(holders, 'expires_at')}) AS least_limit, ` +
        `(SELECT CAST(MAX(IF(x.max_holders > 1, x.max_holders, NULL)) AS CHAR) ${live(holders, 'expires_at')}) AS shared_limit, ` +
        `${head('owner')} AS owner, CAST(${head('max_holders')} AS CHAR) AS head_limit ` +
        `FROM (${keys.map(() => 'SELECT CAST(? AS BINARY) AS lock_key').join(' UNION ALL ')}) k ` +
        `UNION ALL SELECT 'h', h.lock_key, NULL, NULL, NULL, h.owner, NULL FROM ${holders} h ` +
        `WHERE h.lock_key IN (?) AND h.owner IN (?) AND h.expires_at > UTC_TIMESTAMP(6)`,
      values: [...keys, keys, owners],
    });
    const states = new Map<string, KeyState>();
    const stateOf = (key: unknown) => {
      const hex = (key as Buffer).toString('hex');
      let state = states.get(hex);
      if (!state) {
        state = { holders: 0, leastLimit: undefined, sharedLimit: undefined, head: undefined, headLimit: undefined, heldBy: new Set() };
        states.set(hex, state);
      }
      return state;
    };
    for (const row of rows) {
      const state = stateOf(row.lock_key);
      if (text(row.kind) === 'h') {
        state.heldBy.add(text(row.owner));
        continue;
      }
      Object.assign(state, {
        holders: Number(row.holders),
        leastLimit: limit(row.least_limit),
        sharedLimit: limit(row.shared_limit),
        head: row.owner === null ? undefined : text(row.owner),
        headLimit: limit(row.head_limit),
      });
    }
    return states;
  }
}

/**
 * Whether `owner`'s attempt would win this key: it holds it (a release handed it over), or nobody
 * else is first in line and the key has room. The first in line is also woken when its limit
 * disagrees with the holders': its attempt reports it. One whose place ran out (the line does not
 * know its limit) is woken when the key has room for anyone.
 */
function mayTake(state: KeyState | undefined, owner: string): boolean {
  if (!state) return true;
  if (state.heldBy.has(owner)) return true;
  if (state.head !== undefined && state.head !== owner) return false;
  const least = state.leastLimit;
  if (state.head === undefined) return least === undefined || BigInt(state.holders) < least;
  const mine = state.headLimit ?? 1n;
  if (mine > 1n && state.sharedLimit !== undefined && state.sharedLimit !== mine) return true;
  return BigInt(state.holders) < (least === undefined || mine < least ? mine : least);
}

/** A limit the look reads as text (shared is the largest BIGINT UNSIGNED, see mysql.procedures.ts). */
function limit(value: unknown): bigint | undefined {
  return value === null || value === undefined ? undefined : BigInt(text(value));
}

/** A VARBINARY column comes back as a Buffer. */
function text(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}
