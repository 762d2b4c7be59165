import { Redis } from 'ioredis';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { LockService, RedisLockBackend } from '../lib/index.js';
import { RedisServer } from '../test/support/redis-server.js';
import { round, settledHeap, type Report } from './harness.js';

/**
 * What Redis keeps after many keys were locked (orders, users: each id a few times): the locks
 * still held and the fencing counters, which outlive a release by the lease they were written
 * with. Starts its own redis-server.
 */
export async function redisMemoryBench(report: Report): Promise<void> {
  report.note('redis-memory: Redis and heap after 1,000,000 acquisitions over 100,000 keys (starts its own redis-server)');
  const server = await RedisServer.start();
  const redis = new Redis(server.port, '127.0.0.1');
  const admin = new Redis(server.port, '127.0.0.1');
  const ttl = 5_000;
  const locks = new LockService(new RedisLockBackend(redis), { ttl });
  try {
    const usedMemory = async () => Number(/used_memory:(\d+)/.exec(await admin.info('memory'))![1]);
    const memoryBefore = await usedMemory();
    const heapBefore = settledHeap();
    const distinct = 100_000;
    const acquisitions = 1_000_000;
    let done = 0;
    const worker = async () => {
      while (done < acquisitions) {
        done++;
        await locks.using(`item:${Math.floor(Math.random() * distinct)}`, () => undefined);
      }
    };
    const started = performance.now();
    await Promise.all(Array.from({ length: 64 }, worker));
    const seconds = (performance.now() - started) / 1000;
    await sleep(50); // the last releases are not awaited by using()
    const keys = await admin.keys('*');
    const fenceKeys = keys.filter((key) => key.endsWith(':fence'));
    const fences = fenceKeys.length;
    const sample = fenceKeys[0];
    const fenceBytes = sample ? Number(await admin.memory('USAGE', sample)) : 0;
    const fenceTtlMs = sample ? await admin.pttl(sample) : -2;
    const memoryAfter = await usedMemory();
    const footprint = locks.footprint();
    report.add({
      scenario: 'redis: 1,000,000 acquisitions over 100,000 keys',
      impl: 'ours',
      opsPerSec: Math.round(acquisitions / seconds),
      heapGrowthKB: round((settledHeap() - heapBefore) / 1024, 1),
      leasesLeft: footprint.leases + footprint.keySets,
      redisKeys: keys.length,
      fenceCounters: fences,
      lines: keys.filter((key) => key.endsWith(':queue') || key.endsWith(':waiters')).length,
      locks: keys.filter((key) => !key.startsWith('{')).length,
      bytesPerCounter: fenceBytes,
      counterTtlMs: fenceTtlMs,
      redisGrowthKB: round((memoryAfter - memoryBefore) / 1024, 1),
    });
    // The counters go with the lease they were written with: one ttl later, nothing is left.
    await sleep(ttl + 200);
    report.add({
      scenario: 'redis: one lease (5 s) after that run',
      impl: 'ours',
      heapGrowthKB: round((settledHeap() - heapBefore) / 1024, 1),
      leasesLeft: locks.footprint().leases,
      redisKeys: await admin.dbsize(),
      redisGrowthKB: round(((await usedMemory()) - memoryBefore) / 1024, 1),
    });
  } finally {
    await locks.onApplicationShutdown();
    redis.disconnect();
    admin.disconnect();
    await server.stop();
  }
}
