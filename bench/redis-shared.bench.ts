import 'reflect-metadata';
import { Redis } from 'ioredis';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Semaphore } from 'redis-semaphore';
import { LockService, RedisLockBackend, type LockHandle } from '../lib/index.js';
import { RedisServer } from '../test/support/redis-server.js';
import { percentile, round, type Report } from './harness.js';

/** One acquisition, as each implementation takes it; resolves to its release. */
type Acquire = () => Promise<() => Promise<unknown>>;

/**
 * Shared locks and semaphores on the Redis backend, on a redis-server of the bench's own:
 * read-mostly sections against an exclusive lock for everyone, a semaphore of 4 permits with 16
 * callers against redis-semaphore's Semaphore, and the Redis commands one acquisition costs.
 */
export async function redisSharedBench(report: Report): Promise<void> {
  report.note(
    'redis-shared: read-mostly sections, a semaphore of 4 with 16 callers, commands per acquisition (starts its own redis-server)',
  );
  const server = await RedisServer.start();
  const clients: Redis[] = [];
  const client = () => {
    const created = new Redis(server.port, '127.0.0.1');
    clients.push(created);
    return created;
  };
  const services: LockService[] = [];
  // Every caller is its own "instance": a client and a service of its own, as in production.
  const service = () => {
    const created = new LockService(new RedisLockBackend(client()));
    services.push(created);
    return created;
  };
  try {
    await readMostly(report, service);
    await semaphore(report, client, service);
    await commandsPerAcquisition(report, client, service);
  } finally {
    await Promise.all(services.map((s) => s.onApplicationShutdown()));
    for (const c of clients) c.disconnect();
    await server.stop();
  }
}

const hold = (handle: Promise<LockHandle>): ReturnType<Acquire> => handle.then((h) => () => h.release());

const READ_MOSTLY = { workers: 8, sections: 60, sectionMs: 1, writeEvery: 10 };

/**
 * 8 workers, each 60 sections of 1 ms on one key, one section in ten a write (the same sections
 * for both rows): readers share the key, a writer holds it alone; against the same sections all
 * under an exclusive lock, which is what a store without shared locks offers.
 */
async function readMostly(report: Report, service: () => LockService): Promise<void> {
  const { workers, sections, sectionMs, writeEvery } = READ_MOSTLY;
  const scenario = `redis: read-mostly, ${workers} workers x ${sections} sections of ${sectionMs} ms, 1 in ${writeEvery} a write`;
  const run = async (impl: string, key: string, readMode: 'shared' | 'exclusive') => {
    const locks = Array.from({ length: workers }, service);
    const pass = async (count: number, reads: number[], writes: number[]) => {
      const started = performance.now();
      await Promise.all(
        locks.map(async (lock, worker) => {
          for (let i = 0; i < count; i++) {
            const write = (worker * count + i) % writeEvery === 0;
            const asked = performance.now();
            const handle = await lock.acquire(key, { mode: write ? 'exclusive' : readMode, wait: 60_000 });
            (write ? writes : reads).push(performance.now() - asked);
            await sleep(sectionMs);
            await handle.release();
          }
        }),
      );
      return performance.now() - started;
    };
    await pass(5, [], []); // connections, scripts, subscriptions and JIT warm for both rows alike
    const [reads, writes]: number[][] = [[], []];
    const elapsed = await pass(sections, reads, writes);
    reads.sort((a, b) => a - b);
    writes.sort((a, b) => a - b);
    return {
      scenario,
      impl,
      sectionsPerSec: Math.round((workers * sections * 1000) / elapsed),
      readWaitP50Ms: round(percentile(reads, 50), 1),
      readWaitP99Ms: round(percentile(reads, 99), 1),
      writeWaitP50Ms: round(percentile(writes, 50), 1),
      writeWaitP99Ms: round(percentile(writes, 99), 1),
      writeWaitMaxMs: round(writes[writes.length - 1], 1),
    };
  };
  const exclusive = await run('ours (exclusive for all)', 'read-mostly:exclusive', 'exclusive');
  const shared = await run("ours (readers mode: 'shared')", 'read-mostly:shared', 'shared');
  report.add({ ...shared, vsExclusive: round(shared.sectionsPerSec / exclusive.sectionsPerSec) });
  report.add({ ...exclusive, vsExclusive: 1 });
}

const SEMAPHORE = { callers: 16, permits: 4, sectionMs: 1, runMs: 2_000 };

/**
 * 16 callers, each taking one of 4 permits for a 1 ms section, again and again for 2 s: the rate,
 * the waits, and how evenly the sections went round (Jain's index over each caller's count: 1 when
 * every caller got as many, 1/16 when one got them all).
 */
async function semaphore(report: Report, client: () => Redis, service: () => LockService): Promise<void> {
  const { callers, permits, sectionMs, runMs } = SEMAPHORE;
  const scenario = `redis: semaphore of ${permits} permits, ${callers} callers, sections of ${sectionMs} ms for ${runMs / 1000} s`;
  const run = async (impl: string, acquireFor: (caller: number) => Acquire) => {
    const loop = async (ms: number, waits: number[], inside: number[], counts: number[]) => {
      const until = performance.now() + ms;
      const started = performance.now();
      await Promise.all(
        Array.from({ length: callers }, async (_, caller) => {
          counts[caller] = 0;
          while (performance.now() < until) {
            const asked = performance.now();
            const release = await acquireFor(caller)();
            const entered = performance.now();
            waits.push(entered - asked);
            await sleep(sectionMs);
            inside.push(performance.now() - entered);
            await release();
            counts[caller]++;
          }
        }),
      );
      return performance.now() - started;
    };
    await loop(300, [], [], []);
    const [waits, inside, counts]: number[][] = [[], [], []];
    const elapsed = await loop(runMs, waits, inside, counts);
    waits.sort((a, b) => a - b);
    const section = inside.reduce((sum, ms) => sum + ms, 0) / inside.length;
    const rate = (counts.reduce((sum, n) => sum + n, 0) * 1000) / elapsed;
    const squares = counts.reduce((sum, n) => sum + n * n, 0);
    report.add({
      scenario,
      impl,
      sectionsPerSec: Math.round(rate),
      vsIdeal: round(rate / ((permits * 1000) / section)),
      waitP50Ms: round(percentile(waits, 50), 1),
      waitP99Ms: round(percentile(waits, 99), 1),
      waitMaxMs: round(waits[waits.length - 1], 1),
      // In a fair line a caller waits for the callers ahead of it, `permits` at a time.
      fifoBoundMs: round((callers / permits) * section, 1),
      fairness: round(squares === 0 ? 0 : counts.reduce((sum, n) => sum + n, 0) ** 2 / (callers * squares)),
      fewestPerCaller: Math.min(...counts),
      mostPerCaller: Math.max(...counts),
    });
  };

  const ours = Array.from({ length: callers }, service);
  await run(`ours (permits: ${permits})`, (caller) => () => hold(ours[caller].acquire('semaphore:ours', { permits, wait: 60_000 })));
  const theirs = Array.from({ length: callers }, client);
  await run('redis-semaphore Semaphore', (caller) => async () => {
    const semaphore = new Semaphore(theirs[caller], 'semaphore:theirs', permits, { lockTimeout: 30_000, acquireTimeout: 60_000 });
    await semaphore.acquire();
    return () => semaphore.release();
  });
}

/**
 * What one acquisition and its release cost Redis, with nobody waiting: the commands the client
 * sends (round trips, MULTI and EXEC counted) and the commands scripts run inside Redis, counted
 * with MONITOR over 200 pairs.
 */
async function commandsPerAcquisition(report: Report, client: () => Redis, service: () => LockService): Promise<void> {
  const scenario = 'redis: commands per acquire+release, nobody waiting';
  const pairs = 200;
  const count = async (impl: string, pair: (i: number) => Promise<unknown>) => {
    for (let i = 0; i < 20; i++) await pair(i); // scripts loaded, connections open
    const monitor = await client().monitor();
    let sent = 0;
    let inScripts = 0;
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (args[0]?.toLowerCase() === 'ping') return; // ioredis's own keep-alive, not the lock's
      if (source === 'lua') inScripts++;
      else sent++;
    });
    await sleep(50);
    for (let i = 0; i < pairs; i++) await pair(i);
    await sleep(200); // MONITOR lags the commands it reports
    monitor.disconnect();
    report.add({ scenario, impl, sentPerPair: round(sent / pairs), inScriptsPerPair: round(inScripts / pairs) });
  };

  const locks = service();
  const other = service();
  await count('ours, exclusive', (i) => locks.acquire(`commands:exclusive:${i}`).then((h) => h.release()));
  await count("ours, mode: 'shared', alone", (i) => locks.acquire(`commands:shared:${i}`, { mode: 'shared' }).then((h) => h.release()));
  const reader = await other.acquire('commands:shared-beside', { mode: 'shared' });
  await count("ours, mode: 'shared', beside another reader", () =>
    locks.acquire('commands:shared-beside', { mode: 'shared' }).then((h) => h.release()),
  );
  await reader.release();
  await count('ours, permits: 4', (i) => locks.acquire(`commands:permits:${i}`, { permits: 4 }).then((h) => h.release()));
  const theirs = client();
  await count('redis-semaphore Semaphore (4)', async (i) => {
    const semaphore = new Semaphore(theirs, `commands:theirs:${i}`, 4, { lockTimeout: 30_000 });
    await semaphore.acquire();
    await semaphore.release();
  });
}
