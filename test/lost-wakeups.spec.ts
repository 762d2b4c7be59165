import { describe, expect, it } from '@jest/globals';
import type { LockBackend } from '../lib/backends/lock-backend.interface.js';
import { MemoryLockBackend } from '../lib/backends/memory.backend.js';
import { LockBackendError } from '../lib/lock.errors.js';
import { LockService } from '../lib/lock.service.js';
import { until } from './support/wait.js';

/**
 * A store's wake-ups are messages, and a message can be lost (a subscriber that reconnected, a
 * store that failed over). Polling is the fallback: every waiter in the store's line asks again
 * at least every pollInterval, also one that is not first in its own process's queue.
 */
describe('lost wake-ups', () => {
  it("a waiter first in the store's line but not in its process's queue still takes its turn when every wake-up is lost", async () => {
    const store = new MemoryLockBackend();
    let delayFirst: (() => void) | undefined;
    let attempts = 0;
    // The store's line and this process's queue disagree: the first caller's first attempt fails
    // before it reaches the store, after the second caller's attempt took its place there.
    const backend: LockBackend = {
      name: store.name,
      fencing: store.fencing,
      tryAcquire: async (...args) => {
        if (++attempts === 2) {
          await new Promise<void>((resolve) => (delayFirst = resolve));
          throw new LockBackendError(store.name, 'the connection dropped before the request was sent');
        }
        return store.tryAcquire(...args);
      },
      extend: (...args) => store.extend(...args),
      release: (...args) => store.release(...args),
      inspect: (...args) => store.inspect(...args),
      // Every wake-up is lost.
      watch: (keys, _onRelease, owner) => store.watch(keys, () => undefined, owner),
      watching: () => store.watching(),
    };
    const holder = new LockService(store);
    const service = new LockService(backend, { pollInterval: 100 });
    try {
      const held = await holder.acquire('k', { ttl: 30_000 });
      attempts = 1;
      const first = service.using('k', () => 'first', { wait: 10_000, ttl: 30_000 });
      await until(() => delayFirst !== undefined, 5_000, "the first caller's attempt to be on its way");
      const second = service.using('k', () => 'second', { wait: 10_000, ttl: 30_000 });
      await until(async () => (await store.inspect('lock:k'))?.waiters?.length === 1, 5_000, 'the second caller to stand in line');
      delayFirst!();
      await held.release();
      // Without asking again, the second would keep the key until its wait ran out, and the first
      // would wait behind it all that time.
      const results = await Promise.allSettled([first, second]);
      expect(results.map((r) => (r.status === 'rejected' ? String(r.reason).slice(0, 200) : r.value))).toEqual(['first', 'second']);
    } finally {
      await service.onApplicationShutdown();
      await holder.onApplicationShutdown();
    }
  }, 30_000);
});
