import 'reflect-metadata';
import { Cluster, Redis } from 'ioredis';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
// @ts-expect-error redlock 5.0.0-beta.2 lists no "types" in its exports map, so nodenext cannot see its typings.
import RedlockPackage from 'redlock';
import { Mutex } from 'redis-semaphore';
import { LockService, RedisLockBackend } from '../lib/index.js';

/**
 * One process of the many-keys scenario (forked by many-keys.bench.ts): on `{ impl, ms }` its
 * workers take and release random keys out of `keys`, each as fast as it can, for `ms`, and it
 * sends back how many pairs they did and each acquisition's latency (ms).
 */
interface Redlock {
  acquire(resources: string[], duration: number): Promise<{ release(): Promise<unknown> }>;
}
const Redlock = RedlockPackage as new (clients: (Redis | Cluster)[], settings?: { retryCount?: number; retryDelay?: number }) => Redlock;

const [target, workersArg, keysArg] = process.argv.slice(2);
const workers = Number(workersArg);
const keys = Number(keysArg);
// A port (one redis-server) or comma-separated ports (the nodes of a Cluster).
const ports = target.split(',').map(Number);
const connect = (): Redis | Cluster =>
  target.includes(',') || process.env.BENCH_CLUSTER === '1'
    ? new Cluster(ports.map((port) => ({ host: '127.0.0.1', port })))
    : new Redis(ports[0], '127.0.0.1');

type Pair = (key: string) => Promise<() => Promise<unknown>>;
const client = connect();
const backend = new RedisLockBackend(client);
const locks = new LockService(backend);
const redlock = new Redlock([client], { retryCount: 1_000, retryDelay: 10 });
const impls: Record<string, Pair> = {
  ours: async (key) => {
    const handle = await locks.acquire(key, { wait: 10_000 });
    return () => handle.release();
  },
  // Its two scripts without the service's lease, watchdog and handle: the same Redis calls for less
  // JavaScript per lock, so Redis sees them at about the peers' pace.
  // (A key that another worker holds, a few in a thousand, is asked for again 1 ms later.)
  'ours, the backend alone': async (key) => {
    const owner = randomBytes(16).toString('hex');
    for (;;) {
      const result = await backend.tryAcquire([key], owner, 30_000, { willWait: false });
      if (result.acquired) return () => backend.release([key], owner);
      await sleep(1);
    }
  },
  'redis-semaphore': async (key) => {
    const mutex = new Mutex(client, key, { lockTimeout: 30_000, acquireTimeout: 10_000 });
    await mutex.acquire();
    return () => mutex.release();
  },
  // The same commands with 100 µs more JavaScript per lock (the process busy, as a heavier client
  // is): Redis sees fewer commands per wake-up, and its CPU per lock goes up.
  'redis-semaphore, 100 µs more JavaScript per lock': async (key) => {
    const mutex = new Mutex(client, key, { lockTimeout: 30_000, acquireTimeout: 10_000 });
    await mutex.acquire();
    const busyUntil = performance.now() + 0.1;
    while (performance.now() < busyUntil);
    return () => mutex.release();
  },
  redlock: async (key) => {
    const lock = await redlock.acquire([key], 30_000);
    return () => lock.release();
  },
};

async function run(impl: string, ms: number): Promise<{ pairs: number; latencies: number[] }> {
  const pair = impls[impl];
  const latencies: number[] = [];
  const until = performance.now() + ms;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (performance.now() < until) {
        const key = `many:${Math.floor(Math.random() * keys)}`;
        const asked = performance.now();
        const release = await pair(key);
        latencies.push(performance.now() - asked);
        await release();
      }
    }),
  );
  return { pairs: latencies.length, latencies };
}

process.on('message', (message: { impl: string; ms: number } | 'stop') => {
  if (message === 'stop') {
    void locks.onApplicationShutdown().finally(() => {
      client.disconnect();
      process.exit(0);
    });
    return;
  }
  void run(message.impl, message.ms).then((result) => process.send!(result));
});
process.send!('ready');
