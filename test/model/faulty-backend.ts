import type { AcquireResult, ExtendResult, LockBackend, LockState, TryAcquireOptions } from '../../lib/backends/lock-backend.interface.js';

/**
 * What happens to one call on its way to the store and back, as a network and a busy store do it:
 * - ok: applied, answered at once;
 * - late: applied at once, answered `ms` later;
 * - timeout: the caller gives up after `ms` (its promise rejects) while the call is still on its
 *   way; it is applied later anyway (a stalled store runs what was queued), and a win it makes is
 *   reported through onLateAcquire, as the Redis backend does;
 * - fail: rejected, never applied (a refused connection);
 * - twice: applied twice (a request resent after a reconnect), answered with the first result.
 */
export type Fault = { kind: 'ok' } | { kind: 'late'; ms: number } | { kind: 'timeout'; ms: number } | { kind: 'fail' } | { kind: 'twice' };

/** The longest a fault keeps a call (ms): with it, a wait's bound. */
export const MAX_FAULT_MS = 40;

/** A LockBackend in front of another that applies a seeded list of faults, one per call, in turn. */
export class FaultyBackend implements LockBackend {
  readonly name = 'faulty';
  readonly fencing = true;
  private next = 0;

  /** Shared locks and semaphores go through when the store holds them. */
  get sharedHolders(): boolean | undefined {
    return this.inner.sharedHolders;
  }

  constructor(
    readonly inner: LockBackend,
    private readonly faults: readonly Fault[],
  ) {}

  tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    return this.call(
      () => this.inner.tryAcquire(keys, owner, ttlMs, options),
      (late) => {
        if (late.acquired) {
          if (options?.onLateAcquire) options.onLateAcquire();
          else void this.inner.release(keys, owner);
        }
      },
    );
  }

  extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    return this.call(() => this.inner.extend(keys, owner, ttlMs));
  }

  release(keys: readonly string[], owner: string): Promise<boolean> {
    return this.call(() => this.inner.release(keys, owner));
  }

  inspect(key: string): Promise<LockState | undefined> {
    return this.inner.inspect(key);
  }

  watch(keys: readonly string[], onRelease: () => void, owner?: string): Promise<() => void> {
    return this.inner.watch!(keys, onRelease, owner);
  }

  close(): Promise<void> {
    return Promise.resolve();
  }

  private call<T>(apply: () => Promise<T>, onLate?: (result: T) => void): Promise<T> {
    const fault = this.faults.length === 0 ? { kind: 'ok' as const } : this.faults[this.next++ % this.faults.length];
    switch (fault.kind) {
      case 'ok':
        return apply();
      case 'late':
        return apply().then((result) => after(fault.ms).then(() => result));
      case 'fail':
        return Promise.reject(new Error('connection refused (injected)'));
      case 'twice': {
        const first = apply();
        return first.then(async (result) => {
          await apply();
          return result;
        });
      }
      case 'timeout':
        // Applied after the caller gave up on it, as the store works through its backlog.
        // Nobody waits for this answer: a failure of it (a store closed meanwhile) goes nowhere.
        void after(fault.ms * 2).then(() =>
          apply().then(
            (result) => onLate?.(result),
            () => undefined,
          ),
        );
        return after(fault.ms).then(() => {
          throw new Error(`no answer within ${fault.ms} ms (injected)`);
        });
    }
  }
}

function after(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
