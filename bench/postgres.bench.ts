import 'reflect-metadata';
import { Redis } from 'ioredis';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { LockService, PostgresLockBackend, RedisLockBackend } from '../lib/index.js';
import { PostgresServer } from '../test/support/postgres-server.js';
import { RedisServer } from '../test/support/redis-server.js';
import {
  againstHandoffFloor,
  compareRates,
  handoffFloorRow,
  type HandoffFloor,
  hotKeyRow,
  type HotKeyScenario,
  measureHandoffFloor,
  measureOurHandoff,
  ourHandoffRow,
  round,
  timedSections,
  type Report,
} from './harness.js';
import { until } from '../test/support/wait.js';

/** One acquire+release pair, or a hot-key worker's lock: resolves to the release. */
type LockOnce = (key: string) => Promise<() => Promise<unknown>>;

/**
 * PostgreSQL backend on a cluster of the bench's own (durable commits, as in production): next to
 * the least a lease table can cost (one INSERT, one DELETE), session advisory locks, and the Redis
 * backend on a redis-server of its own for the hot key.
 */
export async function postgresBench(report: Report): Promise<void> {
  report.note('postgres: uncontended pairs, hot key, many keys (starts its own PostgreSQL and redis-server)');
  const server = await PostgresServer.start({ durable: true });
  const redis = await RedisServer.start();
  const url = await server.createDatabase('bench');
  const pools: pg.Pool[] = [];
  const pool = (max = 10) => {
    const created = new pg.Pool({ connectionString: url, max });
    pools.push(created);
    return created;
  };
  const closers: (() => Promise<unknown>)[] = [];
  const service = (backend: PostgresLockBackend | RedisLockBackend) => {
    const created = new LockService(backend);
    closers.push(() => created.onApplicationShutdown());
    return created;
  };
  try {
    const admin = pool(2);
    await admin.query('CREATE TABLE floor_locks (key text COLLATE "C" PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL)');
    await uncontended(report, url, pool, service);
    await hotKey(report, url, pool, service, redis);
    await manyKeys(report, url, service);
  } finally {
    for (const close of closers) await close();
    for (const p of pools) await p.end();
    await redis.stop();
    await server.stop();
  }
}

async function uncontended(
  report: Report,
  url: string,
  pool: (max?: number) => pg.Pool,
  service: (backend: PostgresLockBackend) => LockService,
): Promise<void> {
  const floor = pool(1);
  let token = 0;
  const advisory = new pg.Client({ connectionString: url });
  await advisory.connect();
  const backend = new PostgresLockBackend(pool(1));
  const ours = service(new PostgresLockBackend(pool(1)));
  const impls: Record<string, LockOnce> = {
    // The least a lease table costs: one INSERT to take the key, one DELETE to free it.
    'raw floor (INSERT + DELETE)': async (key) => {
      const owner = String(++token);
      await floor.query(`INSERT INTO floor_locks VALUES ($1, $2, now() + interval '30 s')`, [key, owner]);
      return () => floor.query('DELETE FROM floor_locks WHERE key = $1 AND owner = $2', [key, owner]);
    },
    'session advisory lock': async (key) => {
      const { rows } = await advisory.query('SELECT pg_try_advisory_lock(hashtext($1)) AS got', [key]);
      if (!rows[0].got) throw new Error('advisory: busy');
      return () => advisory.query('SELECT pg_advisory_unlock(hashtext($1))', [key]);
    },
    // The backend alone (its two functions, no handle, lease or watchdog): what the protocol costs.
    'ours (backend only)': async (key) => {
      const owner = `owner-${++token}`;
      if (!(await backend.tryAcquire([key], owner, 30_000, { willWait: false })).acquired) throw new Error('ours: busy');
      return () => backend.release([key], owner);
    },
    ours: async (key) => {
      const handle = await ours.acquire(key, { wait: 60_000 });
      return () => handle.release();
    },
  };
  const rates = await compareRates(
    Object.fromEntries(Object.entries(impls).map(([impl, lock]) => [impl, async () => (await lock(`pair:${impl}`))()])),
    { rounds: 5, ms: 600, warmupMs: 300 },
  );
  await backend.close();
  await advisory.end();
  for (const [impl, opsPerSec] of Object.entries(rates)) {
    report.add({
      scenario: 'postgres: uncontended acquire+release (serial, one connection)',
      impl,
      opsPerSec: Math.round(opsPerSec),
      usPerPair: round(1e6 / opsPerSec, 1),
      vsFloor: round(rates['raw floor (INSERT + DELETE)'] / opsPerSec),
    });
  }
}

const HOT_KEY: HotKeyScenario = { workers: 8, sections: 50, sectionMs: 1, scenario: 'postgres: hot key, 8 workers x 50 sections of 1 ms' };

async function hotKey(
  report: Report,
  url: string,
  pool: (max?: number) => pg.Pool,
  service: (backend: PostgresLockBackend | RedisLockBackend) => LockService,
  redis: RedisServer,
): Promise<void> {
  const { workers, sections, sectionMs, scenario } = HOT_KEY;
  // Both floors drift over a run: measured on both sides of the hot-key rows, the lower one kept.
  const floors = await handoffFloors(url, sectionMs);
  const rows: { impl: string; elapsed: number; waits: number[]; inside: number[]; floor?: 'notify' | 'advisory' }[] = [];
  const run = async (impl: string, lockFor: (worker: number) => LockOnce, floor?: 'notify' | 'advisory') => {
    const key = `hot:${impl}`;
    const rounds = (count: number, waits: number[], inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(() => lockFor(w)(key), count, sectionMs, waits, inside)));
    await rounds(5, [], []); // warm: connections, LISTEN, JIT
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
  // Every worker is its own "instance": a pool, a LISTEN connection and a service of its own.
  const perWorker = Array.from({ length: workers }, () => viaService(service(new PostgresLockBackend(pool(2)))));
  await run('ours (8 instances)', (w) => perWorker[w], 'notify');
  const shared = viaService(service(new PostgresLockBackend(pool(2))));
  await run('ours (one instance, 8 callers)', () => shared, 'notify');
  // Blocking session advisory locks, a connection per worker: PostgreSQL's own lock queue.
  const advisory = await Promise.all(
    Array.from({ length: workers }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      return client;
    }),
  );
  await run(
    'session advisory lock (8 connections)',
    (w) => async (key) => {
      await advisory[w].query('SELECT pg_advisory_lock(hashtext($1))', [key]);
      return () => advisory[w].query('SELECT pg_advisory_unlock(hashtext($1))', [key]);
    },
    'advisory',
  );
  await Promise.all(advisory.map((client) => client.end()));
  const redisClients = Array.from({ length: workers }, () => new Redis(redis.port, '127.0.0.1'));
  const redisWorkers = redisClients.map((client) => viaService(service(new RedisLockBackend(client))));
  await run('Redis backend (8 instances)', (w) => redisWorkers[w]);
  for (const client of redisClients) client.disconnect();
  const after = await handoffFloors(url, sectionMs);
  const lower = (a: HandoffFloor, b: HandoffFloor) => (a.p50Ms <= b.p50Ms ? a : b);
  const floor = { notify: lower(floors.notify, after.notify), advisory: lower(floors.advisory, after.advisory) };
  const ours = await measureOurHandoff(
    service(new PostgresLockBackend(pool(2))),
    service(new PostgresLockBackend(pool(2))),
    'handoff:ours',
    sectionMs,
  );
  for (const { impl, elapsed, waits, inside, floor: kind } of rows) {
    const row = hotKeyRow(HOT_KEY, impl, elapsed, waits, inside);
    report.add(kind ? againstHandoffFloor(row, HOT_KEY, elapsed, inside, floor[kind]) : row);
  }
  report.add(handoffFloorRow(scenario, 'handoff floor (a commit that notifies, until another connection has the message)', floor.notify));
  report.add(handoffFloorRow(scenario, 'handoff floor of advisory locks (unlock, until the blocked lock call returns)', floor.advisory));
  report.add(ourHandoffRow(scenario, 'ours, one hand-over between two instances (p50)', ours, floor.notify));
}

/**
 * The least a hand-over between two connections costs on this server, two ways. Ours tells the
 * next waiter by NOTIFY, which PostgreSQL sends when the releasing transaction commits: its floor
 * is a commit that writes the key's row and notifies, until another connection's LISTEN has the
 * message. A blocking advisory lock is woken inside the server: its floor is an unlock, until the
 * waiting connection's lock call returns.
 */
async function handoffFloors(url: string, sectionMs: number): Promise<{ notify: HandoffFloor; advisory: HandoffFloor }> {
  const [holder, waiter] = [new pg.Client({ connectionString: url }), new pg.Client({ connectionString: url })];
  await holder.connect();
  await waiter.connect();
  try {
    await holder.query("INSERT INTO floor_locks VALUES ('floor:handoff', 'holder', now()) ON CONFLICT DO NOTHING");
    await waiter.query('LISTEN floor_handoff');
    const notify = await measureHandoffFloor(
      async () => async () => {
        const heard = new Promise<void>((resolve) => waiter.once('notification', () => resolve()));
        const release = holder.query(
          "UPDATE floor_locks SET owner = 'next' WHERE key = 'floor:handoff'; SELECT pg_notify('floor_handoff', 'next')",
        );
        await Promise.all([release, heard]);
      },
      sectionMs,
    );
    await waiter.query('UNLISTEN floor_handoff');
    const key = 'floor:advisory';
    let waiterHolds = false;
    const advisory = await measureHandoffFloor(async () => {
      // The last round's waiter lets go first: not part of a hand-over.
      if (waiterHolds) await waiter.query('SELECT pg_advisory_unlock(hashtext($1))', [key]);
      await holder.query('SELECT pg_advisory_lock(hashtext($1))', [key]);
      const taken = waiter.query('SELECT pg_advisory_lock(hashtext($1))', [key]);
      const blocked = "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
      await until(async () => (await holder.query(blocked)).rows[0].n === 1, 5_000, 'the waiter to block on the advisory lock');
      return async () => {
        await Promise.all([holder.query('SELECT pg_advisory_unlock(hashtext($1))', [key]), taken]);
        waiterHolds = true;
      };
    }, sectionMs);
    await waiter.query('SELECT pg_advisory_unlock(hashtext($1))', [key]);
    return { notify, advisory };
  } finally {
    await holder.end();
    await waiter.end();
  }
}

/** 8 callers of one instance, each on keys of its own: how many acquisitions a second the table takes. */
async function manyKeys(report: Report, url: string, service: (backend: PostgresLockBackend) => LockService): Promise<void> {
  const locks = service(new PostgresLockBackend(url));
  let next = 0;
  const rates = await compareRates(
    {
      ours: async () => {
        const handle = await locks.acquire(`many:${next++ % 100_000}`);
        await handle.release();
      },
    },
    { rounds: 3, ms: 600, warmupMs: 300 },
  );
  // compareRates runs one caller; run 8 at once for the concurrent figure.
  const started = performance.now();
  let done = 0;
  await Promise.all(
    Array.from({ length: 8 }, async (_, caller) => {
      for (let i = 0; i < 300; i++) {
        const handle = await locks.acquire(`many:${caller}:${i}`);
        await handle.release();
        done++;
      }
    }),
  );
  const concurrent = (done * 1000) / (performance.now() - started);
  report.add({ scenario: 'postgres: many keys, acquire+release', impl: 'ours, 1 caller', opsPerSec: Math.round(rates.ours) });
  report.add({ scenario: 'postgres: many keys, acquire+release', impl: 'ours, 8 callers (pool of 10)', opsPerSec: Math.round(concurrent) });
}
