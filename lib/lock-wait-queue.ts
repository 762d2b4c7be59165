/**
 * One waiter's wake-up: `sleep()` resolves on `wake()`, on timeout or on abort. A wake that comes
 * while the waiter is busy (between an attempt and its next sleep) is kept, so none is lost.
 */
export class Waiter {
  constructor(
    /** Its key set's queue (see LockWaitQueue). */
    readonly id: string,
    readonly keys: readonly string[],
    /** How many holders its keys admit (1 exclusive, n permits, Infinity shared): see LockWaitQueue.isHead. */
    readonly limit = 1,
    /** When it joined, in this process's order of joins. */
    readonly order = 0,
  ) {}

  /** Its first attempt is on its way to the backend (see LockWaitQueue.allTrying). */
  trying = false;
  /**
   * It waits in the backend's line and the backend wakes it by its owner once the key admits it
   * (LockBackend.watching): for a shared lock or a semaphore, waking it here too would only add
   * an attempt that fails (see LockWaitQueue.leave and wakeHead).
   */
  listening = false;
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
 *
 * The head is a group when its waiters can hold together: the shared callers at the front of the
 * queue (up to the first exclusive one), or as many callers for the same permits as there are
 * permits. They try at once, each for itself; a caller behind a queued exclusive one waits for
 * it, as the backend's line has it wait, so no reader of this process passes a writer.
 *
 * A waiter behind its queue's head has asked the backend nothing yet, so the backend's line does
 * not know it. A caller of another key set that shares a key with it would reach that line first
 * and pass it (a reader of 'doc' and 'toc' entering beside a reader of 'doc' while this process's
 * writer of 'doc' waits behind that reader). Such a waiter is "unseen" until its first attempt:
 * a later caller of another key set that shares one of its keys waits until it is seen.
 */
export class LockWaitQueue {
  private readonly queues = new Map<string, Waiter[]>();
  /** Waiters per key, kept only when there is a cap per key (one map update per key and join). */
  private readonly perKey: Map<string, number> | undefined;
  /** Per key, the waiters of this process the backend's line does not know yet, oldest first. */
  private readonly unseen = new Map<string, Waiter[]>();
  private joins = 0;
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

  /**
   * Whether an earlier waiter of another key set, sharing one of these keys, is unseen: a caller of
   * these keys must not reach the backend's line before it. `waiter`: the caller's own place.
   */
  behindUnseen(keys: readonly string[], waiter?: Waiter): boolean {
    if (this.unseen.size === 0) return false;
    for (const key of keys) {
      for (const other of this.unseen.get(key) ?? []) {
        // Oldest first: the rest joined after the waiter.
        if (waiter && other.order >= waiter.order) break;
        if (other.id !== waiter?.id) return true;
      }
    }
    return false;
  }

  /**
   * Joins the queue of its key set. `seen`: its first attempt goes out now, so the backend's line
   * knows it; otherwise it is unseen until `seen(waiter)`.
   */
  join(id: string, keys: readonly string[], limit = 1, seen = false): Waiter {
    const waiter = new Waiter(id, keys, limit, ++this.joins);
    const queue = this.queues.get(id);
    if (queue) queue.push(waiter);
    else this.queues.set(id, [waiter]);
    this.size++;
    if (this.perKey) for (const key of keys) this.perKey.set(key, (this.perKey.get(key) ?? 0) + 1);
    if (!seen) {
      for (const key of keys) {
        const list = this.unseen.get(key);
        if (list) list.push(waiter);
        else this.unseen.set(key, [waiter]);
      }
    }
    return waiter;
  }

  /** Its attempt is on its way to the backend: callers of other key sets held back by it may go. */
  seen(waiter: Waiter): void {
    if (this.unsee(waiter)) this.wakeHeldBack(waiter);
  }

  /** Whether the waiter is at the head of its queue, or in the group there that may hold together. */
  isHead(id: string, waiter: Waiter): boolean {
    const queue = this.queues.get(id);
    if (!queue) return false;
    if (queue[0] === waiter) return true;
    if (waiter.limit === 1) return false;
    const index = queue.indexOf(waiter);
    return index >= 0 && index < frontGroup(queue);
  }

  /** Leaves the queue; when the head leaves, the next waiter takes its place and is woken. */
  leave(id: string, keys: readonly string[], waiter: Waiter): void {
    const queue = this.queues.get(id);
    if (!queue) return;
    const index = queue.indexOf(waiter);
    if (index < 0) return;
    const before = frontGroup(queue);
    queue.splice(index, 1);
    this.size--;
    if (this.unsee(waiter)) this.wakeHeldBack(waiter);
    if (this.perKey) {
      for (const key of keys) {
        const count = this.perKey.get(key)! - 1;
        if (count === 0) this.perKey.delete(key);
        else this.perKey.set(key, count);
      }
    }
    if (queue.length === 0) this.queues.delete(id);
    else if (index < before) {
      // Those who joined the head group now; the rest of it was awake already.
      // A shared or permit waiter the backend wakes itself is left to it: joining the head group
      // does not mean the key admits it (a permit is free, or the writer ahead has left).
      const after = frontGroup(queue);
      for (let i = index === 0 && before === 1 ? 0 : before - 1; i < after; i++) {
        if (queue[i].limit === 1 || !queue[i].listening) queue[i].wake();
      }
    }
  }

  /** How many key sets have a queue, and how many keys a waiter count (kept for a cap per key). */
  get footprint(): { keySets: number; countedKeys: number } {
    return { keySets: this.queues.size, countedKeys: this.perKey?.size ?? 0 };
  }

  /** Whether the waiter was unseen; it no longer is. */
  private unsee(waiter: Waiter): boolean {
    let found = false;
    for (const key of waiter.keys) {
      const list = this.unseen.get(key);
      const index = list?.indexOf(waiter) ?? -1;
      if (index < 0) continue;
      found = true;
      list!.splice(index, 1);
      if (list!.length === 0) this.unseen.delete(key);
    }
    return found;
  }

  /** Wakes the head groups of the other key sets sharing a key with `waiter`: they may go first now. */
  private wakeHeldBack(waiter: Waiter): void {
    for (const [id, queue] of this.queues) {
      if (id === waiter.id || !queue[0].keys.some((key) => waiter.keys.includes(key))) continue;
      for (let i = 0, group = frontGroup(queue); i < group; i++) queue[i].wake();
    }
  }

  /** How many callers of this process wait (or make their first attempt) now. */
  get waiting(): number {
    return this.size;
  }

  /** Wakes every waiter of every key set (at shutdown, so that they give up). */
  wakeAll(): void {
    for (const queue of this.queues.values()) for (const waiter of queue) waiter.wake();
  }

  /**
   * A lock on this key set was released in this process: the head (its group) may try now. After
   * a shared or permit holder's release (`exclusive` false) other holders may remain, so a waiter
   * the backend wakes itself is left to it: it knows whether the key admits the waiter now.
   */
  wakeHead(id: string, exclusive = true): void {
    const queue = this.queues.get(id);
    if (!queue) return;
    const group = frontGroup(queue);
    for (let i = 0; i < group; i++) if (exclusive || !queue[i].listening) queue[i].wake();
  }
}

/**
 * How many waiters at the front of a queue may hold together: the first alone when it is
 * exclusive, else those after it with the same limit, at most that many.
 */
function frontGroup(queue: readonly Waiter[]): number {
  const limit = queue[0]?.limit ?? 1;
  if (limit === 1) return Math.min(1, queue.length);
  let size = 1;
  while (size < queue.length && size < limit && queue[size].limit === limit) size++;
  return size;
}
