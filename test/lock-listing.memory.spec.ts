import { describe, expect, it } from '@jest/globals';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { MemoryLockBackend } from '../lib/backends/memory.backend.js';
import { RedisLockBackend } from '../lib/backends/redis/redis.backend.js';
import { LockService } from '../lib/lock.service.js';
import { useRedisServer } from './support/redis-fixture.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

const KEYS = 100_000;
const PAGE = 1_000;
/**
 * What a whole listing may keep once each page is dropped. Remembering the keys listed so far (to
 * skip repeats, say) would keep 100 000 of them: several MB. A page is dropped before measuring.
 */
const RETAINED_BOUND = 1024 * 1024;

/** Pages through every key under `prefix`; returns how many, and the most heap any point of it kept (after a GC). */
async function listAll(service: LockService, prefix: string): Promise<{ listed: number; retained: number; pages: number }> {
  // Compiled code and caches of a first call are not what is measured.
  let warm: string | undefined;
  for (let i = 0; i < 3; i++) warm = (await service.list({ prefix, limit: PAGE, cursor: warm })).cursor;
  gc();
  const baseline = process.memoryUsage().heapUsed;
  let retained = 0;
  let listed = 0;
  let pages = 0;
  let cursor: string | undefined;
  do {
    const page = await service.list({ prefix, limit: PAGE, cursor });
    expect(page.keys.length).toBeLessThanOrEqual(PAGE);
    listed += page.keys.length;
    cursor = page.cursor;
    if (++pages % 25 === 0) {
      gc();
      retained = Math.max(retained, process.memoryUsage().heapUsed - baseline);
    }
  } while (cursor !== undefined);
  gc();
  retained = Math.max(retained, process.memoryUsage().heapUsed - baseline);
  process.stdout.write(`${listed} keys listed in ${pages} pages; most heap kept between pages: ${retained} bytes\n`);
  return { listed, retained, pages };
}

describe('list() over 100 000 held keys keeps a page at a time', () => {
  it('memory: every key once, with the heap back where it was between pages', async () => {
    const backend = new MemoryLockBackend();
    for (let i = 0; i < KEYS; i++) backend.immediate!.tryAcquire([`lock:big:${i}`], `owner-${i}`, 600_000, performance.now());
    const service = new LockService(backend);
    const { listed, retained, pages } = await listAll(service, 'big:');
    expect(listed).toBe(KEYS);
    expect(pages).toBe(KEYS / PAGE);
    expect(retained).toBeLessThan(RETAINED_BOUND);
    await backend.close();
  }, 60_000);

  describe('redis', () => {
    const fixture = useRedisServer();

    it('SCAN by pages: every key, with the heap back where it was between pages', async () => {
      // Written as the backend writes a held key, in batches.
      for (let from = 0; from < KEYS; from += 10_000) {
        const batch = fixture.admin.pipeline();
        for (let i = from; i < from + 10_000; i++) batch.set(`lock:big:${i}`, `owner-${i}`, 'PX', 600_000);
        await batch.exec();
      }
      const backend = new RedisLockBackend(fixture.server.url);
      fixture.cleanup(() => backend.close());
      const service = new LockService(backend);
      const { listed, retained } = await listAll(service, 'big:');
      // SCAN repeats a key only when Redis shrinks its table, which nothing here makes it do.
      expect(listed).toBe(KEYS);
      expect(retained).toBeLessThan(RETAINED_BOUND);
    }, 60_000);
  });
});
