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

/**
 * Local FIFO queues of waiters, one per key set. Only the head of a queue talks to the backend;
 * the others wait their turn, so a release wakes one local waiter instead of all of them, and a
 * newcomer cannot overtake a waiter of the same process.
 */
export class LockWaitQueue {
  private readonly queues = new Map<string, Waiter[]>();

  /** Nobody waits on this key set yet: the queue is empty, or all in it are on their first attempt. */
  allTrying(id: string): boolean {
    return this.queues.get(id)?.every((waiter) => waiter.trying) ?? true;
  }

  join(id: string): Waiter {
    const waiter = new Waiter();
    const queue = this.queues.get(id);
    if (queue) queue.push(waiter);
    else this.queues.set(id, [waiter]);
    return waiter;
  }

  isHead(id: string, waiter: Waiter): boolean {
    return this.queues.get(id)?.[0] === waiter;
  }

  /** Leaves the queue; when the head leaves, the next waiter takes its place and is woken. */
  leave(id: string, waiter: Waiter): void {
    const queue = this.queues.get(id);
    if (!queue) return;
    const index = queue.indexOf(waiter);
    if (index < 0) return;
    queue.splice(index, 1);
    if (queue.length === 0) this.queues.delete(id);
    else if (index === 0) queue[0].wake();
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
