import 'reflect-metadata';
import { Redis } from 'ioredis';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
// @ts-expect-error redlock 5.0.0-beta.2 lists no "types" in its exports map, so nodenext cannot see its typings.
import RedlockPackage from 'redlock';
import { LockService, RedisLockBackend, RedlockLockBackend } from '../lib/index.js';
import { RedisServer } from '../test/support/redis-server.js';
import { TcpProxy } from '../test/support/tcp-proxy.js';
import { percentile, round, type Report } from './harness.js';

/** The part of the package's public API the bench uses. */
interface Redlock {
  acquire(resources: string[], duration: number): Promise<{ release(): Promise<unknown> }>;
}
const Redlock = RedlockPackage as new (clients: Redis[], settings?: { retryCount?: number }) => Redlock;

const WORKERS = 8;
const SECTIONS = 50;
const SECTION_MS = 1;
const HANDOVERS = 40;

/**
 * Redlock over 3 and 5 masters next to a single Redis: acquisition latency on localhost and with
 * masters at different network distances (the quorum round goes out to every master at once, so
 * it should cost about one round trip, not one per master), and the hot-key handoff next to the
 * redlock package used directly with its defaults.
 */
export async function redlockBench(report: Report): Promise<void> {
  report.note('redlock: starting 6 redis-servers (the sixth is frozen with SIGSTOP for the "one master frozen" rows)');
  const servers = await Promise.all(Array.from({ length: 5 }, () => RedisServer.start()));
  const frozen = await RedisServer.start();
  const proxies: TcpProxy[] = [];
  const opened: Redis[] = [];
  const closers: (() => Promise<unknown>)[] = [];
  const connect = (ports: readonly number[]) =>
    ports.map((port) => {
      const client = new Redis(port, '127.0.0.1');
      opened.push(client);
      return client;
    });
  const service = (ports: readonly number[]) => {
    const locks = new LockService(new RedlockLockBackend(connect(ports)), { keyPrefix: 'bench:' });
    closers.push(() => locks.onApplicationShutdown());
    return locks;
  };
  const redisService = (port: number) => {
    const locks = new LockService(new RedisLockBackend(connect([port])[0]), { keyPrefix: 'bench:' });
    closers.push(() => locks.onApplicationShutdown());
    return locks;
  };

  try {
    const local = servers.map((server) => server.port);
    report.note('redlock: acquisition latency by number of masters, on localhost');
    // Two live masters and a frozen one: an attempt must not wait for the frozen master's vote.
    const oneFrozen = [local[0], local[1], frozen.port];
    const withFrozen = service(oneFrozen);
    await (await withFrozen.acquire('warm-up')).release(); // connected before the freeze
    frozen.pause();
    await acquisitionLatency(report, 'redlock: acquisition latency, localhost', local, 2_000, connect, service, redisService, {
      'ours, 3 masters, one frozen': acquireWith(withFrozen),
    });

    // Masters 1, 2, 3, 4 and 5 ms away: a quorum round should cost the quorum-th nearest
    // master's round trip (2 ms of 3, 3 ms of 5), a sequential one the sum (6 ms, 15 ms).
    report.note('redlock: acquisition latency with masters 1, 2, 3, 4, 5 ms away');
    for (const [i, server] of servers.entries())
      proxies.push(await TcpProxy.start(server.port, { kind: 'delay', ms: i + 1, direction: 'up' }));
    await acquisitionLatency(
      report,
      'redlock: acquisition latency, masters 1-5 ms away',
      proxies.map((proxy) => proxy.port),
      300,
      connect,
      service,
      redisService,
    );

    await redlockHandoverBench(report, local.slice(0, 3), connect);

    report.note(`redlock: hot key, ${WORKERS} workers x ${SECTIONS} sections x ${SECTION_MS} ms, localhost`);
    const hotKeyRows: [string, readonly number[]][] = [
      ['ours, 3 masters, a service per worker', local.slice(0, 3)],
      ['ours, 5 masters, a service per worker', local],
      ['ours, 3 masters, one frozen, a service per worker', oneFrozen],
    ];
    for (const [impl, ports] of hotKeyRows) {
      const workers = Array.from({ length: WORKERS }, () => service(ports));
      const figures = await hotKey(async (worker) => {
        const handle = await workers[worker].acquire('hot', { wait: 60_000 });
        return () => handle.release();
      });
      report.add({ scenario: 'redlock: hot key', impl, ...figures });
    }
    {
      // The same workers in one process share a LockService: its local FIFO queue hands over.
      const shared = service(local.slice(0, 3));
      const figures = await hotKey(async () => {
        const handle = await shared.acquire('hot-shared', { wait: 60_000 });
        return () => handle.release();
      });
      report.add({ scenario: 'redlock: hot key', impl: 'ours, 3 masters, one service for all workers', ...figures });
    }
    {
      // Defaults: retryCount 10, retryDelay 200 ms, retryJitter 100 ms. A worker whose retries
      // run out starts again (counted as a failure), so every section still runs.
      const workers = Array.from({ length: WORKERS }, () => new Redlock(connect(local.slice(0, 3))));
      const figures = await hotKey(async (worker, failed) => {
        for (;;) {
          try {
            const lock = await workers[worker].acquire(['bench:hot-pkg'], 30_000);
            return () => lock.release();
          } catch {
            failed();
          }
        }
      });
      report.add({ scenario: 'redlock: hot key', impl: 'redlock pkg defaults, 3 masters', ...figures });
    }
  } finally {
    await Promise.allSettled(closers.map((close) => close()));
    for (const client of opened) client.disconnect();
    await Promise.all(proxies.map((proxy) => proxy.close()));
    await Promise.all([...servers, frozen].map((server) => server.stop()));
  }
}

/**
 * Hand-overs between two services on 3 masters: all local, then with the releaser 5 ms (one way)
 * from masters 2 and 3, as in other zones, while the waiter is near all three.
 */
export async function redlockHandoverBench(report: Report, ports: readonly number[], connect: (ports: readonly number[]) => Redis[]) {
  report.note(`redlock: hand-over to a waiter of another service, ${HANDOVERS} times`);
  await handover(report, 'ours, every master local', ports, ports, connect);
  const proxies = await Promise.all(ports.slice(1).map((port) => TcpProxy.start(port, { kind: 'delay', ms: 5, direction: 'up' })));
  try {
    await handover(report, 'ours, releaser 5 ms from 2 of 3 masters', [ports[0], ...proxies.map((p) => p.port)], ports, connect);
  } finally {
    await Promise.all(proxies.map((proxy) => proxy.close()));
  }
}

/**
 * A lock released by one service while a service of its own (another process, as far as the
 * masters can tell) waits for it, with the default pollInterval of 500 ms: how long from the
 * release call until the waiter holds the lock. Heard from the release messages, it is about the
 * releaser's trip to the quorum-th master; a waiter that missed them waits for its poll.
 */
async function handover(
  report: Report,
  impl: string,
  releaserPorts: readonly number[],
  waiterPorts: readonly number[],
  connect: (ports: readonly number[]) => Redis[],
): Promise<void> {
  const releaser = new LockService(new RedlockLockBackend(connect(releaserPorts)), { keyPrefix: 'bench:' });
  const waiter = new LockService(new RedlockLockBackend(connect(waiterPorts)), { keyPrefix: 'bench:' });
  const [observer] = connect(waiterPorts.slice(0, 1));
  const latencies: number[] = [];
  try {
    for (let i = 0; i < HANDOVERS + 5; i++) {
      const key = `handover:${i}`;
      const held = await releaser.acquire(key, { ttl: 30_000, autoExtend: false });
      const waiting = waiter.acquire(key, { ttl: 30_000, wait: 10_000 });
      // Subscribed on the first master, then past its attempt right after subscribing: asleep.
      while (Number((await observer.pubsub('NUMSUB', `lock-released:bench:${key}`))[1]) < 1) await sleep(1);
      await sleep(20);
      const released = performance.now();
      await held.release();
      const handle = await waiting;
      if (i >= 5) latencies.push(performance.now() - released); // the first few warm up
      await handle.release();
    }
  } finally {
    await Promise.allSettled([releaser.onApplicationShutdown(), waiter.onApplicationShutdown()]);
  }
  const s = sorted(latencies);
  report.add({
    scenario: 'redlock: hand-over between services, from the release call',
    impl,
    handovers: s.length,
    p50Ms: round(percentile(s, 50), 1),
    p99Ms: round(percentile(s, 99), 1),
    maxMs: round(s[s.length - 1], 1),
    over100Ms: s.filter((ms) => ms > 100).length,
  });
}

/** Acquire latency (release untimed) for one master, 3 and 5 masters, ours and the package's. */
async function acquisitionLatency(
  report: Report,
  scenario: string,
  ports: readonly number[],
  count: number,
  connect: (ports: readonly number[]) => Redis[],
  service: (ports: readonly number[]) => LockService,
  redisService: (port: number) => LockService,
  extra: Record<string, () => Promise<number>> = {},
): Promise<void> {
  const [single] = connect(ports.slice(0, 1));
  const sequential = connect(ports.slice(0, 3));
  let n = 0;
  const impls: Record<string, () => Promise<number>> = {
    'single redis (nearest): SET NX PX': async () => {
      const key = `bench:raw:${n++}`;
      const sample = await timed(() => single.set(key, 'x', 'PX', 30_000, 'NX'));
      await single.del(key);
      return sample;
    },
    // The alternative to Redlock: our Redis backend on one server (fencing tokens included).
    'ours, single redis (nearest): RedisLockBackend': acquireWith(redisService(ports[0])),
    'ours, 3 masters': acquireWith(service(ports.slice(0, 3))),
    'ours, 5 masters': acquireWith(service(ports)),
    'redlock pkg, 3 masters (retryCount 0)': redlockAcquire(new Redlock(connect(ports.slice(0, 3)), { retryCount: 0 })),
    'redlock pkg, 5 masters (retryCount 0)': redlockAcquire(new Redlock(connect(ports), { retryCount: 0 })),
    '3 masters one after another (a sum)': async () => {
      const key = `bench:seq:${n++}`;
      const sample = await timed(async () => {
        for (const client of sequential) await client.set(key, 'x', 'PX', 30_000, 'NX');
      });
      await Promise.all(sequential.map((client) => client.del(key)));
      return sample;
    },
    ...extra,
  };
  const samples: Record<string, number[]> = Object.fromEntries(Object.keys(impls).map((name) => [name, []]));
  for (const op of Object.values(impls)) for (let i = 0; i < Math.min(200, count / 4); i++) await op(); // JIT, script cache
  // Interleaved rounds: a noisy neighbour hits every implementation alike.
  for (let r = 0; r < 10; r++) {
    for (const [name, op] of Object.entries(impls)) {
      for (let i = 0; i < count / 10; i++) samples[name].push(await op());
    }
  }
  const p50Single = percentile(sorted(samples['single redis (nearest): SET NX PX']), 50);
  for (const [impl, values] of Object.entries(samples)) {
    const s = sorted(values);
    const p50 = percentile(s, 50);
    report.add({
      scenario,
      impl,
      samples: s.length,
      p50Ms: round(p50, 3),
      p99Ms: round(percentile(s, 99), 3),
      vsSingleP50: round(p50 / p50Single),
    });
  }
}

/** ms one call takes; the clean-up after it is not timed. */
async function timed(op: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await op();
  return performance.now() - started;
}

function acquireWith(locks: LockService): () => Promise<number> {
  let n = 0;
  return async () => {
    let handle: Awaited<ReturnType<LockService['acquire']>> | undefined;
    const sample = await timed(async () => {
      handle = await locks.acquire(`lat:${n++}`, { wait: 0 });
    });
    await handle!.release();
    return sample;
  };
}

function redlockAcquire(redlock: Redlock): () => Promise<number> {
  let n = 0;
  return async () => {
    let lock: { release(): Promise<unknown> } | undefined;
    const sample = await timed(async () => {
      lock = await redlock.acquire([`bench:pkg:${n++}`], 30_000);
    });
    await lock!.release();
    return sample;
  };
}

function sorted(values: readonly number[]): number[] {
  return [...values].sort((a, b) => a - b);
}

/**
 * WORKERS workers each run SECTIONS critical sections of SECTION_MS on one key. The ideal rate is
 * one section per SECTION_MS; the FIFO bound on a wait is about WORKERS x SECTION_MS.
 */
async function hotKey(acquire: (worker: number, failed: () => void) => Promise<() => Promise<unknown>>): Promise<Record<string, number>> {
  const waits: number[] = [];
  let failures = 0;
  let inside = 0;
  let violations = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: WORKERS }, async (_, worker) => {
      for (let i = 0; i < SECTIONS; i++) {
        const asked = performance.now();
        const release = await acquire(worker, () => failures++);
        waits.push(performance.now() - asked);
        if (++inside > 1) violations++;
        await new Promise((resolve) => setTimeout(resolve, SECTION_MS));
        inside--;
        await release();
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const s = sorted(waits);
  const rate = (WORKERS * SECTIONS) / seconds;
  return {
    sectionsPerSec: Math.round(rate),
    vsIdeal: round(rate / (1000 / SECTION_MS)),
    waitP50Ms: round(percentile(s, 50), 1),
    waitP99Ms: round(percentile(s, 99), 1),
    waitMaxMs: round(s[s.length - 1], 1),
    failures,
    violations,
  };
}
