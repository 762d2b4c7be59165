import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisLockBackend } from 'nest-distributed-lock';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import request from 'supertest';
import { lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import { PostgresServer } from '../support/postgres-server.js';
import { RedisServer } from '../support/redis-server.js';
import { until } from '../support/wait.js';
import { runDemo, ShopProcess } from './compiled-app.js';

/**
 * Several shop processes sharing one PostgreSQL and one Redis, both the harness's own (a fresh
 * cluster and a fresh database per run): the distributed case the in-process backend cannot show.
 */
describe('the shop as several processes on PostgreSQL and Redis', () => {
  let postgres: PostgresServer;
  let redis: RedisServer;

  beforeAll(async () => {
    [postgres, redis] = await Promise.all([PostgresServer.start(), RedisServer.start()]);
  }, 60_000);

  afterAll(async () => {
    await Promise.all([postgres?.stop(), redis?.stop()]);
  });

  it('npm run demo -- --instances 3: unsafe oversells, locked and atomic sell exactly the stock', async () => {
    const databaseUrl = await postgres.createDatabase();
    const { stdout, summary } = await runDemo(['--instances', '3'], { DATABASE_URL: databaseUrl, REDIS_URL: redis.url }, 90_000);
    expect(stdout).toMatch(/Shop: 3 instances; PostgreSQL at .*; Redis at /);
    expect(stdout.match(/ {2}instance \d: http:\/\/127\.0\.0\.1:\d+ \(pid \d+\)/g)).toHaveLength(3);
    expect(summary).toMatchObject({ demo: 'oversell', stock: 100, buyers: 500 });
    expect(summary.results.unsafe.oversold).toBeGreaterThan(0);
    expect(summary.results.locked).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
    expect(summary.results.atomic).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });

    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    try {
      // Three processes started at once against an empty database: migrations ran exactly once.
      expect((await db.query('SELECT id FROM schema_migrations ORDER BY id')).rows).toEqual([{ id: 1 }, { id: 2 }, { id: 3 }]);
      expect((await db.query("SELECT count(*)::int AS n FROM products WHERE name NOT LIKE 'Demo %'")).rows[0].n).toBe(3);
      // Every sale a buyer was told about is an order, on every endpoint.
      const orders = await db.query<{ endpoint: string; n: number }>('SELECT endpoint, count(*)::int AS n FROM orders GROUP BY endpoint');
      expect(Object.fromEntries(orders.rows.map((r) => [r.endpoint, r.n]))).toEqual({
        unsafe: summary.results.unsafe.sold,
        locked: 100,
        atomic: 100,
      });
    } finally {
      await db.end();
    }
  }, 120_000);

  it('with REDLOCK_URLS (3 masters, no fencing tokens) locked still sells exactly the stock, unfenced', async () => {
    const masters = await Promise.all([RedisServer.start(), RedisServer.start(), RedisServer.start()]);
    try {
      const databaseUrl = await postgres.createDatabase();
      const { stdout, summary } = await runDemo(
        ['--instances', '2', '--buyers', '200', '--stock', '50'],
        { DATABASE_URL: databaseUrl, REDLOCK_URLS: masters.map((m) => m.url).join(',') },
        90_000,
      );
      expect(stdout).toMatch(/Redlock over 3 Redis masters/);
      expect(summary.results.unsafe.oversold).toBeGreaterThan(0);
      expect(summary.results.locked).toMatchObject({ sold: 50, stockLeft: 0, oversold: 0 });
      expect(summary.results.atomic).toMatchObject({ sold: 50, stockLeft: 0, oversold: 0 });
      const db = new pg.Client({ connectionString: databaseUrl });
      await db.connect();
      try {
        const tokens = await db.query(
          "SELECT count(*)::int AS n, count(fencing_token)::int AS fenced FROM orders WHERE endpoint = 'locked'",
        );
        expect(tokens.rows[0]).toEqual({ n: 50, fenced: 0 });
      } finally {
        await db.end();
      }
    } finally {
      await Promise.all(masters.map((m) => m.stop()));
    }
  }, 120_000);

  describe('a holder paused past its lease (SIGSTOP), then resumed', () => {
    let shops: ShopProcess[] = [];
    let db: pg.Client;
    let databaseUrl: string;
    /** To hold a product's lock from the test, as a third process would, and to look at its line of waiters. */
    let locks: RedisLockBackend;
    let admin: Redis;

    beforeAll(async () => {
      locks = new RedisLockBackend(redis.url);
      admin = new Redis(redis.url);
      databaseUrl = await postgres.createDatabase();
      // A short lease, so the paused holder loses it quickly; the watchdog still extends it
      // for every holder that runs.
      const env = { DATABASE_URL: databaseUrl, REDIS_URL: redis.url, LOCK_TTL_MS: '1500' };
      shops = await Promise.all([ShopProcess.start(env), ShopProcess.start(env)]);
      db = new pg.Client({ connectionString: databaseUrl });
      await db.connect();
    }, 60_000);

    afterAll(async () => {
      await db?.end();
      admin?.disconnect();
      await locks?.close();
      await Promise.all(shops.map((shop) => shop.stop()));
    });

    it('has its fenced write refused after the next holder sold: no lost update', async () => {
      const [paused, other] = shops;
      const { body: product } = await request(paused.url).post('/products').send({ name: 'fenced', stock: 10 }).expect(201);

      // Hold the first buyer between "took the lock" and "read the stock": its SELECT waits for a
      // table lock. It checks that the product exists before it takes the lock, so the table is
      // locked only once that check is behind it: while it waits in line for the product's lock,
      // held from here. Then it gets the lock, and its stock read waits.
      const key = `lock:product:${product.id}`;
      const holder = randomBytes(16).toString('hex');
      expect(await locks.tryAcquire([key], holder, 30_000, { willWait: false })).toMatchObject({ acquired: true });
      const stale = request(paused.url)
        .post(`/products/${product.id}/purchase`)
        .send({ quantity: 1 })
        .then((r) => r);
      await until(async () => (await admin.zcard(lockKeyLayout(key).line)) === 1, 10_000, 'the first buyer to wait in line for the lock');
      const blocker = new pg.Client({ connectionString: databaseUrl });
      await blocker.connect();
      await blocker.query('BEGIN');
      await blocker.query('LOCK TABLE products IN ACCESS EXCLUSIVE MODE');
      await locks.release([key], holder);
      await until(
        // From another connection: inside a transaction, pg_stat_activity is a frozen snapshot.
        async () =>
          (await db.query("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT stock FROM products%'"))
            .rowCount === 1,
        10_000,
        'the first buyer to wait for the stock read, holding the product lock',
      );
      // Freeze its process there, as a long GC pause or a stopped VM would.
      paused.pause();
      await blocker.query('COMMIT');
      await blocker.end();

      // Its lease lapses in Redis; the other process takes the lock with a newer token and sells.
      const fresh = await request(other.url).post(`/products/${product.id}/purchase`).send({ quantity: 1 }).expect(201);
      expect(fresh.body.stockLeft).toBe(9);

      // The paused process wakes up, with the stock it read (10) and its old token, and writes.
      paused.resume();
      const refused = await stale;
      expect(refused.status).toBe(409);
      expect(refused.body).toMatchObject({ code: 'STALE_FENCING_TOKEN', productId: product.id, lastToken: fresh.body.fencingToken });
      expect(refused.body.fencingToken).toBeLessThan(fresh.body.fencingToken);

      const row = await db.query('SELECT stock, last_token::float8 AS "lastToken" FROM products WHERE id = $1', [product.id]);
      expect(row.rows[0]).toEqual({ stock: 9, lastToken: fresh.body.fencingToken });
      expect((await db.query('SELECT count(*)::int AS n FROM orders WHERE product_id = $1', [product.id])).rows[0].n).toBe(1);
    }, 30_000);
  });
});
