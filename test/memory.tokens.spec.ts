import { describe, expect, it } from '@jest/globals';
import { MemoryLockBackend } from '../lib/backends/memory.backend.js';
import { LockService } from '../lib/index.js';
import { until } from './support/wait.js';

// A single-instance app restarts: its next process must not hand out tokens that storage, which
// kept the highest token it saw, refuses (docs/fencing.md).
describe('in-memory fencing tokens', () => {
  it('are above every token of the backend before a restart, and strictly increasing per key', async () => {
    const before = new MemoryLockBackend();
    const first: number[] = [];
    for (let i = 0; i < 50; i++) {
      const result = await before.tryAcquire(['lock:stock'], `owner-${i}`, 1_000);
      if (!result.acquired) throw new Error('the key was free');
      first.push(result.fencingToken!);
      await before.release(['lock:stock'], `owner-${i}`);
    }
    for (let i = 1; i < first.length; i++) expect(first[i]).toBeGreaterThan(first[i - 1]);
    await before.close();
    // A restart takes longer than the clock needs to pass the last token (one per µs at most ahead of it).
    const last = first[first.length - 1];
    await until(() => Date.now() * 1_000 > last, 5_000, 'the clock to pass the last token');

    const after = new LockService(new MemoryLockBackend());
    const handle = await after.acquire('stock');
    expect(handle.fencingToken).toBeGreaterThan(last);
    expect(Number.isSafeInteger(handle.fencingToken)).toBe(true);
    await handle.release();
    await after.onApplicationShutdown();
  });
});
