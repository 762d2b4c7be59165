import 'reflect-metadata';
import mysql from 'mysql2/promise';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { LockService, MysqlLockBackend, PostgresLockBackend } from '../lib/index.js';
import { MariadbServer } from '../test/support/mariadb-server.js';
import { PostgresServer } from '../test/support/postgres-server.js';
import { compareRates, hotKeyRow, type HotKeyScenario, percentile, round, timedSections, type Report } from './harness.js';

/** One acquire+release pair, or a hot-key worker's lock: resolves to the release. */
type LockOnce = (key: string) => Promise<() => Promise<unknown>>;

/**
 * MySQL backend on a MariaDB of the bench's own: next to the least a lease table can cost (one
 * INSERT, one DELETE), GET_LOCK, and the PostgreSQL backend for the hot key; then its wake-up (a
 * look every wakeUpInterval) against the service's polling alone.
 */
export async function mysqlBench(report: Report): Promise<void> {
  report.note('mysql: uncontended pairs, hot key, wake-ups, many keys (starts its own MariaDB and PostgreSQL)');
  const server = await MariadbServer.start();
  const postgres = await PostgresServer.start({ durable: true });
  const { url } = await server.createDatabase('bench');
  const pgUrl = await postgres.createDatabase('bench');
  const closers: (() => Promise<unknown>)[] = [];
  const service = (backend: MysqlLockBackend | PostgresLockBackend, options: ConstructorParameters<typeof LockService>[1] = {}) => {
    const created = new LockService(backend, options);
    closers.push(() => created.onApplicationShutdown());
    return created;
  };
  const connection = async () => {
    const created = await mysql.createConnection(url);
    closers.push(() => created.end());
    return created;
  };
  try {
    const admin = await connection();
    await admin.query(
      'CREATE TABLE floor_locks (lock_key VARBINARY(255) PRIMARY KEY, owner VARBINARY(32) NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE = InnoDB',
    );
    await uncontended(report, url, connection, service);
    await hotKey(report, url, pgUrl, connection, service);
    await wakeUps(report, url, service);
    await manyKeys(report, url, service);
  } finally {
    for (const close of closers) await close();
    await server.stop();
    await postgres.stop();
  }
}

async function uncontended(
  report: Report,
  url: string,
  connection: () => Promise<mysql.Connection>,
  service: (backend: MysqlLockBackend) => LockService,
): Promise<void> {
  const floor = await connection();
  const named = await connection();
  let token = 0;
  const backend = new MysqlLockBackend(mysql.createPool({ uri: url, connectionLimit: 1 }));
  const ours = service(new MysqlLockBackend(mysql.createPool({ uri: url, connectionLimit: 1 })));
  const impls: Record<string, LockOnce> = {
    // The least a lease table costs: one INSERT to take the key, one DELETE to free it.
    'raw floor (INSERT + DELETE)': async (key) => {
      const owner = String(++token);
      await floor.query('INSERT INTO floor_locks VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)', [key, owner]);
      return () => floor.query('DELETE FROM floor_locks WHERE lock_key = ? AND owner = ?', [key, owner]);
    },
    'GET_LOCK (one connection)': async (key) => {
      const [[row]] = await named.query<mysql.RowDataPacket[]>('SELECT GET_LOCK(?, 0) AS got', [key]);
      if (Number(row.got) !== 1) throw new Error('GET_LOCK: busy');
      return () => named.query('SELECT RELEASE_LOCK(?)', [key]);
    },
    // The backend alone (its two procedures, no handle, lease or watchdog): what the protocol costs.
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
  for (const [impl, opsPerSec] of Object.entries(rates)) {
    report.add({
      scenario: 'mysql: uncontended acquire+release (serial, one connection)',
      impl,
      opsPerSec: Math.round(opsPerSec),
      usPerPair: round(1e6 / opsPerSec, 1),
      vsFloor: round(rates['raw floor (INSERT + DELETE)'] / opsPerSec),
    });
  }
}

const HOT_KEY: HotKeyScenario = { workers: 8, sections: 50, sectionMs: 1, scenario: 'mysql: hot key, 8 workers x 50 sections of 1 ms' };

async function hotKey(
  report: Report,
  url: string,
  pgUrl: string,
  connection: () => Promise<mysql.Connection>,
  service: (backend: MysqlLockBackend | PostgresLockBackend) => LockService,
): Promise<void> {
  const { workers, sections, sectionMs } = HOT_KEY;
  const run = async (impl: string, lockFor: (worker: number) => LockOnce) => {
    const key = `hot:${impl}`;
    const rounds = (count: number, waits: number[], inside: number[]) =>
      Promise.all(Array.from({ length: workers }, (_, w) => timedSections(() => lockFor(w)(key), count, sectionMs, waits, inside)));
    await rounds(5, [], []); // warm: connections, procedures
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
  // Every worker is its own "instance": a pool and a service of its own.
  const perWorker = Array.from({ length: workers }, () =>
    viaService(service(new MysqlLockBackend(mysql.createPool({ uri: url, connectionLimit: 2 })))),
  );
  await run('ours (8 instances)', (w) => perWorker[w]);
  const shared = viaService(service(new MysqlLockBackend(mysql.createPool({ uri: url, connectionLimit: 2 }))));
  await run('ours (one instance, 8 callers)', () => shared);
  // Blocking GET_LOCK, a connection per worker: the server's own queue of named locks.
  const named = await Promise.all(Array.from({ length: workers }, () => connection()));
  await run('GET_LOCK (8 connections)', (w) => async (key) => {
    await named[w].query('SELECT GET_LOCK(?, 60)', [key]);
    return () => named[w].query('SELECT RELEASE_LOCK(?)', [key]);
  });
  const postgresWorkers = Array.from({ length: workers }, () => viaService(service(new PostgresLockBackend(pgUrl))));
  await run('PostgreSQL backend (8 instances)', (w) => postgresWorkers[w]);
}

/**
 * From the holder's release() answered to the waiter holding the lock: the backend's look every
 * wakeUpInterval, and the service's polling alone (a backend without watch()).
 */
async function wakeUps(report: Report, url: string, service: (backend: MysqlLockBackend, options?: object) => LockService): Promise<void> {
  class PollingOnly extends MysqlLockBackend {}
  Object.assign(PollingOnly.prototype, { watch: undefined, watching: undefined });
  const holder = service(new MysqlLockBackend(url));
  const measure = async (impl: string, waiter: LockService) => {
    const latencies: number[] = [];
    for (let i = 0; i < 40; i++) {
      const held = await holder.acquire(`wake:${impl}`, { ttl: 30_000 });
      const waiting = waiter.acquire(`wake:${impl}`, { wait: 30_000, ttl: 30_000 });
      await sleep(50 + Math.random() * 50);
      await held.release();
      const released = performance.now();
      const handle = await waiting;
      latencies.push(performance.now() - released);
      await handle.release();
    }
    latencies.sort((a, b) => a - b);
    report.add({
      scenario: 'mysql: wake-up, release() to the waiter holding the lock (40 hand-overs)',
      impl,
      p50Ms: round(latencies[Math.floor(latencies.length / 2)], 1),
      p90Ms: round(percentile(latencies, 90), 1),
      maxMs: round(latencies[latencies.length - 1], 1),
    });
  };
  const waiterTimeout = 10_000;
  await measure('look every 25 ms (default)', service(new MysqlLockBackend(url, { waiterTimeout }), { pollInterval: 2_000 }));
  await measure('look every 10 ms', service(new MysqlLockBackend(url, { waiterTimeout, wakeUpInterval: 10 }), { pollInterval: 2_000 }));
  await measure('polling only, pollInterval 100 ms', service(new PollingOnly(url, { waiterTimeout }), { pollInterval: 100 }));
  await measure('polling only, pollInterval 500 ms (default)', service(new PollingOnly(url, { waiterTimeout }), { pollInterval: 500 }));
}

/** 8 callers of one instance, each on keys of its own: how many acquisitions a second the tables take. */
async function manyKeys(report: Report, url: string, service: (backend: MysqlLockBackend) => LockService): Promise<void> {
  const locks = service(new MysqlLockBackend(url));
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
  report.add({ scenario: 'mysql: many keys, acquire+release', impl: 'ours, 1 caller', opsPerSec: Math.round(rates.ours) });
  report.add({ scenario: 'mysql: many keys, acquire+release', impl: 'ours, 8 callers (pool of 10)', opsPerSec: Math.round(concurrent) });
}
