import 'reflect-metadata';
import { Etcd3 } from 'etcd3';
import { Redis } from 'ioredis';
import { performance } from 'node:perf_hooks';
import { EtcdLockBackend, LockService, RedisLockBackend } from '../lib/index.js';
import { EtcdCluster } from '../test/support/etcd-server.js';
import { RedisServer } from '../test/support/redis-server.js';
import {
  againstHandoffFloor,
  compareRates,
  handoffFloorRow,
  hotKeyRow,
  type HotKeyScenario,
  measureHandoffFloor,
  measureOurHandoff,
  measureOurHandoffAfterWait,
  ourHandoffRow,
  round,
  timedSections,
  type Report,
} from './harness.js';

/** One acquire+release pair, or a hot-key worker's lock: resolves to the release. */
type LockOnce = (key: string) => Promise<() => Promise<unknown>>;

/**
 * etcd backend on clusters of the bench's own, one member and three: next to the least an etcd
 * lock can cost (one transaction to put the key, one to delete it, no lease; a delete until the
 * next waiter's watch has it), and the Redis backend on a redis-server of its own, in the same run.
 */
export async function etcdBench(report: Report): Promise<void> {
  report.note('etcd: uncontended pairs and hot key, on one member and on three (starts its own etcd members and redis-server)');
  const redis = await RedisServer.start();
  const closers: (() => unknown)[] = [];
  const service = (backend: EtcdLockBackend | RedisLockBackend) => {
    const created = new LockService(backend);
    closers.push(() => created.onApplicationShutdown());
    return created;
  };
  try {
    for (const members of [1, 3]) {
      const cluster = await EtcdCluster.start({ members });
      try {
        await uncontended(report, cluster, members, service, redis);
        await hotKey(report, cluster, members, service, redis);
      } finally {
        for (const close of closers.splice(0)) await close();
        await cluster.stop();
      }
    }
  } finally {
    await redis.stop();
  }
}

async function uncontended(
  report: Report,
  cluster: EtcdCluster,
  members: number,
  service: (backend: EtcdLockBackend | RedisLockBackend) => LockService,
  redis: RedisServer,
): Promise<void> {
  const raw = new Etcd3({ hosts: cluster.endpoints });
  const backend = new EtcdLockBackend(cluster.endpoints);
  const ours = service(new EtcdLockBackend(cluster.endpoints));
  const redisClient = new Redis(redis.port, '127.0.0.1');
  const viaRedis = service(new RedisLockBackend(redisClient));
  let token = 0;
  const impls: Record<string, LockOnce> = {
    // The least an etcd lock costs: a transaction that puts the key if it is absent, one that deletes it.
    'raw floor (txn put + txn delete)': async (key) => {
      const entry = Buffer.from(`floor/${key}`);
      const put = await raw.kv.txn({
        compare: [{ key: entry, target: 'Create', result: 'Equal', create_revision: 0 }],
        success: [{ request_put: { key: entry, value: Buffer.from(String(++token)) } }],
      });
      if (!put.succeeded) throw new Error('floor: busy');
      return () => raw.kv.txn({ success: [{ request_delete_range: { key: entry } }] });
    },
    // The backend alone (grant, transaction, revoke; no handle, lease or watchdog): what the protocol costs.
    'ours (backend only)': async (key) => {
      const owner = `owner-${++token}`;
      if (!(await backend.tryAcquire([key], owner, 30_000, { willWait: false })).acquired) throw new Error('ours: busy');
      return () => backend.release([key], owner);
    },
    ours: async (key) => {
      const handle = await ours.acquire(key, { wait: 60_000 });
      return () => handle.release();
    },
    'Redis backend': async (key) => {
      const handle = await viaRedis.acquire(key, { wait: 60_000 });
      return () => handle.release();
    },
  };
  const rates = await compareRates(
    Object.fromEntries(Object.entries(impls).map(([impl, lock]) => [impl, async () => (await lock(`pair:${impl}`))()])),
    { rounds: 5, ms: 600, warmupMs: 300 },
  );
  await backend.close();
  raw.close();
  for (const [impl, opsPerSec] of Object.entries(rates)) {
    report.add({
      scenario: `etcd (${members} member${members > 1 ? 's' : ''}): uncontended acquire+release (serial)`,
      impl,
      opsPerSec: Math.round(opsPerSec),
      usPerPair: round(1e6 / opsPerSec, 1),
      vsFloor: round(rates['raw floor (txn put + txn delete)'] / opsPerSec),
    });
  }
  redisClient.disconnect();
}

async function hotKey(
  report: Report,
  cluster: EtcdCluster,
  members: number,
  service: (backend: EtcdLockBackend | RedisLockBackend) => LockService,
  redis: RedisServer,
): Promise<void> {
  const scenario = `etcd (${members} member${members > 1 ? 's' : ''}): hot key, 8 workers x 50 sections of 1 ms`;
  const hotKey: HotKeyScenario = { workers: 8, sections: 50, sectionMs: 1, scenario };
  const { workers, sections, sectionMs } = hotKey;
  // The floor drifts over a run, so it is measured on both sides of the hot-key rows, and the
  // lower one bounds them (as the Redis group does).
  const [holder, waiter] = [new Etcd3({ hosts: cluster.endpoints }), new Etcd3({ hosts: cluster.endpoints })];
  const floorKey = 'floor/handoff';
  let deleted: (() => void) | undefined;
  const watcher = await waiter.watch().key(floorKey).only('delete').create();
  watcher.on('delete', () => deleted?.());
  const handoffOnce = async () => {
    await holder.put(floorKey).value('holder');
    return async () => {
      const event = new Promise<void>((resolve) => (deleted = resolve));
      await Promise.all([holder.delete().key(floorKey), event]);
    };
  };
  const floorBefore = await measureHandoffFloor(handoffOnce, sectionMs);
  const rows: { impl: string; elapsed: number; waits: number[]; inside: number[]; ours: boolean }[] = [];
  const run = async (impl: string, lockFor: (worker: number) => LockOnce, ours = true) => {
    const key = `hot:${impl}`;
    const rounds = (count: number, waits: number[], inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(() => lockFor(w)(key), count, sectionMs, waits, inside)));
    await rounds(5, [], []); // warm: connections, watch streams, JIT
    const waits: number[] = [];
    const inside: number[] = [];
    const started = performance.now();
    await rounds(sections, waits, inside);
    rows.push({ impl, elapsed: performance.now() - started, waits, inside, ours });
  };
  const viaService = (locks: LockService) => async (key: string) => {
    const handle = await locks.acquire(key, { wait: 60_000 });
    return () => handle.release();
  };
  // Every worker is its own "instance": a client and a service of its own.
  const perWorker = Array.from({ length: workers }, () => viaService(service(new EtcdLockBackend(cluster.endpoints))));
  await run('ours (8 instances)', (w) => perWorker[w]);
  const shared = viaService(service(new EtcdLockBackend(cluster.endpoints)));
  await run('ours (one instance, 8 callers)', () => shared);
  const redisClients = Array.from({ length: workers }, () => new Redis(redis.port, '127.0.0.1'));
  const redisWorkers = redisClients.map((client) => viaService(service(new RedisLockBackend(client))));
  await run('Redis backend (8 instances)', (w) => redisWorkers[w], false);
  for (const client of redisClients) client.disconnect();
  const floorAfter = await measureHandoffFloor(handoffOnce, sectionMs);
  const floor = floorBefore.p50Ms <= floorAfter.p50Ms ? floorBefore : floorAfter;
  const ours = await measureOurHandoff(
    service(new EtcdLockBackend(cluster.endpoints)),
    service(new EtcdLockBackend(cluster.endpoints)),
    'handoff:ours',
    sectionMs,
  );
  const oursAfterWait = await measureOurHandoffAfterWait(
    service(new EtcdLockBackend(cluster.endpoints)),
    service(new EtcdLockBackend(cluster.endpoints)),
    service(new EtcdLockBackend(cluster.endpoints)),
    'handoff:ours-after-wait',
    sectionMs,
  );
  await watcher.cancel();
  holder.close();
  waiter.close();
  for (const { impl, elapsed, waits, inside, ours } of rows) {
    const row = hotKeyRow(hotKey, impl, elapsed, waits, inside);
    report.add(ours ? againstHandoffFloor(row, hotKey, elapsed, inside, floor) : row);
  }
  report.add(handoffFloorRow(scenario, "handoff floor (delete, until the next waiter's watch has it)", floor));
  report.add(ourHandoffRow(scenario, 'ours, one hand-over between two instances (p50)', ours, floor));
  report.add(ourHandoffRow(scenario, 'ours, the same, the holder having waited (p50)', oursAfterWait, floor));
}
