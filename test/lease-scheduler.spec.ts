import { describe, expect, it } from '@jest/globals';
import { performance } from 'node:perf_hooks';
import { LeaseScheduler, type Scheduled } from '../lib/lease-scheduler.js';
import { until } from './support/wait.js';

/** A small seeded generator, so a failure can be replayed. */
function random(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('LeaseScheduler', () => {
  it('calls each scheduled item once, in due order, never one cancelled, and a rescheduled one at its new time', async () => {
    const scheduler = new LeaseScheduler();
    const next = random(7);
    const fired: number[] = [];
    const firedLate: number[] = [];
    const due = new Map<number, number>();
    const items = Array.from({ length: 300 }, (_, id): Scheduled => ({
      dueAt: 0,
      heapIndex: -1,
      fire() {
        fired.push(id);
        firedLate.push(performance.now() - due.get(id)!);
      },
    }));
    const start = performance.now();
    for (const [id, item] of items.entries()) {
      const at = start + 20 + next() * 80;
      scheduler.schedule(item, at);
      due.set(id, at);
    }
    for (let id = 0; id < items.length; id += 3) {
      scheduler.cancel(items[id]);
      due.delete(id);
    }
    for (let id = 1; id < items.length; id += 5) {
      const at = start + 20 + next() * 80;
      scheduler.schedule(items[id], at);
      due.set(id, at);
    }
    await until(() => fired.length >= due.size, 5_000, 'every scheduled item to fire');
    const expected = [...due].sort((a, b) => a[1] - b[1]).map(([id]) => id);
    expect(fired).toEqual(expected);
    // Never before its time.
    expect(Math.min(...firedLate)).toBeGreaterThanOrEqual(0);
  });

  it('lets an item schedule itself again from its own call, as a lease does after an extension', async () => {
    const scheduler = new LeaseScheduler();
    let calls = 0;
    const item: Scheduled = {
      dueAt: 0,
      heapIndex: -1,
      fire() {
        if (++calls < 3) scheduler.schedule(item, performance.now() + 5);
      },
    };
    scheduler.schedule(item, performance.now() + 5);
    await until(() => calls === 3, 5_000, 'three calls');
    expect(item.heapIndex).toBe(-1);
  });
});
