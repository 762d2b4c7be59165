/**
 * One waiter's wake-up: `sleep()` resolves on `wake()`, on timeout or on abort. A wake that comes
 * while the waiter is busy (between an attempt and its next sleep) is kept, so none is lost.
 */
export class Waiter {
  /** Its first attempt is on its way to the backend (see LockWaitQueue.allTrying). */
  trying = false;
  private pending = false;
  private resolve: (() => void) | undefined;

  wake = (): void => {
    if (this.resolve) this.resolve();
    else this.pending = true;
  };

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    if (this.pending || signal?.aborted) {
      this.pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        this.resolve = undefined;
        this.pending = false;
        resolve();
      };
      // Node fires a longer timer after 1 ms: a waiter would spin instead of sleeping.
      const timer = setTimeout(done, Math.min(Math.max(0, ms), 2_147_483_647));
      signal?.addEventListener('abort', done);
      this.resolve = done;
    });
  }
}

/** Caps on this process's waiters; a caller beyond them is answered "busy" at once. */
export interface WaiterLimits {
  /** Waiters for one key (a multi-key waiter counts for each of its keys). */
  perKey?: number;
  /** Waiters for any key. */
  total?: number;
}

/**
 * Local FIFO queues of waiters, one per key set. Only the head of a queue talks to the backend;
 * the others wait their turn, so a release wakes one local waiter instead of all of them, and a
 * newcomer cannot overtake a waiter of the same process.
 */
export class LockWaitQueue {
  private readonly queues = new Map<string, Waiter[]>();
  /** Waiters per key, kept only when there is a cap per key (one map update per key and join). */
  private readonly perKey: Map<string, number> | undefined;
  private size = 0;

  constructor(private readonly limits: WaiterLimits = {}) {
    this.perKey = limits.perKey === undefined ? undefined : new Map();
  }

  /** Nobody waits on this key set yet: the queue is empty, or all in it are on their first attempt. */
  allTrying(id: string): boolean {
    return this.queues.get(id)?.every((waiter) => waiter.trying) ?? true;
  }

  /** Which cap one more waiter for these keys would pass, if any. */
  full(keys: readonly string[]): 'perKey' | 'total' | undefined {
    const { perKey, total } = this.limits;
    if (total !== undefined && this.size >= total) return 'total';
    if (perKey !== undefined && keys.some((key) => (this.perKey!.get(key) ?? 0) >= perKey)) return 'perKey';
    return undefined;
  }

  join(id: string, keys: readonly string[]): Waiter {
    const waiter = new Waiter();
    const queue = this.queues.get(id);
    if (queue) queue.push(waiter);
    else this.queues.set(id, [waiter]);
    this.size++;
    if (this.perKey) for (const key of keys) this.perKey.set(key, (this.perKey.get(key) ?? 0) + 1);
    return waiter;
  }

  isHead(id: string, waiter: Waiter): boolean {
    return this.queues.get(id)?.[0] === waiter;
  }

  /** Leaves the queue; when the head leaves, the next waiter takes its place and is woken. */
  leave(id: string, keys: readonly string[], waiter: Waiter): void {
    const queue = this.queues.get(id);
    if (!queue) return;
    const index = queue.indexOf(waiter);
    if (index < 0) return;
    queue.splice(index, 1);
    this.size--;
    if (this.perKey) {
      for (const key of keys) {
        const count = this.perKey.get(key)! - 1;
        if (count === 0) this.perKey.delete(key);
        else this.perKey.set(key, count);
      }
    }
    if (queue.length === 0) this.queues.delete(id);
    else if (index === 0) queue[0].wake();
  }

  /** How many key sets have a queue, and how many keys a waiter count (kept for a cap per key). */
  get footprint(): { keySets: number; countedKeys: number } {
    return { keySets: this.queues.size, countedKeys: this.perKey?.size ?? 0 };
  }

  /** How many callers of this process wait (or make their first attempt) now. */
  get waiting(): number {
    return this.size;
  }

  /** Wakes every waiter of every key set (at shutdown, so that they give up). */
  wakeAll(): void {
    for (const queue of this.queues.values()) for (const waiter of queue) waiter.wake();
  }

  /** A lock on this key set was released in this process: the head may try now. */
  wakeHead(id: string): void {
    this.queues.get(id)?.[0].wake();
  }
}
