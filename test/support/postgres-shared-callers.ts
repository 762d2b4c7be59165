import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { PostgresLockBackend, type PostgresLockBackendOptions } from '../../lib/index.js';
import type { PostgresFixture } from './postgres-fixture.js';

export { SHARED };
export const EXCLUSIVE = 1;

/** A caller that waits for a key with a limit, as a waiter of LockService does through the backend. */
export interface Entering {
  /** Resolves to the fencing token once the key is held. */
  readonly entered: Promise<number>;
  /** How many times a release woke this caller. */
  readonly wakes: () => number;
  /** Whether it holds the key. */
  readonly inside: () => boolean;
  /** Gives up waiting (and leaves the line), or releases. */
  leave(): Promise<void>;
}

/**
 * Backends of processes on the fixture's database, already listening (as after their first wait),
 * and callers that wait on them the way LockService does: an attempt that waits, then a wake-up
 * (a release named it) or the retry time the attempt gave, then another attempt.
 */
export function sharedCallers(
  fixture: PostgresFixture,
  defaults: PostgresLockBackendOptions = {},
  /** Where lock statements go: the fixture's database, unless a pooler stands in front of it. */
  connection: () => string = () => fixture.url,
) {
  let owners = 0;

  async function backend(options: PostgresLockBackendOptions = {}): Promise<PostgresLockBackend> {
    const created = new PostgresLockBackend(connection(), { waiterTimeout: 20_000, ...defaults, ...options });
    fixture.cleanup(() => created.close());
    if (created.watching() || options.listenConnection === false || defaults.listenConnection === false) return created;
    (await created.watch(['warm-up'], () => undefined, 'nobody'))();
    return created;
  }

  function enter(b: PostgresLockBackend, key: string, limit: number, ttl = 30_000): Entering {
    const owner = `owner-${++owners}-${limit}`;
    let wakes = 0;
    let inside = false;
    let gaveUp = false;
    let wake: () => void = () => undefined;
    const entered = (async () => {
      // Without LISTEN, watch refuses and the caller polls (as LockService does).
      const stop = await b.watch([key], () => (wakes++, wake()), owner).catch(() => () => undefined);
      try {
        while (!gaveUp) {
          const woken = new Promise<void>((resolve) => (wake = resolve));
          const result = await b.tryAcquire([key], owner, ttl, { limits: [limit] });
          if (result.acquired) {
            inside = true;
            return result.fencingToken!;
          }
          if (result.limitMismatch) throw Object.assign(new Error('limit mismatch'), result.limitMismatch);
          let timer: NodeJS.Timeout | undefined;
          // A process that does not listen polls, as LockService does every pollInterval.
          const pause = b.watching() ? (result.retryAfterMs ?? 1_000) : Math.min(result.retryAfterMs ?? 100, 100);
          const retry = new Promise<void>((resolve) => (timer = setTimeout(resolve, pause)));
          await Promise.race([woken, retry]).finally(() => clearTimeout(timer));
        }
        throw new Error('gave up');
      } finally {
        stop();
      }
    })();
    entered.catch(() => undefined);
    fixture.cleanup(() => b.release([key], owner).catch(() => undefined));
    return {
      entered,
      wakes: () => wakes,
      inside: () => inside,
      async leave() {
        gaveUp = true;
        wake();
        inside = false;
        await b.release([key], owner);
      },
    };
  }

  /** How many callers stand in the key's line. */
  async function line(key: string): Promise<number> {
    const { rowCount } = await fixture.admin.query('SELECT 1 FROM distributed_locks_waiters WHERE key = $1', [key]);
    return rowCount ?? 0;
  }

  return { backend, enter, line };
}
