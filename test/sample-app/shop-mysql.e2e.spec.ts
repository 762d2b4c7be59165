import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { LockService, MysqlLockBackend } from 'nest-distributed-lock';
import mysql from 'mysql2/promise';
import { randomBytes } from 'node:crypto';
import request from 'supertest';
import { openMysqlDatabase } from '../../sample-app/mysql.database.js';
import { PriceListRepository } from '../../sample-app/price-list.repository.js';
import type { PriceList } from '../../sample-app/price-list.service.js';
import { ProductsRepository } from '../../sample-app/products.repository.js';
import { createShopApp } from '../../sample-app/shop.app.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { until } from '../support/wait.js';
import { runDemo, ShopProcess } from './compiled-app.js';

/**
 * LOCK_BACKEND=mysql: shop processes keep their data and their locks in one MariaDB, the harness's
 * own (never the machine's), with no Redis anywhere (runDemo and ShopProcess clear REDIS_URL and
 * REDLOCK_URLS). Each test has a database of its own on it.
 */
const mariadb = useMariadbServer({ truncate: false });

/** A new database on the file's server: the shop's URL (as the test user) and an administrator's pool on it. */
async function shopDatabase(): Promise<{ url: string; admin: mysql.Pool }> {
  const { name, url } = await mariadb.server.createDatabase('shop');
  const admin = mysql.createPool({ uri: mariadb.server.adminUrl(name), connectionLimit: 2 });
  mariadb.cleanup(() => admin.end());
  return { url, admin };
}

async function count(admin: mysql.Pool, sql: string, params: unknown[] = []): Promise<number> {
  const [[row]] = await admin.query<mysql.RowDataPacket[]>(sql, params);
  return Number(row.n);
}

describe('the shop as several processes with its data and its locks in MariaDB', () => {
  it('npm run demo -- --instances 3 with only a mysql:// DATABASE_URL: unsafe oversells, locked and atomic sell exactly the stock', async () => {
    const { url, admin } = await shopDatabase();
    const { stdout, summary } = await runDemo(['--instances', '3'], { DATABASE_URL: url, LOCK_BACKEND: 'mysql' }, 150_000);
    expect(stdout).toMatch(
      /Shop: 3 instances; MySQL at mysql:\/\/locks:\*\*\*@127\.0\.0\.1:\d+\/shop_\d+_\d+; locks in that MySQL \(MysqlLockBackend\)/,
    );
    expect(stdout.match(/ {2}instance \d: http:\/\/127\.0\.0\.1:\d+ \(pid \d+\)/g)).toHaveLength(3);
    expect(summary.results.unsafe.oversold).toBeGreaterThan(0);
    expect(summary.results.locked).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
    expect(summary.results.atomic).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });

    // Three processes started at once against an empty database: migrations ran exactly once.
    const [migrations] = await admin.query<mysql.RowDataPacket[]>('SELECT id FROM schema_migrations ORDER BY id');
    expect(migrations.map((row) => row.id)).toEqual([1, 2, 3]);
    expect(await count(admin, "SELECT COUNT(*) AS n FROM products WHERE name NOT LIKE 'Demo %'")).toBe(3);
    // Every sale a buyer was told about is an order, on every endpoint, and no stock went below zero.
    const [orders] = await admin.query<mysql.RowDataPacket[]>('SELECT endpoint, COUNT(*) AS n FROM orders GROUP BY endpoint');
    expect(Object.fromEntries(orders.map((row) => [row.endpoint, Number(row.n)]))).toEqual({
      unsafe: summary.results.unsafe.sold,
      locked: 100,
      atomic: 100,
    });
    // The locked sales were fenced by the lock backend's tokens: one each, all different, and the
    // product's last_token is the newest of them.
    const [[fenced]] = await admin.query<mysql.RowDataPacket[]>(
      "SELECT COUNT(fencing_token) AS n, COUNT(DISTINCT fencing_token) AS `distinct`, MAX(fencing_token) AS max, MAX(product_id) AS product FROM orders WHERE endpoint = 'locked'",
    );
    expect({ n: Number(fenced.n), distinct: Number(fenced.distinct) }).toEqual({ n: 100, distinct: 100 });
    expect(await count(admin, 'SELECT last_token AS n FROM products WHERE id = ?', [fenced.product])).toBe(Number(fenced.max));
    // Every process released what it held when it stopped.
    expect(await count(admin, 'SELECT COUNT(*) AS n FROM distributed_locks_holders WHERE expires_at > UTC_TIMESTAMP(6)')).toBe(0);
  }, 180_000);

  it('shops starting at once against an empty database migrate it once: the others wait for the first', async () => {
    const { url, admin } = await shopDatabase();
    const databases = await Promise.all(Array.from({ length: 6 }, () => openMysqlDatabase(url)));
    await Promise.all(databases.map((db) => db.close()));
    const [migrations] = await admin.query<mysql.RowDataPacket[]>('SELECT id FROM schema_migrations ORDER BY id');
    expect(migrations.map((row) => row.id)).toEqual([1, 2, 3]);
    expect(await count(admin, 'SELECT COUNT(*) AS n FROM products')).toBe(3);
    expect(await count(admin, 'SELECT COUNT(*) AS n FROM price_list_versions')).toBe(1);
  }, 60_000);

  it('a LOCK_BACKEND=mysql without a MySQL database stops the start and says what it needs', async () => {
    await expect(ShopProcess.start({ LOCK_BACKEND: 'mysql' })).rejects.toThrow(
      /The shop did not start: LOCK_BACKEND=mysql needs DATABASE_URL \(the shop's MySQL or MariaDB, .*\), which is not set\./,
    );
    await expect(ShopProcess.start({ DATABASE_URL: 'postgres://shop@127.0.0.1:1/shop', LOCK_BACKEND: 'mysql' })).rejects.toThrow(
      /The shop did not start: LOCK_BACKEND=mysql keeps the locks in the shop's database, so DATABASE_URL must be a mysql:\/\/ or mariadb:\/\/ URL; it is a postgres:\/\/ one\./,
    );
  }, 60_000);

  describe('a holder paused past its lease (SIGSTOP), then resumed', () => {
    let shops: ShopProcess[] = [];
    let url: string;
    let admin: mysql.Pool;
    /** To hold a product's lock from the test, as another process would. */
    let locks: MysqlLockBackend;

    beforeAll(async () => {
      const { name, url: shopUrl } = await mariadb.server.createDatabase('shop');
      url = shopUrl;
      admin = mysql.createPool({ uri: mariadb.server.adminUrl(name), connectionLimit: 4 });
      // A short lease, so the paused holder loses it quickly; the watchdog still extends it for
      // every holder that runs.
      const env = { DATABASE_URL: url, LOCK_BACKEND: 'mysql', LOCK_TTL_MS: '1500' };
      // One first, so that the lock tables exist before the test's own backend looks at them.
      shops = [await ShopProcess.start(env)];
      shops.push(...(await Promise.all([ShopProcess.start(env), ShopProcess.start(env)])));
      locks = new MysqlLockBackend(url);
    }, 60_000);

    afterAll(async () => {
      await locks?.close();
      await admin?.end();
      await Promise.all(shops.map((shop) => shop.stop()));
    });

    it('has its fenced write refused by the database after the next holder sold: no lost update', async () => {
      const [paused, other] = shops;
      const { body: product } = await request(paused.url).post('/products').send({ name: 'fenced', stock: 10 }).expect(201);

      // Hold the first buyer between "took the lock" and "read the stock": its SELECT waits for a
      // table lock. It checks that the product exists before it takes the lock, so the table is
      // locked only once it waits in line for the product's lock, held from here. Then it gets
      // the lock, and its stock read waits.
      const key = `lock:product:${product.id}`;
      const holder = randomBytes(16).toString('hex');
      expect(await locks.tryAcquire([key], holder, 30_000, { willWait: false })).toMatchObject({ acquired: true });
      const stale = request(paused.url)
        .post(`/products/${product.id}/purchase`)
        .send({ quantity: 1 })
        .then((r) => r);
      await until(
        async () => (await count(admin, 'SELECT COUNT(*) AS n FROM distributed_locks_waiters WHERE lock_key = ?', [key])) === 1,
        10_000,
        'the first buyer to wait in line for the lock',
      );
      const blocker = await admin.getConnection();
      try {
        await blocker.query('LOCK TABLES products WRITE');
        await locks.release([key], holder);
        await until(
          async () =>
            (await count(
              admin,
              "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE STATE LIKE 'Waiting for table%' AND INFO LIKE 'SELECT stock FROM products%'",
            )) === 1,
          10_000,
          'the first buyer to wait for the stock read, holding the product lock',
        );
        // Freeze its process there, as a long GC pause or a stopped VM would.
        paused.pause();
        await blocker.query('UNLOCK TABLES');
      } finally {
        blocker.release();
      }

      // Its lease lapses; another process takes the lock with a newer token and sells.
      const fresh = await request(other.url).post(`/products/${product.id}/purchase`).send({ quantity: 1 }).expect(201);
      expect(fresh.body.stockLeft).toBe(9);

      // The paused process wakes up, with the stock it read (10) and its old token, and writes.
      paused.resume();
      const refused = await stale;
      expect(refused.status).toBe(409);
      expect(refused.body).toMatchObject({ code: 'STALE_FENCING_TOKEN', productId: product.id, lastToken: fresh.body.fencingToken });
      expect(refused.body.fencingToken).toBeLessThan(fresh.body.fencingToken);

      const [[row]] = await admin.query<mysql.RowDataPacket[]>('SELECT stock, last_token FROM products WHERE id = ?', [product.id]);
      expect({ stock: row.stock, lastToken: Number(row.last_token) }).toEqual({ stock: 9, lastToken: fresh.body.fencingToken });
      expect(await count(admin, 'SELECT COUNT(*) AS n FROM orders WHERE product_id = ?', [product.id])).toBe(1);
    }, 30_000);

    it('sells, restocks and prices across the three processes, names stored byte for byte', async () => {
      const [first, second, third] = shops;
      // Names that MySQL's default collations would take for one ('a' = 'A' = 'á'), and a 4-byte character.
      const names = ['Vinyl a', 'Vinyl A', 'Vinyl á', 'Vinyl 🎵'];
      const created = [];
      for (const name of names) created.push((await request(first.url).post('/products').send({ name, stock: 5 }).expect(201)).body);
      for (const [index, product] of created.entries()) {
        expect(product).toMatchObject({ name: names[index], stock: 5, lastToken: 0 });
        expect((await request(second.url).get(`/products/${product.id}`).expect(200)).body.name).toBe(names[index]);
      }

      const id = created[0].id;
      // Ten concurrent buyers of 1 over three processes, stock 5: exactly 5 sold, 5 refused.
      const answers = await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          request(shops[i % 3].url)
            .post(`/products/${id}/purchase`)
            .send({ quantity: 1 }),
        ),
      );
      expect(answers.filter((r) => r.status === 201)).toHaveLength(5);
      expect(answers.filter((r) => r.status === 409).map((r) => r.body.code)).toEqual(Array(5).fill('OUT_OF_STOCK'));
      const restocked = await request(third.url).post(`/products/${id}/restock`).send({ quantity: 3 }).expect(200);
      expect(restocked.body.stock).toBe(3);
      expect(restocked.body.lastToken).toBeGreaterThan(
        Math.max(...answers.filter((r) => r.status === 201).map((r) => r.body.fencingToken)),
      );
      const atomic = await request(second.url).post(`/products/${id}/purchase/atomic`).send({ quantity: 2 }).expect(201);
      expect(atomic.body.stockLeft).toBe(1);

      // A rebuild of the price list, then a purchase that pays from it.
      await request(first.url).post('/prices/rebuild').expect(200);
      const prices = (await request(second.url).get('/prices').expect(200)).body;
      const version = prices.version;
      expect(version).toBeGreaterThan(0);
      const bought = await request(third.url).post(`/products/${created[1].id}/purchase`).send({ quantity: 1 }).expect(201);
      expect(bought.body.price).toMatchObject({ version });
    }, 30_000);
  });

  describe("the MySQL store's fence, in one process", () => {
    let app: INestApplication;
    let http: ReturnType<typeof request>;

    beforeAll(async () => {
      const { url } = await mariadb.server.createDatabase('shop');
      app = await createShopApp({ databaseUrl: url, lockBackend: 'mysql' }, false);
      await app.listen(0, '127.0.0.1');
      http = request(app.getHttpServer());
    }, 60_000);

    afterAll(async () => {
      await app?.close();
    });

    it('refuses every write whose token is older than the one that last wrote: sales, restocks, prices, the published version', async () => {
      const locks = app.get(LockService);
      const products = app.get(ProductsRepository);
      const prices = app.get(PriceListRepository);
      const { body: product } = await http.post('/products').send({ name: 'fenced writes', stock: 10 }).expect(201);

      // The token a holder paused past its lease would still carry: older than the next holder's.
      const stale = await locks.acquire(`product:${product.id}`);
      await stale.release();
      const sold = await http.post(`/products/${product.id}/purchase`).send({ quantity: 1 }).expect(201);
      expect(sold.body.fencingToken).toBeGreaterThan(stale.fencingToken!);
      expect(await products.writeStockFenced(product.id, 5, 5, stale.fencingToken!)).toBeUndefined();
      expect(await products.addStockFenced(product.id, 5, stale.fencingToken)).toBeUndefined();
      expect(await products.find(product.id)).toEqual({ ...product, stock: 9, lastToken: sold.body.fencingToken });
      expect(await products.orderCount(product.id)).toBe(1);

      const staleRebuild = await locks.acquire('price-list');
      await staleRebuild.release();
      const newer = (await http.post('/prices/rebuild').expect(200)).body as PriceList;
      expect(await prices.writePrice(product.id, 1, newer.version + 1, staleRebuild.fencingToken)).toBe(false);
      expect(await prices.publish(newer.version + 1, staleRebuild.fencingToken)).toBe(false);
      expect((await http.get('/prices').expect(200)).body).toEqual(newer);
    }, 30_000);
  });
});
