import { performance } from 'node:perf_hooks';
import { processShared } from './process-shared.js';

/** Something the scheduler calls back at a time: a lease's next extension or its deadline. */
export interface Scheduled {
  /** performance.now() at which `fire` runs. */
  dueAt: number;
  /** Its place in the scheduler's heap; -1 when not scheduled. */
  heapIndex: number;
  fire(): void;
}

/**
 * One timer for the watchdogs of every lease in the process, where a timer per lease was a
 * measurable share of an uncontended acquire+release (Node creates and drops a timer list each
 * time). Leases wait in a binary heap by due time; the timer is set for the earliest. When that
 * lease ends first, the timer is left to fire, finds nothing due and sets itself for the next, so
 * a lock held for less than a third of its ttl costs no timer operation at all.
 */
export class LeaseScheduler {
  private readonly heap: Scheduled[] = [];
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  /**
   * The setTimeout that set `timer`, and its clearTimeout. A test's fake timers replace both
   * globals, and putting the real ones back drops the fake timers pending: a timer set under them
   * would never fire, and every lease scheduled after it would wait for it (no watchdog, no
   * deadline). A setTimeout other than the one that set the timer means the timer is re-set.
   */
  private setWith: typeof setTimeout | undefined;
  private clearWith: typeof clearTimeout = clearTimeout;

  /** Runs `item.fire()` at `at` (performance.now() time), replacing its earlier schedule. */
  schedule(item: Scheduled, at: number): void {
    if (item.heapIndex >= 0) this.remove(item);
    item.dueAt = at;
    item.heapIndex = this.heap.length;
    this.heap.push(item);
    this.up(item.heapIndex);
    if (at < this.timerAt || setTimeout !== this.setWith) this.arm(at);
  }

  /** How many items wait for their time. */
  get size(): number {
    return this.heap.length;
  }

  cancel(item: Scheduled): void {
    if (item.heapIndex >= 0) this.remove(item);
  }

  private arm(at: number): void {
    this.clearWith(this.timer);
    this.timerAt = at;
    this.setWith = setTimeout;
    this.clearWith = clearTimeout;
    // A held lock must not keep a finished process alive.
    this.timer = setTimeout(this.run, Math.max(0, at - performance.now())).unref();
  }

  private readonly run = (): void => {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    // Timers may fire a little early; what is not due yet waits for the next one.
    while (this.heap.length > 0 && this.heap[0].dueAt <= performance.now()) {
      const item = this.heap[0];
      this.remove(item);
      item.fire();
    }
    if (this.heap.length > 0 && this.heap[0].dueAt < this.timerAt) this.arm(this.heap[0].dueAt);
  };

  private remove(item: Scheduled): void {
    const index = item.heapIndex;
    const last = this.heap.pop()!;
    item.heapIndex = -1;
    if (last === item) return;
    this.heap[index] = last;
    last.heapIndex = index;
    this.up(index);
    this.down(last.heapIndex);
  }

  private up(index: number): void {
    const item = this.heap[index];
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (this.heap[parent].dueAt <= item.dueAt) break;
      this.place(this.heap[parent], index);
      index = parent;
    }
    this.place(item, index);
  }

  private down(index: number): void {
    const item = this.heap[index];
    for (;;) {
      const left = 2 * index + 1;
      if (left >= this.heap.length) break;
      const right = left + 1;
      const child = right < this.heap.length && this.heap[right].dueAt < this.heap[left].dueAt ? right : left;
      if (this.heap[child].dueAt >= item.dueAt) break;
      this.place(this.heap[child], index);
      index = child;
    }
    this.place(item, index);
  }

  private place(item: Scheduled, index: number): void {
    this.heap[index] = item;
    item.heapIndex = index;
  }
}

/** The process's one scheduler: every LockService's leases share its timer. */
export const leaseScheduler = processShared('lease-scheduler@1', () => new LeaseScheduler());
