import 'reflect-metadata';
import { Redis } from 'ioredis';
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
// @ts-expect-error redlock 5.0.0-beta.2 lists no "types" in its exports map, so nodenext cannot see its typings.
import RedlockPackage from 'redlock';
import { Mutex } from 'redis-semaphore';
import { createLock, IoredisAdapter } from 'redlock-universal';
import { LockService, RedisLockBackend } from '../lib/index.js';
import { RedisServer } from '../test/support/redis-server.js';
import { compareRates, hotKeyRow, type HotKeyScenario, latencies, percentile, round, timedSections, type Report } from './harness.js';
import { Orders, ordersApp } from './orders.fixture.js';

/** The part of the redlock package's public API the bench uses. */
interface Redlock {
  acquire(resources: string[], duration: number): Promise<{ release(): Promise<unknown> }>;
}
const Redlock = RedlockPackage as new (clients: Redis[], settings?: { retryCount?: number }) => Redlock;

/** Releases only if the value is ours: the usual compare-and-delete, the floor's release. */
const CAS_DELETE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/** One acquire+release pair, or a hot-key worker's lock, per implementation under test. */
type LockOnce = (key: string) => Promise<() => Promise<unknown>>;

/**
 * Redis backend next to the raw floor and the Redis lock packages people use, on a redis-server
 * of the bench's own: uncontended pairs, @Locked overhead, and a hot key.
 */
export async function redisBench(report: Report): Promise<void> {
  report.note('redis: uncontended pairs, @Locked overhead, hot key (starts its own redis-server)');
  const server = await RedisServer.start();
  const clients: Redis[] = [];
  const client = () => {
    const created = new Redis(server.port, '127.0.0.1');
    clients.push(created);
    return created;
  };
  const services: LockService[] = [];
  const service = (redis: Redis) => {
    const created = new LockService(new RedisLockBackend(redis));
    services.push(created);
    return created;
  };
  try {
    await uncontended(report, client, service);
    await lockedOverhead(report, client);
    await hotKey(report, client, service, server.port);
  } finally {
    await Promise.all(services.map((s) => s.onApplicationShutdown()));
    for (const c of clients) c.disconnect();
    await server.stop();
  }
}

/** Each implementation's way to take a lock and get its release, over a client of its own. */
function peers(client: () => Redis, service: (redis: Redis) => LockService, waiting: boolean): Record<string, LockOnce> {
  const floor = client();
  let floorToken = 0;
  const ours = service(client());
  const redlock = new Redlock([client()], waiting ? { retryCount: 100_000 } : { retryCount: 0 });
  const semaphoreClient = client();
  const universalAdapter = new IoredisAdapter(client());
  return {
    'raw-floor': async (key) => {
      const token = String(++floorToken);
      if ((await floor.set(key, token, 'PX', 30_000, 'NX')) !== 'OK') throw new Error('raw floor: busy');
      return () => floor.eval(CAS_DELETE, 1, key, token);
    },
    ours: async (key) => {
      const handle = await ours.acquire(key, { wait: 60_000 });
      return () => handle.release();
    },
    redlock: async (key) => {
      const lock = await redlock.acquire([key], 30_000);
      return () => lock.release();
    },
    'redis-semaphore': async (key) => {
      const mutex = new Mutex(semaphoreClient, key, { lockTimeout: 30_000, acquireTimeout: 60_000 });
      await mutex.acquire();
      return () => mutex.release();
    },
    'redlock-universal': async (key) => {
      const lock = createLock({ adapter: universalAdapter, key, ttl: 30_000, retryAttempts: waiting ? 100_000 : 0 });
      const handle = await lock.acquire();
      return () => lock.release(handle);
    },
  };
}

async function uncontended(report: Report, client: () => Redis, service: (redis: Redis) => LockService): Promise<void> {
  const impls = peers(client, service, false);
  // The floor's script is loaded once, like every peer's, so EVAL vs EVALSHA does not count.
  const floorClient = client();
  floorClient.defineCommand('casDelete', { numberOfKeys: 1, lua: CAS_DELETE });
  let token = 0;
  impls['raw-floor'] = async (key) => {
    const mine = String(++token);
    if ((await floorClient.set(key, mine, 'PX', 30_000, 'NX')) !== 'OK') throw new Error('raw floor: busy');
    return () => (floorClient as Redis & { casDelete(key: string, token: string): Promise<number> }).casDelete(key, mine);
  };
  // The backend alone (its two scripts, no handle, lease or watchdog): what the protocol costs.
  const backend = new RedisLockBackend(client());
  let owner = 0;
  impls['ours (backend only)'] = async (key) => {
    const mine = `owner-${++owner}`;
    if (!(await backend.tryAcquire([key], mine, 30_000, { willWait: false })).acquired) throw new Error('ours (backend only): busy');
    return () => backend.release([key], mine);
  };
  const rates = await compareRates(
    Object.fromEntries(Object.entries(impls).map(([impl, lock]) => [impl, async () => (await lock(`pair:${impl}`))()])),
    { rounds: 5, ms: 600, warmupMs: 300 },
  );
  await backend.close();
  for (const [impl, opsPerSec] of Object.entries(rates)) {
    report.add({
      scenario: 'redis: uncontended acquire+release (serial, one connection)',
      impl,
      opsPerSec: Math.round(opsPerSec),
      usPerPair: round(1e6 / opsPerSec, 1),
      vsFloor: round(rates['raw-floor'] / opsPerSec),
    });
  }
}

async function lockedOverhead(report: Report, client: () => Redis): Promise<void> {
  const redis = client();
  const app = await ordersApp({ backend: new RedisLockBackend(redis) });
  try {
    const orders = app.get(Orders);
    const calls = 3_000;
    await latencies(() => orders.locked(1), 500); // warm-up: connection, script, JIT
    const ping = percentile(await latencies(() => redis.ping(), calls), 50);
    // The floor of a call that must acquire: one acquire script on a free key, nothing else. A
    // script round trip costs more than a PING (Redis runs Lua, the request and answer are longer).
    const backend = new RedisLockBackend(redis);
    let owner = 0;
    const script = percentile(
      await latencies(() => backend.tryAcquire([`floor:${++owner}`], `floor-${owner}`, 1_000, { willWait: false }), calls),
      50,
    );
    const plain = percentile(await latencies(() => orders.plain(1), calls), 50);
    const locked = percentile(await latencies(() => orders.locked(1), calls), 50);
    await backend.close();
    for (const [impl, p50] of [
      ['plain', plain],
      ['one acquire script (the backend alone)', script + plain],
      ['@Locked', locked],
    ] as const) {
      report.add({
        scenario: 'redis: @Locked method call overhead (p50)',
        impl,
        p50Us: round(p50 * 1000, 1),
        overheadUs: round((p50 - plain) * 1000, 1),
        // Release is sent after the method returns, off the caller's path: one round trip (acquire).
        roundTrips: round((p50 - plain) / ping, 2),
        vsAcquireScript: round((p50 - plain) / script, 2),
        pingUs: round(ping * 1000, 1),
      });
    }
  } finally {
    await app.close();
  }
}

const HOT_KEY: HotKeyScenario = { workers: 8, sections: 50, sectionMs: 1, scenario: 'redis: hot key, 8 workers x 50 sections of 1 ms' };

async function hotKey(report: Report, client: () => Redis, service: (redis: Redis) => LockService, port: number): Promise<void> {
  const { workers, sections, sectionMs } = HOT_KEY;
  const rounds = (key: string, lockFor: (worker: number) => LockOnce, count: number, waits: number[], inside: number[]) =>
    Promise.all(Array.from({ length: workers }, (_, worker) => timedSections(() => lockFor(worker)(key), count, sectionMs, waits, inside)));
  const run = async (impl: string, lockFor: (worker: number) => LockOnce) => {
    const key = `hot:${impl}`;
    // A short unmeasured run first, for every implementation alike: connections, scripts,
    // subscriptions and JIT are warm when the clock starts.
    await rounds(key, lockFor, 5, [], []);
    const waits: number[] = [];
    const inside: number[] = [];
    const started = performance.now();
    await rounds(key, lockFor, sections, waits, inside);
    report.add(hotKeyRow(HOT_KEY, impl, performance.now() - started, waits, inside));
  };

  // The floor drifts over a run (here it was lower after the hot-key rows than before them), so it
  // is measured on both sides of them, and the lower one bounds them.
  const floorBefore = await handoffMs(client, sectionMs);
  // Every worker is its own "instance": a client and a lock object of its own, as in production.
  const perWorker = Array.from({ length: workers }, () => peers(client, service, true));
  await run('ours', (worker) => perWorker[worker].ours);
  // Eight callers of one app instance: they queue in-process and hand over without pub/sub.
  const shared = service(client());
  await run('ours (one instance, 8 callers)', () => async (key) => {
    const handle = await shared.acquire(key, { wait: 60_000 });
    return () => handle.release();
  });
  for (const impl of ['redlock', 'redis-semaphore', 'redlock-universal']) await run(impl, (worker) => perWorker[worker][impl]);
  // Between processes every hand-over pays at least the floor: the rows say how close they come.
  const cap = await handoffCap(floorBefore, sectionMs);
  await hotKeyProcesses(report, port, 'ours (8 processes)', 8, 1, 0, cap);
  // Two app instances of 4 callers each: strict arrival order, then local hand-overs first up to 4 in a row.
  await hotKeyProcesses(report, port, 'ours (2 processes x 4 callers)', 2, 4, 0, cap);
  await hotKeyProcesses(report, port, 'ours (2 processes x 4 callers, localHandoffs: 4)', 2, 4, 4, cap);
  await handoffFloor(report, Math.min(floorBefore, await handoffMs(client, sectionMs)), sectionMs);
  await localFloor(report, client, sectionMs);
}

/**
 * The hot key with each worker in a process of its own, as separate app instances would be. On a
 * machine with fewer cores than workers they compete for the CPU, which shows in the rate.
 */
async function hotKeyProcesses(
  report: Report,
  port: number,
  impl: string,
  processes: number,
  callers: number,
  localHandoffs: number,
  cap: number,
): Promise<void> {
  const { sections, sectionMs } = HOT_KEY;
  const worker = new URL('./hot-key.worker.js', import.meta.url);
  const key = `hot:${impl}`;
  const children: ChildProcess[] = Array.from({ length: processes }, () =>
    fork(worker, [String(port), key, String(sections), String(sectionMs), String(callers), String(localHandoffs)]),
  );
  try {
    const answers = (message?: string) =>
      Promise.all(
        children.map((child) => {
          const answer = once(child, 'message');
          if (message !== undefined) child.send(message);
          return answer.then(([reply]) => reply as { waits: number[]; inside: number[] });
        }),
      );
    await answers(); // each says it is ready
    await answers('warm');
    const started = performance.now();
    const results = await answers('go');
    const elapsed = performance.now() - started;
    const row = hotKeyRow(
      HOT_KEY,
      impl,
      elapsed,
      results.flatMap((r) => r.waits),
      results.flatMap((r) => r.inside),
    );
    report.add({ ...row, vsHandoffCap: round((row.vsIdeal as number) / cap) });
  } finally {
    for (const child of children) child.kill();
  }
}

/**
 * The least any lock can spend handing over between processes through Redis on this machine: a
 * PUBLISH sent after an idle section, until another connection's subscriber has it (p50, ms). A hot
 * key pays it once per section, so it bounds the best rate a cross-process lock can reach here.
 */
async function handoffMs(client: () => Redis, sectionMs: number): Promise<number> {
  const [publisher, subscriber] = [client(), client()];
  await subscriber.subscribe('bench:handoff');
  let delivered: (() => void) | undefined;
  subscriber.on('message', () => delivered?.());
  const samples: number[] = [];
  for (let i = 0; i < 300; i++) {
    await sleep(sectionMs);
    const arrived = new Promise<void>((resolve) => (delivered = resolve));
    const sent = performance.now();
    await publisher.publish('bench:handoff', 'x');
    await arrived;
    samples.push(performance.now() - sent);
  }
  samples.sort((a, b) => a - b);
  return percentile(samples, 50);
}

/** The floor's row: `floorMs` per handover, and the best rate a hot key can reach with it. */
async function handoffFloor(report: Report, floorMs: number, sectionMs: number): Promise<void> {
  const section = 1000 / (await sleepRate(sectionMs));
  report.add({
    scenario: HOT_KEY.scenario,
    impl: 'handoff floor (one PUBLISH after an idle section)',
    handoffP50Us: round(floorMs * 1000, 1),
    bestVsIdeal: round(section / (section + floorMs)),
  });
}

/** The best "vs ideal" a hand-over between processes allows, `floorMs` per hand-over. */
async function handoffCap(floorMs: number, sectionMs: number): Promise<number> {
  const section = 1000 / (await sleepRate(sectionMs));
  return section / (section + floorMs);
}

/**
 * The least a hand-over inside one process costs: one script round trip (a compare-and-delete)
 * sent after an idle section, until its answer is read (p50). The release that hands the lock to a
 * waiter of its own process is one such round trip; so it bounds the one-process row. The second
 * row is that release itself, the backend's script handing a held key to a waiter of its own
 * process with a new fencing token, timed the same way: the one-process row pays it per hand-over,
 * and the JavaScript of the lease and handle on both sides of it.
 */
async function localFloor(report: Report, client: () => Redis, sectionMs: number): Promise<void> {
  const redis = client();
  const backend = new RedisLockBackend(client());
  const floor: number[] = [];
  const handover: number[] = [];
  for (let i = 0; i < 300; i++) {
    await sleep(sectionMs);
    let sent = performance.now();
    await redis.eval(CAS_DELETE, 1, 'bench:local-floor', 'x');
    floor.push(performance.now() - sent);
    const key = `bench:local-handover:${i}`;
    await backend.tryAcquire([key], `holder-${i}`, 30_000, { willWait: false });
    await backend.tryAcquire([key], `waiter-${i}`, 30_000, { willWait: true });
    await sleep(sectionMs);
    sent = performance.now();
    await backend.release([key], `holder-${i}`);
    handover.push(performance.now() - sent);
    await backend.release([key], `waiter-${i}`);
  }
  await backend.close();
  const section = 1000 / (await sleepRate(sectionMs));
  for (const [impl, samples] of [
    ['local handoff floor (one script round trip after an idle section)', floor],
    ['our hand-over script alone (one round trip after an idle section)', handover],
  ] as const) {
    const ms = percentile(
      samples.sort((a, b) => a - b),
      50,
    );
    report.add({ scenario: HOT_KEY.scenario, impl, handoffP50Us: round(ms * 1000, 1), bestVsIdeal: round(section / (section + ms)) });
  }
}

/** How many `ms`-long timer sleeps fit in a second here (a 1 ms sleep lasts a little longer). */
async function sleepRate(ms: number): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < 100; i++) await sleep(ms);
  return (100 * 1000) / (performance.now() - started);
}
