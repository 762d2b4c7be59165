import type { LockEventMap, LockEventName } from '../lock.events.js';
import type { LockService } from '../lock.service.js';

/** One recorded lock event: its payload, with its name as `type`. */
export type RecordedLockEvent = { [E in LockEventName]: { readonly type: E } & LockEventMap[E] }[LockEventName];

/** A recorded event of one name. */
type Recorded<E extends LockEventName> = Extract<RecordedLockEvent, { readonly type: E }>;

const EVENT_NAMES: readonly LockEventName[] = ['acquired', 'released', 'busy', 'failed', 'lost', 'extended'];

interface Waiter {
  type: LockEventName;
  key: string | undefined;
  resolve(event: RecordedLockEvent): void;
}

/**
 * Records what one LockService does, for a test's assertions: every lock event in order
 * (`events`), and the keys as your code names them, without the module's `keyPrefix` (`locked`,
 * `busy`, `lost`). It listens to `locks.events`, the events the service emits in production, so
 * what it sees is what ran; `stop()` (or `using recorder = ...`) unsubscribes.
 */
export class LockRecorder implements Disposable {
  /** Every event since the recorder started (or since `clear()`), in the order they happened. */
  readonly events: RecordedLockEvent[] = [];
  private readonly waiters = new Set<Waiter>();
  private readonly unsubscribe: (() => void)[];
  private readonly prefix: string;

  constructor(locks: LockService) {
    this.prefix = locks.options.keyPrefix;
    this.unsubscribe = EVENT_NAMES.map((type) =>
      // One listener per name: with none, the service builds no payload, so the recorder costs only what it records.
      locks.events.on(type, (event: LockEventMap[typeof type]) => this.record({ type, ...event } as RecordedLockEvent)),
    );
  }

  /**
   * The keys each new acquisition locked, in order, without the `keyPrefix`: `['order:42']` after
   * `pay(42)` under `@Locked('order:<id>')`. Re-entries (a key its async context already held)
   * are left out: they took no lock. Several keys taken together appear in their lock order.
   */
  get locked(): string[] {
    return this.keysOf((e) => e.type === 'acquired' && !e.reentrant);
  }

  /** The keys of calls that did not get their lock: refused (`wait: 0`, `onBusy: 'skip'`) or timed out. */
  get busy(): string[] {
    return this.keysOf((e) => e.type === 'busy');
  }

  /** The keys of leases lost while held (see `LockLostError.reason` in `events`). */
  get lost(): string[] {
    return this.keysOf((e) => e.type === 'lost');
  }

  /**
   * The first `type` event (on `key`, without the prefix, when given) recorded so far, or the next
   * one to come: await it to let a test go on once a call holds its lock, or once a holder has
   * learnt it lost one. With `timeoutMs`, rejects after that long with what was recorded instead;
   * without, the test's own timeout bounds it.
   */
  waitFor<E extends LockEventName>(type: E, key?: string, options?: { timeoutMs?: number }): Promise<Recorded<E>> {
    const seen = this.events.find((event) => this.matches(event, type, key));
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timeoutMs = options?.timeoutMs;
      const timer =
        timeoutMs === undefined
          ? undefined
          : setTimeout(() => {
              this.waiters.delete(waiter);
              const recorded = this.events.map((e) => `${e.type} ${e.keys.join(',')}`).join('; ') || 'nothing';
              const on = key === undefined ? '' : ` on '${key}'`;
              reject(new Error(`No '${type}' lock event${on} within ${timeoutMs} ms. Recorded: ${recorded}.`));
            }, timeoutMs);
      const waiter: Waiter = {
        type,
        key,
        resolve: (event) => {
          clearTimeout(timer);
          if (this.matches(event, type, key)) resolve(event);
        },
      };
      this.waiters.add(waiter);
    });
  }

  /** Forgets what was recorded so far; keeps recording. */
  clear(): void {
    this.events.length = 0;
  }

  /** Stops recording (what was recorded stays readable). */
  stop(): void {
    for (const off of this.unsubscribe.splice(0)) off();
  }

  [Symbol.dispose](): void {
    this.stop();
  }

  private record(event: RecordedLockEvent): void {
    this.events.push(event);
    for (const waiter of this.waiters) {
      if (!this.matches(event, waiter.type, waiter.key)) continue;
      this.waiters.delete(waiter);
      waiter.resolve(event);
    }
  }

  private matches<E extends LockEventName>(event: RecordedLockEvent, type: E, key: string | undefined): event is Recorded<E> {
    return event.type === type && (key === undefined || event.keys.includes(this.prefix + key));
  }

  private keysOf(select: (event: RecordedLockEvent) => boolean): string[] {
    return this.events.filter(select).flatMap((event) => event.keys.map((key) => this.withoutPrefix(key)));
  }

  private withoutPrefix(key: string): string {
    return key.startsWith(this.prefix) ? key.slice(this.prefix.length) : key;
  }
}

/** Starts recording what `locks` does: `const recorder = recordLocks(moduleRef.get(LockService))`. */
export function recordLocks(locks: LockService): LockRecorder {
  return new LockRecorder(locks);
}
