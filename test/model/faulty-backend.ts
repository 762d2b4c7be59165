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

  /** Per owner, its tryAcquire being applied now (with `attemptsInOrder`). */
  private readonly attempts = new Map<string, Promise<unknown>>();

  /**
   * `attemptsInOrder`: an owner's tryAcquire is applied only once its earlier one finished, and its
   * release only once its tryAcquire did, as the service calls them. A late or repeated call still
   * comes late, after later ones. For a backend whose call is several requests of the client's own
   * (etcd): a call given up on stops there, only its last request may land later, so two calls of
   * one owner never run side by side, which applying the whole call late would make them do.
   * Extensions are not held back: the service sends one while a release is out.
   */
  constructor(
    readonly inner: LockBackend,
    private readonly faults: readonly Fault[],
    private readonly attemptsInOrder = false,
  ) {}

  tryAcquire(keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions): Promise<AcquireResult> {
    return this.call(
      () => this.inOrder(owner, true, () => this.inner.tryAcquire(keys, owner, ttlMs, options)),
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
    return this.call(() => this.inOrder(owner, false, () => this.inner.release(keys, owner)));
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

  /** Runs `apply` after the owner's tryAcquire being applied, if any (see `attemptsInOrder`); an attempt is waited for by the next. */
  private inOrder<T>(owner: string, attempt: boolean, apply: () => Promise<T>): Promise<T> {
    if (!this.attemptsInOrder) return apply();
    const result = (this.attempts.get(owner) ?? Promise.resolve()).then(apply);
    if (attempt) {
      const settled = result.then(
        () => undefined,
        () => undefined,
      );
      this.attempts.set(owner, settled);
      void settled.then(() => {
        if (this.attempts.get(owner) === settled) this.attempts.delete(owner);
      });
    }
    return result;
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
