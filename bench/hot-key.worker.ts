import 'reflect-metadata';
import { Redis } from 'ioredis';
import { LockService, RedisLockBackend } from '../lib/index.js';
import { timedSections } from './harness.js';

/**
 * One process of hot-key workers (forked by redis.bench.ts), `callers` of them on one LockService:
 * `warm` runs a few unmeasured sections, `go` runs the measured ones and sends back each wait and
 * each section's real length.
 */
const [port, key, sections, sectionMs, callers = '1', localHandoffs = '0'] = process.argv.slice(2);
const locks = new LockService(new RedisLockBackend(new Redis(Number(port), '127.0.0.1'), { localHandoffs: Number(localHandoffs) }));
const lock = async () => {
  const handle = await locks.acquire(key, { wait: 60_000 });
  return () => handle.release();
};
const rounds = async (count: number, waits: number[], inside: number[]) => {
  await Promise.all(Array.from({ length: Number(callers) }, () => timedSections(lock, count, Number(sectionMs), waits, inside)));
};

process.on('message', async (message) => {
  if (message === 'warm') {
    await rounds(5, [], []);
    process.send!('warm');
  } else if (message === 'go') {
    const [waits, inside]: number[][] = [[], []];
    await rounds(Number(sections), waits, inside);
    process.send!({ waits, inside });
    await locks.onApplicationShutdown();
    process.exit(0);
  }
});
process.send!('ready');
