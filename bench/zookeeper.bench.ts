import 'reflect-metadata';
import { Redis } from 'ioredis';
// @ts-expect-error: node-zookeeper-client ships no types; the floors below use three of its calls.
import zookeeper from 'node-zookeeper-client';
import { performance } from 'node:perf_hooks';
import { LockService, RedisLockBackend, ZooKeeperLockBackend } from '../lib/index.js';
import { RedisServer } from '../test/support/redis-server.js';
import { ZooKeeperServer } from '../test/support/zookeeper-server.js';
import {
  againstHandoffFloor,
  compareRates,
  type HandoffFloor,
  handoffFloorRow,
  hotKeyRow,
  type HotKeyScenario,
  measureHandoffFloor,
  measureOurHandoff,
  ourHandoffRow,
  round,
  timedSections,
  type Report,
} from './harness.js';

/** One acquire+release pair, or a hot-key worker's lock: resolves to the release. */
type LockOnce = (key: string) => Promise<() => Promise<unknown>>;

interface RawClient {
  create(path: string, data: Buffer | null, mode: number, callback: (error: Error | null, path: string) => void): void;
  remove(path: string, version: number, callback: (error: Error | null) => void): void;
  getData(path: string, watcher: () => void, callback: (error: (Error & { getName?(): string }) | null) => void): void;
  once(event: 'connected', listener: () => void): void;
  connect(): void;
  close(): void;
}

/**
 * ZooKeeper backend on one server and on an ensemble of three, both of the bench's own (Debian's
 * zookeeper package, writes not fsynced, as the test harness runs them), next to the least a
 * ZooKeeper lock can cost on each (create an ephemeral node, delete it; a delete until the next
 * waiter's watch fires) and the Redis backend on a redis-server of its own, in the same run.
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
  const zk = (connectionString: string) => service(new ZooKeeperLockBackend(connectionString, { root: '/bench' }));
  try {
    // Two followers of the ensemble, by connection string: a write sent to a follower goes through
    // the leader and back, one sent to the leader does not, so a floor and what it bounds must
    // talk to the same kind of member (2 of 3 sessions land on a follower).
    const leader = await ensemble.leader();
    const followers = ensemble.ports.filter((_, i) => i + 1 !== leader).map((port) => `127.0.0.1:${port}`);
    await uncontended(report, single, followers[0], redis, zk, service, closers);
    await hotKey(report, single, ensemble, followers, redis, zk, service, closers);
  } finally {
    for (const close of closers) await close();
    await redis.stop();
    await single.stop();
    await ensemble.stop();
  }
}

const FLOOR_ONE = 'raw floor (create ephemeral + delete), one server';
const FLOOR_THREE = 'raw floor (create ephemeral + delete), three servers, on a follower';

async function uncontended(
  report: Report,
  single: ZooKeeperServer,
  follower: string,
  redis: RedisServer,
  zk: (connectionString: string) => LockService,
  service: (backend: RedisLockBackend) => LockService,
  closers: (() => unknown)[],
): Promise<void> {
  const [rawOne, rawThree] = [await rawClient(single.connectionString), await rawClient(follower)];
  closers.push(
    () => rawOne.close(),
    () => rawThree.close(),
  );
  const backend = new ZooKeeperLockBackend(single.connectionString, { root: '/bench-backend' });
  closers.push(() => backend.close());
  const [one, three] = [zk(single.connectionString), zk(follower)];
  const redisClient = new Redis(redis.port, '127.0.0.1');
  closers.push(() => redisClient.disconnect());
  const onRedis = service(new RedisLockBackend(redisClient));
  for (const raw of [rawOne, rawThree]) await new Promise<void>((resolve) => raw.create('/floor', null, 0, () => resolve()));
  let token = 0;
  const viaService =
    (locks: LockService): LockOnce =>
    async (key) => {
      const handle = await locks.acquire(key, { wait: 60_000 });
      return () => handle.release();
    };
  // The least a ZooKeeper lock costs: one ephemeral sequential create, one delete (two writes).
  const rawFloor =
    (raw: RawClient): LockOnce =>
    async () => {
      const path = await new Promise<string>((resolve, reject) =>
        raw.create('/floor/n-', null, 3, (error, created) => (error ? reject(error) : resolve(created))),
      );
      return () => new Promise<void>((resolve, reject) => raw.remove(path, -1, (error) => (error ? reject(error) : resolve())));
    };
  const impls: Record<string, LockOnce> = {
    [FLOOR_ONE]: rawFloor(rawOne),
    // The backend alone (no handle, lease or watchdog): what the recipe costs.
    'ours (backend only), one server': async (key) => {
      const owner = `owner-${++token}`;
      if (!(await backend.tryAcquire([key], owner, 30_000, { willWait: false })).acquired) throw new Error('ours: busy');
      return () => backend.release([key], owner);
    },
    'ours, one server': viaService(one),
    [FLOOR_THREE]: rawFloor(rawThree),
    'ours, three servers, on a follower': viaService(three),
    'Redis backend': viaService(onRedis),
  };
  const rates = await compareRates(
    Object.fromEntries(Object.entries(impls).map(([impl, lock]) => [impl, async () => (await lock(`pair:${impl}`))()])),
    { rounds: 5, ms: 600, warmupMs: 300 },
  );
  for (const [impl, opsPerSec] of Object.entries(rates)) {
    // Each row against the floor on its own servers (the Redis backend's against one server's).
    const floor = impl.includes('three servers') ? FLOOR_THREE : FLOOR_ONE;
    report.add({
      scenario: 'zookeeper: uncontended acquire+release (serial, one session)',
      impl,
      opsPerSec: Math.round(opsPerSec),
      usPerPair: round(1e6 / opsPerSec, 1),
      vsFloor: round(rates[floor] / opsPerSec),
      floor: impl.includes('three servers') ? 'three servers' : 'one server',
    });
  }
}

const HOT_KEY: HotKeyScenario = { workers: 8, sections: 50, sectionMs: 1, scenario: 'zookeeper: hot key, 8 workers x 50 sections of 1 ms' };

async function hotKey(
  report: Report,
  single: ZooKeeperServer,
  ensemble: ZooKeeperServer,
  followers: string[],
  redis: RedisServer,
  zk: (connectionString: string) => LockService,
  service: (backend: RedisLockBackend) => LockService,
  closers: (() => unknown)[],
): Promise<void> {
  const { workers, sections, sectionMs, scenario } = HOT_KEY;
  // The floors drift over a run, so each is measured on both sides of the hot-key rows, and the
  // lower one bounds them (as the Redis group does).
  const floorOf = async (holderAt: string, waiterAt: string) => {
    const [holder, waiter] = [await rawClient(holderAt), await rawClient(waiterAt)];
    closers.push(
      () => holder.close(),
      () => waiter.close(),
    );
    await new Promise<void>((resolve) => holder.create('/handoff', null, 0, () => resolve()));
    return () => measureHandoffFloor(() => handoffOnce(holder, waiter), sectionMs);
  };
  // On three servers the holder and the next waiter sit on the two followers: the delete goes
  // through the leader, and the waiter's server hears of it when it applies the commit.
  const [floorOne, floorThree] = [
    await floorOf(single.connectionString, single.connectionString),
    await floorOf(followers[0], followers[1]),
  ];
  const before = { one: await floorOne(), three: await floorThree() };
  const rows: { impl: string; elapsed: number; waits: number[]; inside: number[]; floor?: 'one' | 'three' }[] = [];
  const run = async (impl: string, lockFor: (worker: number) => LockOnce, floor?: 'one' | 'three') => {
    const key = `hot:${impl}`;
    const rounds = (count: number, waits: number[], inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(() => lockFor(w)(key), count, sectionMs, waits, inside)));
    // Warm: sessions, parent nodes, and the servers' JIT. A JVM compiles its hot paths over the
    // first thousands of requests: on a cold one a section cost ZooKeeper twice the CPU it does
    // after 8 000 (bench/zookeeper-hot-key.probe.ts), and the rows measured the compiler.
    await rounds(sections, [], []);
    const waits: number[] = [];
    const inside: number[] = [];
    const started = performance.now();
    await rounds(sections, waits, inside);
    rows.push({ impl, elapsed: performance.now() - started, waits, inside, floor });
  };
  const viaService = (locks: LockService) => async (key: string) => {
    const handle = await locks.acquire(key, { wait: 60_000 });
    return () => handle.release();
  };
  // Every worker is its own "instance": a session and a service of its own.
  const onOne = Array.from({ length: workers }, () => viaService(zk(single.connectionString)));
  await run('ours, one server (8 instances)', (w) => onOne[w], 'one');
  const onThree = Array.from({ length: workers }, () => viaService(zk(ensemble.connectionString)));
  await run('ours, three servers (8 instances)', (w) => onThree[w], 'three');
  const shared = viaService(zk(single.connectionString));
  await run('ours, one server (one instance, 8 callers)', () => shared, 'one');
  const redisClients = Array.from({ length: workers }, () => new Redis(redis.port, '127.0.0.1'));
  const onRedis = redisClients.map((client) => viaService(service(new RedisLockBackend(client))));
  await run('Redis backend (8 instances)', (w) => onRedis[w]);
  for (const client of redisClients) client.disconnect();
  const lower = (a: HandoffFloor, b: HandoffFloor) => (a.p50Ms <= b.p50Ms ? a : b);
  const floors = { one: lower(before.one, await floorOne()), three: lower(before.three, await floorThree()) };
  const ours = {
    one: await measureOurHandoff(zk(single.connectionString), zk(single.connectionString), 'handoff:ours', sectionMs),
    three: await measureOurHandoff(zk(followers[0]), zk(followers[1]), 'handoff:ours', sectionMs),
  };
  for (const { impl, elapsed, waits, inside, floor } of rows) {
    const row = hotKeyRow(HOT_KEY, impl, elapsed, waits, inside);
    report.add(floor ? againstHandoffFloor(row, HOT_KEY, elapsed, inside, floors[floor]) : row);
  }
  report.add(handoffFloorRow(scenario, "handoff floor (delete, until the next waiter's watch fires), one server", floors.one));
  report.add(
    handoffFloorRow(
      scenario,
      "handoff floor (delete, until the next waiter's watch fires), three servers, follower to follower",
      floors.three,
    ),
  );
  report.add(ourHandoffRow(scenario, 'ours, one hand-over between two instances (p50), one server', ours.one, floors.one));
  report.add(
    ourHandoffRow(
      scenario,
      'ours, one hand-over between two instances (p50), three servers, follower to follower',
      ours.three,
      floors.three,
    ),
  );
}

/**
 * One hand-over at its least: the holder's ephemeral node, which the waiter watches (both set up
 * now); the hand-over deletes it and resolves when the waiter's watch fires. (A follower answers
 * reads from what it applied so far: the waiter's server may not have the node yet, so it asks
 * again until it does. getData, not exists: it leaves no watch on a missing node.)
 */
async function handoffOnce(holder: RawClient, waiter: RawClient): Promise<() => Promise<void>> {
  const path = await new Promise<string>((resolve, reject) =>
    holder.create('/handoff/n-', null, 3, (error, created) => (error ? reject(error) : resolve(created))),
  );
  let fired!: () => void;
  const event = new Promise<void>((resolve) => (fired = resolve));
  const deadline = performance.now() + 10_000;
  for (;;) {
    const missing = await new Promise<boolean>((resolve, reject) =>
      waiter.getData(
        path,
        () => fired(),
        (error) => {
          if (error?.getName?.() === 'NO_NODE') resolve(true);
          else if (error) reject(error);
          else resolve(false);
        },
      ),
    );
    if (!missing) break;
    if (performance.now() > deadline) throw new Error(`the waiter's server did not see ${path} within 10 s`);
  }
  return () => Promise.race([event, new Promise<never>((_, reject) => holder.remove(path, -1, (error) => error && reject(error)))]);
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
