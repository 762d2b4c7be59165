import 'reflect-metadata';
import { Redis } from 'ioredis';
// @ts-expect-error: node-zookeeper-client ships no types; the floor below uses two of its calls.
import zookeeper from 'node-zookeeper-client';
import { performance } from 'node:perf_hooks';
import { LockService, RedisLockBackend, ZooKeeperLockBackend } from '../lib/index.js';
import { RedisServer } from '../test/support/redis-server.js';
import { ZooKeeperServer } from '../test/support/zookeeper-server.js';
import { compareRates, hotKeyRow, type HotKeyScenario, round, timedSections, type Report } from './harness.js';

/** One acquire+release pair, or a hot-key worker's lock: resolves to the release. */
type LockOnce = (key: string) => Promise<() => Promise<unknown>>;

interface RawClient {
  create(path: string, data: Buffer | null, mode: number, callback: (error: Error | null, path: string) => void): void;
  remove(path: string, version: number, callback: (error: Error | null) => void): void;
  once(event: 'connected', listener: () => void): void;
  connect(): void;
  close(): void;
}

/**
 * ZooKeeper backend on one server and on an ensemble of three, both of the bench's own (Debian's
 * zookeeper package, writes not fsynced, as the test harness runs them), next to the least a
 * ZooKeeper lock can cost (create an ephemeral node, delete it) and the Redis backend on a
 * redis-server of its own, in the same run.
 */
export async function zookeeperBench(report: Report): Promise<void> {
  report.note('zookeeper: uncontended pairs, hot key (starts its own ZooKeeper, a 3-server ensemble and a redis-server)');
  const single = await ZooKeeperServer.start({ tickTime: 2_000 });
  const ensemble = await ZooKeeperServer.startEnsemble({ tickTime: 2_000 });
  const redis = await RedisServer.start();
  const closers: (() => unknown)[] = [];
  const service = (backend: ZooKeeperLockBackend | RedisLockBackend) => {
    const created = new LockService(backend);
    closers.push(() => created.onApplicationShutdown());
    return created;
  };
  const zk = (server: ZooKeeperServer) => service(new ZooKeeperLockBackend(server.connectionString, { root: '/bench' }));
  try {
    await uncontended(report, single, ensemble, redis, zk, service, closers);
    await hotKey(report, single, ensemble, redis, zk, service);
  } finally {
    for (const close of closers) await close();
    await redis.stop();
    await single.stop();
    await ensemble.stop();
  }
}

async function uncontended(
  report: Report,
  single: ZooKeeperServer,
  ensemble: ZooKeeperServer,
  redis: RedisServer,
  zk: (server: ZooKeeperServer) => LockService,
  service: (backend: RedisLockBackend) => LockService,
  closers: (() => unknown)[],
): Promise<void> {
  const raw = await rawClient(single.connectionString);
  closers.push(() => raw.close());
  const backend = new ZooKeeperLockBackend(single.connectionString, { root: '/bench-backend' });
  closers.push(() => backend.close());
  const [one, three] = [zk(single), zk(ensemble)];
  const redisClient = new Redis(redis.port, '127.0.0.1');
  closers.push(() => redisClient.disconnect());
  const onRedis = service(new RedisLockBackend(redisClient));
  await new Promise<void>((resolve) => raw.create('/floor', null, 0, () => resolve()));
  let token = 0;
  const viaService =
    (locks: LockService): LockOnce =>
    async (key) => {
      const handle = await locks.acquire(key, { wait: 60_000 });
      return () => handle.release();
    };
  const impls: Record<string, LockOnce> = {
    // The least a ZooKeeper lock costs: one ephemeral sequential create, one delete (two writes).
    'raw floor (create ephemeral + delete), one server': async () => {
      const path = await new Promise<string>((resolve, reject) =>
        raw.create('/floor/n-', null, 3, (error, created) => (error ? reject(error) : resolve(created))),
      );
      return () => new Promise<void>((resolve, reject) => raw.remove(path, -1, (error) => (error ? reject(error) : resolve())));
    },
    // The backend alone (no handle, lease or watchdog): what the recipe costs.
    'ours (backend only), one server': async (key) => {
      const owner = `owner-${++token}`;
      if (!(await backend.tryAcquire([key], owner, 30_000, { willWait: false })).acquired) throw new Error('ours: busy');
      return () => backend.release([key], owner);
    },
    'ours, one server': viaService(one),
    'ours, three servers': viaService(three),
    'Redis backend': viaService(onRedis),
  };
  const rates = await compareRates(
    Object.fromEntries(Object.entries(impls).map(([impl, lock]) => [impl, async () => (await lock(`pair:${impl}`))()])),
    { rounds: 5, ms: 600, warmupMs: 300 },
  );
  const floor = rates['raw floor (create ephemeral + delete), one server'];
  for (const [impl, opsPerSec] of Object.entries(rates)) {
    report.add({
      scenario: 'zookeeper: uncontended acquire+release (serial, one session)',
      impl,
      opsPerSec: Math.round(opsPerSec),
      usPerPair: round(1e6 / opsPerSec, 1),
      vsFloor: round(floor / opsPerSec),
    });
  }
}

const HOT_KEY: HotKeyScenario = { workers: 8, sections: 50, sectionMs: 1, scenario: 'zookeeper: hot key, 8 workers x 50 sections of 1 ms' };

async function hotKey(
  report: Report,
  single: ZooKeeperServer,
  ensemble: ZooKeeperServer,
  redis: RedisServer,
  zk: (server: ZooKeeperServer) => LockService,
  service: (backend: RedisLockBackend) => LockService,
): Promise<void> {
  const { workers, sections, sectionMs } = HOT_KEY;
  const run = async (impl: string, lockFor: (worker: number) => LockOnce) => {
    const key = `hot:${impl}`;
    const rounds = (count: number, waits: number[], inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(() => lockFor(w)(key), count, sectionMs, waits, inside)));
    await rounds(5, [], []); // warm: sessions, parent nodes, JIT
    const waits: number[] = [];
    const inside: number[] = [];
    const started = performance.now();
    await rounds(sections, waits, inside);
    report.add(hotKeyRow(HOT_KEY, impl, performance.now() - started, waits, inside));
  };
  const viaService = (locks: LockService) => async (key: string) => {
    const handle = await locks.acquire(key, { wait: 60_000 });
    return () => handle.release();
  };
  // Every worker is its own "instance": a session and a service of its own.
  const onOne = Array.from({ length: workers }, () => viaService(zk(single)));
  await run('ours, one server (8 instances)', (w) => onOne[w]);
  const onThree = Array.from({ length: workers }, () => viaService(zk(ensemble)));
  await run('ours, three servers (8 instances)', (w) => onThree[w]);
  const shared = viaService(zk(single));
  await run('ours, one server (one instance, 8 callers)', () => shared);
  const redisClients = Array.from({ length: workers }, () => new Redis(redis.port, '127.0.0.1'));
  const onRedis = redisClients.map((client) => viaService(service(new RedisLockBackend(client))));
  await run('Redis backend (8 instances)', (w) => onRedis[w]);
  for (const client of redisClients) client.disconnect();
}

async function rawClient(connectionString: string): Promise<RawClient> {
  const client = (zookeeper as { createClient(s: string, o: object): RawClient }).createClient(connectionString, {
    sessionTimeout: 10_000,
  });
  await new Promise<void>((resolve) => {
    client.once('connected', resolve);
    client.connect();
  });
  return client;
}
