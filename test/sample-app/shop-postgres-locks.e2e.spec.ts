import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import pg from 'pg';
import { PostgresServer } from '../support/postgres-server.js';
import { compiledShop, runDemo, ShopProcess } from './compiled-app.js';

const run = promisify(execFile);

/**
 * LOCK_BACKEND=postgres: several shop processes keep their locks in the PostgreSQL they already
 * share, with no Redis anywhere (runDemo clears REDIS_URL and REDLOCK_URLS).
 */
describe('the shop as several processes with its locks in its own PostgreSQL', () => {
  let postgres: PostgresServer;

  beforeAll(async () => {
    postgres = await PostgresServer.start();
  }, 60_000);

  afterAll(async () => {
    await postgres?.stop();
  });

  it('npm run demo -- --instances 3 with only DATABASE_URL: unsafe oversells, locked and atomic sell exactly the stock', async () => {
    const databaseUrl = await postgres.createDatabase();
    const { stdout, summary } = await runDemo(['--instances', '3'], { DATABASE_URL: databaseUrl, LOCK_BACKEND: 'postgres' }, 150_000);
    expect(stdout).toMatch(/Shop: 3 instances; PostgreSQL at .*; locks in that PostgreSQL \(PostgresLockBackend\)/);
    expect(stdout.match(/ {2}instance \d: http:\/\/127\.0\.0\.1:\d+ \(pid \d+\)/g)).toHaveLength(3);
    expect(summary.results.unsafe.oversold).toBeGreaterThan(0);
    expect(summary.results.locked).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
    expect(summary.results.atomic).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });

    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    try {
      const orders = await db.query<{ endpoint: string; n: number }>('SELECT endpoint, count(*)::int AS n FROM orders GROUP BY endpoint');
      expect(Object.fromEntries(orders.rows.map((r) => [r.endpoint, r.n]))).toEqual({
        unsafe: summary.results.unsafe.sold,
        locked: 100,
        atomic: 100,
      });
      // The locked sales were fenced by tokens of this database's sequence: one each, all different,
      // none above the last the sequence handed out.
      const fenced = await db.query<{ n: number; distinct: number; max: string }>(
        "SELECT count(fencing_token)::int AS n, count(DISTINCT fencing_token)::int AS distinct, max(fencing_token)::text AS max FROM orders WHERE endpoint = 'locked'",
      );
      expect(fenced.rows[0]).toMatchObject({ n: 100, distinct: 100 });
      const sequence = await db.query<{ last: string }>('SELECT last_value::text AS last FROM distributed_locks_fencing_tokens');
      expect(BigInt(fenced.rows[0].max)).toBeLessThanOrEqual(BigInt(sequence.rows[0].last));
      // Every process released what it held when it stopped.
      expect((await db.query('SELECT count(*)::int AS n FROM distributed_locks WHERE expires_at > clock_timestamp()')).rows[0].n).toBe(0);
    } finally {
      await db.end();
    }
  }, 180_000);

  it('a LOCK_BACKEND it does not know stops the start with the values it takes, and opens nothing', async () => {
    const databaseUrl = await postgres.createDatabase();
    const env = { ...process.env, DATABASE_URL: databaseUrl, REDIS_URL: '', REDLOCK_URLS: '' };
    const demo = await run(process.execPath, [compiledShop('demo.js'), '--instances', '3'], {
      env: { ...env, LOCK_BACKEND: 'postgresql' },
    }).then(
      () => undefined,
      (error: { code: number; stdout: string; stderr: string }) => error,
    );
    expect(demo?.code).toBe(1);
    expect(demo?.stderr.trim()).toBe(
      "LOCK_BACKEND must be one of memory, redis, redlock, postgres, mysql (unset: redlock with REDLOCK_URLS, else redis with REDIS_URL, else memory), got 'postgresql'.",
    );
    expect(demo?.stdout).not.toMatch(/instance 1/);

    await expect(ShopProcess.start({ DATABASE_URL: databaseUrl, LOCK_BACKEND: 'redis-cluster' })).rejects.toThrow(
      /The shop did not start: LOCK_BACKEND must be one of memory, redis, redlock, postgres, mysql .*got 'redis-cluster'\./,
    );
    await expect(ShopProcess.start({ LOCK_BACKEND: 'postgres' })).rejects.toThrow(
      /The shop did not start: LOCK_BACKEND=postgres needs DATABASE_URL \(the shop's PostgreSQL, .*\), which is not set\./,
    );

    // Nothing was created: neither the shop's tables nor the lock tables.
    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    try {
      expect((await db.query("SELECT count(*)::int AS n FROM pg_tables WHERE schemaname = 'public'")).rows[0].n).toBe(0);
    } finally {
      await db.end();
    }
  }, 60_000);
});
