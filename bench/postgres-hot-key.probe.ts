import 'reflect-metadata';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { LockService, PostgresLockBackend } from '../lib/index.js';
import { PostgresServer } from '../test/support/postgres-server.js';
import { cpuSecondsOf, median, timedSections } from './harness.js';

/**
 * A probe, not a bench group: where the time of a hand-over on a PostgreSQL hot key goes. On a
 * durable cluster of its own it runs, each measured alone:
 * - `pairs`: acquire + release of a free key, by one instance;
 * - `handovers`: one hand-over at a time between two instances (a holder, a waiter in line, then
 *   after 1 ms the release), timing the release's statement and the waiter's entry;
 * - `hot`: the bench's hot key, 8 instances x sections of 1 ms;
 * - `keys`: many keys, acquire + release of keys nobody else takes, by 1, 8 and 32 callers of one
 *   instance on a pool of 10 (the bench's many-keys row): whether the rate is bound by the server;
 * - `idle`: the backend's own functions called inside the server (a procedure, a transaction
 *   each), a release that hands the key over and one that frees it, back to back and after the
 *   session slept 0.2 ms and 1 ms: what a pause before a statement costs, without the client.
 * For all but `idle`: the server's CPU (every process of it, by role) and this process's per
 * lock, and with `statements` (pg_stat_statements: every statement, the functions' own too, with
 * their planning) the statements that took the server's time, per lock.
 *
 *   npx tsc -p tsconfig.json   # compiles it to dist-dev, as npm run bench does
 *   node dist-dev/bench/postgres-hot-key.probe.js [count=400] [statements]
 */
const count = Number(process.argv[2] ?? 400);
/** With `statements`, pg_stat_statements is loaded (it slows every statement down: leave it out for the timings). */
const statements = process.argv[3] === 'statements';
/** `PROBE_ONLY=pairs|handovers|keys|hot|idle`: one part alone (to profile it with `node --cpu-prof`). */
const only = process.env.PROBE_ONLY;

/**
 * The functions' time inside the server: a holder A, a waiter B in line, A's release (it hands the
 * key to B), then B's (it frees the key), each in a transaction of its own, `rounds` times, the
 * session sleeping `idle_seconds` before each release. Prints the µs per release, commit apart.
 */
async function releasesInsideTheServer(admin: pg.Client, rounds: number): Promise<void> {
  const fn = (name: string) => `"public"."distributed_locks_${name}"`;
  await admin.query(`
    CREATE OR REPLACE PROCEDURE probe_releases(rounds int, idle_seconds float8, INOUT spent float8[])
    LANGUAGE plpgsql AS $p$
    DECLARE
      t timestamptz;
      us CONSTANT float8 := 1e6 / rounds;
    BEGIN
      -- A's release, which hands the key to B, then B's, which frees it: each its run, then its commit.
      spent := '{0, 0, 0, 0}';
      FOR i IN 1 .. rounds LOOP
        PERFORM ${fn('acquire')}(ARRAY['idle'], 'A', 30000, 30000, false, 'probe_a', NULL, NULL);
        COMMIT;
        PERFORM ${fn('acquire')}(ARRAY['idle'], 'B', 30000, 30000, true, 'probe_b', NULL, NULL);
        COMMIT;
        FOR k IN 0 .. 1 LOOP
          PERFORM pg_sleep(idle_seconds);
          t := clock_timestamp();
          PERFORM ${fn('release')}(ARRAY['idle'], (ARRAY['A', 'B'])[k + 1]);
          spent[2 * k + 1] := spent[2 * k + 1] + extract(epoch FROM clock_timestamp() - t) * us;
          t := clock_timestamp();
          COMMIT;
          spent[2 * k + 2] := spent[2 * k + 2] + extract(epoch FROM clock_timestamp() - t) * us;
        END LOOP;
      END LOOP;
    END $p$`);
  console.log(`\n## the functions inside the server, ${rounds} rounds each (µs per release, then its commit)`);
  for (const idle of [0, 0.0002, 0.001, 0]) {
    const { rows } = await admin.query('CALL probe_releases($1, $2, NULL)', [rounds, idle]);
    const [handing, handingCommit, freeing, freeingCommit] = (rows[0].spent as number[]).map((value) => value.toFixed(1));
    console.log(
      `after ${idle * 1000} ms idle: a release that hands over ${handing} + ${handingCommit}, one that frees ${freeing} + ${freeingCommit}`,
    );
  }
}

/** A backend that says when an attempt of its own was answered "wait": its caller stands in line. */
class TappedBackend extends PostgresLockBackend {
  private onLine: (() => void) | undefined;

  joinedLine(): Promise<void> {
    return new Promise((resolve) => (this.onLine = resolve));
  }

  override async tryAcquire(...args: Parameters<PostgresLockBackend['tryAcquire']>): ReturnType<PostgresLockBackend['tryAcquire']> {
    const result = await super.tryAcquire(...args);
    if (!result.acquired) this.onLine?.();
    return result;
  }
}

/** The server's processes by what they do: the LISTEN connections, the others, and PostgreSQL's own. */
async function roles(admin: pg.Client, postmaster: number): Promise<Map<number, string>> {
  const { rows } = await admin.query(
    `SELECT pid, CASE WHEN backend_type <> 'client backend' THEN 'the server''s own processes'
                      WHEN query LIKE 'LISTEN%' THEN 'LISTEN connections' ELSE 'the pools'' connections' END AS role
       FROM pg_stat_activity WHERE pid <> pg_backend_pid()`,
  );
  return new Map([[postmaster, "the server's own processes"], ...rows.map((row) => [Number(row.pid), String(row.role)] as const)]);
}

function cpuByRole(pids: Map<number, string>): Map<string, number> {
  const byRole = new Map<string, number>();
  for (const [pid, role] of pids) {
    try {
      byRole.set(role, (byRole.get(role) ?? 0) + cpuSecondsOf(pid));
    } catch {
      // gone meanwhile
    }
  }
  return byRole;
}

async function measured(name: string, locks: number, server: PostgresServer, admin: pg.Client, run: () => Promise<void>): Promise<void> {
  if (statements) await admin.query('SELECT pg_stat_statements_reset()');
  const pids = await roles(admin, server.pid!);
  const before = { at: performance.now(), self: process.cpuUsage(), byRole: cpuByRole(pids) };
  await run();
  // Connections made during the run (a LISTEN connection is made at its backend's first wait).
  for (const [pid, role] of await roles(admin, server.pid!)) if (!pids.has(pid)) pids.set(pid, role);
  const spent = [...cpuByRole(pids)].map(([role, seconds]) => [role, (seconds - (before.byRole.get(role) ?? 0)) * 1000] as const);
  const elapsed = performance.now() - before.at;
  const self = process.cpuUsage(before.self);
  const serverMs = spent.reduce((sum, [, ms]) => sum + ms, 0);
  const per = (value: number) => Math.round((value / locks) * 1000) / 1000;
  console.log(`\n## ${name}: ${locks} locks in ${Math.round(elapsed)} ms, ${per(elapsed)} ms each`);
  const busy = (ms: number) => (ms / elapsed).toFixed(2);
  console.log(
    `CPU per lock: this process ${per((self.user + self.system) / 1000)} ms, the server ${per(serverMs)} ms ` +
      `(cores busy: ${busy((self.user + self.system) / 1000)} and ${busy(serverMs)})`,
  );
  console.log(`  of it: ${spent.map(([role, ms]) => `${role} ${per(ms)} ms`).join(', ')}`);
  if (!statements) return;
  const { rows } = await admin.query(
    `SELECT calls, total_exec_time, total_plan_time, plans, toplevel, query FROM pg_stat_statements
      WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time + total_plan_time DESC LIMIT 18`,
  );
  console.log('calls/lock  exec µs/lock  plan µs/lock  plans  top  statement');
  for (const row of rows) {
    const us = (ms: number) => ((ms * 1000) / locks).toFixed(1).padStart(12);
    const query = String(row.query).replace(/\s+/g, ' ').slice(0, 110);
    console.log(
      `${(Number(row.calls) / locks).toFixed(2).padStart(10)}${us(row.total_exec_time)}${us(row.total_plan_time)}${String(row.plans).padStart(7)}  ${row.toplevel ? 'y' : 'n'}    ${query}`,
    );
  }
}

async function main(): Promise<void> {
  const server = await PostgresServer.start({
    durable: true,
    settings: statements
      ? { shared_preload_libraries: 'pg_stat_statements', 'pg_stat_statements.track': 'all', 'pg_stat_statements.track_planning': 'on' }
      : {},
  });
  const url = await server.createDatabase('probe');
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  if (statements) await admin.query('CREATE EXTENSION pg_stat_statements');
  const pools = Array.from({ length: 8 }, () => new pg.Pool({ connectionString: url, max: 2 }));
  const backends = pools.map((pool) => new TappedBackend(pool));
  const services = backends.map((backend) => new LockService(backend));
  try {
    const [a] = services;
    for (let i = 0; i < 50; i++) await (await a.acquire('warm')).release();
    const freed: number[] = [];
    if (!only || only === 'pairs')
      await measured('acquire + release of a free key', count, server, admin, async () => {
        for (let i = 0; i < count; i++) {
          const handle = await a.acquire('pair');
          await sleep(1);
          const sent = performance.now();
          await handle.release();
          freed.push(performance.now() - sent);
        }
      });
    if (freed.length) console.log(`release's statement p50 ${median(freed).toFixed(3)} ms`);

    const releases: number[] = [];
    const entries: number[] = [];
    if (!only || only === 'handovers')
      await measured('one hand-over between two instances', count, server, admin, async () => {
        let held = await a.acquire('handover');
        let waiter = 1;
        for (let i = 0; i < count; i++) {
          const inLine = backends[waiter].joinedLine();
          const next = services[waiter].acquire('handover', { wait: 30_000 });
          await inLine;
          await sleep(1);
          const sent = performance.now();
          const released = held.release().then(() => releases.push(performance.now() - sent));
          held = await next;
          entries.push(performance.now() - sent);
          await released;
          waiter = 1 - waiter;
        }
        await held.release();
      });
    if (releases.length)
      console.log(`release's statement p50 ${median(releases).toFixed(3)} ms; the waiter in, p50 ${median(entries).toFixed(3)} ms`);

    if (!only || only === 'keys') {
      const many = new PostgresLockBackend(url);
      const locks = new LockService(many);
      for (const callers of [1, 8, 32]) {
        let next = 0;
        await measured(`many keys, ${callers} caller(s) of one instance`, count * 4, server, admin, () =>
          Promise.all(
            Array.from({ length: callers }, async () => {
              while (next < count * 4) await (await locks.acquire(`many:${next++}`)).release();
            }),
          ).then(() => undefined),
        );
      }
      await locks.onApplicationShutdown();
      await many.close();
    }
    if (!only || only === 'idle') await releasesInsideTheServer(admin, count);
    if (only && only !== 'hot') return;
    const lock = (w: number) => async () => {
      const handle = await services[w].acquire('hot', { wait: 60_000 });
      return () => handle.release();
    };
    const rounds = (sections: number, inside: number[]) =>
      Promise.all(services.map((_, w) => timedSections(lock(w), sections, 1, [], inside)));
    await rounds(5, []);
    const sections = Math.ceil(count / 8);
    const inside: number[] = [];
    const started = performance.now();
    await measured(`hot key, 8 instances x ${sections} sections of 1 ms`, sections * 8, server, admin, () =>
      rounds(sections, inside).then(() => undefined),
    );
    const perSection = (performance.now() - started) / (sections * 8);
    const real = inside.reduce((x, y) => x + y, 0) / inside.length;
    console.log(`a hand-over every ${(perSection - real).toFixed(3)} ms (sections of ${real.toFixed(3)} ms)`);
  } finally {
    for (const service of services) await service.onApplicationShutdown();
    for (const backend of backends) await backend.close();
    for (const pool of pools) await pool.end();
    await admin.end();
    await server.stop();
  }
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
