import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { LockBackend } from 'nest-distributed-lock';
import request from 'supertest';
import { DATABASE, type Database } from '../../sample-app/database.provider.js';
import { createShopApp } from '../../sample-app/shop.app.js';
import type { ShopConfig } from '../../sample-app/shop.config.js';
import { PostgresServer } from '../support/postgres-server.js';
import { RedisServer } from '../support/redis-server.js';

/** Largest PostgreSQL `integer`, the range of the stock column. */
const MAX_STOCK = 2_147_483_647;

/** A shop to attack, and what it runs on. */
interface Setup {
  name: string;
  start(): Promise<{ config: ShopConfig; locksLeftFor(productId: number): Promise<string[]>; stop(): Promise<void> }>;
}

const setups: Setup[] = [
  {
    name: 'embedded PostgreSQL (PGlite), in-process locks',
    start: async () => ({ config: {}, locksLeftFor: async () => [], stop: async () => undefined }),
  },
  {
    // PostgreSQL refuses what PGlite refuses, but through another driver: both must answer 400.
    name: 'PostgreSQL and Redis',
    start: async () => {
      const [postgres, redis] = await Promise.all([PostgresServer.start(), RedisServer.start()]);
      const client = new Redis(redis.url);
      return {
        config: { databaseUrl: await postgres.createDatabase(), redisUrl: redis.url },
        // Any key of a product's lock: the lock itself, its fencing counter, its line of waiters.
        locksLeftFor: async (productId) => (await client.keys('*')).filter((key) => key.includes(`product:${productId}`)),
        stop: async () => {
          client.disconnect();
          await Promise.all([postgres.stop(), redis.stop()]);
        },
      };
    },
  },
];

describe.each(setups)('the shop refuses hostile input cleanly, on $name', (setup) => {
  let app: INestApplication;
  let http: ReturnType<typeof request>;
  let backing: Awaited<ReturnType<Setup['start']>>;

  beforeAll(async () => {
    backing = await setup.start();
    app = await createShopApp(backing.config, false);
    await app.listen(0, '127.0.0.1');
    http = request(app.getHttpServer());
  }, 60_000);

  afterAll(async () => {
    await app?.close();
    await backing?.stop();
  });

  /** Everything a request could have changed: every product row, and how many orders there are. */
  const databaseState = async () => {
    const db = app.get<Database>(DATABASE);
    const products = await db.query('SELECT id, name, stock, last_token::text AS last_token FROM products ORDER BY id');
    const orders = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM orders');
    return { products: products.rows, orders: orders.rows[0].n };
  };

  const newProduct = async (stock: number): Promise<number> =>
    (await http.post('/products').send({ name: 'test product', stock }).expect(201)).body.id;

  describe('product names', () => {
    it.each([
      ['NUL', '\u0000', 'U+0000'],
      ['bell', '\u0007', 'U+0007'],
      ['escape (terminal colours)', '\u001b[31m', 'U+001B'],
      ['tab', '\t', 'U+0009'],
      ['line feed', '\n', 'U+000A'],
      ['carriage return', '\r', 'U+000D'],
      ['delete', '\u007f', 'U+007F'],
      ['C1 next line', '\u0085', 'U+0085'],
      ['C1 control', '\u009b', 'U+009B'],
    ])('a name with a control character (%s): 400 naming it, nothing stored', async (_what, character, codePoint) => {
      const before = await databaseState();
      const name = `Desk${character}lamp`;
      const response = await http.post('/products').send({ name, stock: 1 }).expect(400);
      expect(response.body).toEqual({
        statusCode: 400,
        error: 'Bad Request',
        message: `name must not contain control characters (line breaks, tabs, NUL, ...); found ${codePoint} at position 5.`,
      });
      expect(await databaseState()).toEqual(before);
    });

    it.each([
      ['an unpaired high surrogate', '\ud800'],
      ['an unpaired low surrogate', '\udfff'],
    ])('a name with %s (not Unicode text): 400, nothing stored', async (_what, character) => {
      const before = await databaseState();
      // Sent as JSON escapes: a JSON encoder would replace the lone surrogate with U+FFFD.
      const body = `{"name": "Desk${JSON.stringify(character).slice(1, -1)}lamp", "stock": 1}`;
      const response = await http.post('/products').set('content-type', 'application/json').send(body).expect(400);
      expect(response.body.message).toBe(
        `name must be valid Unicode text; found an unpaired surrogate U+${character.charCodeAt(0).toString(16).toUpperCase()} at position 5.`,
      );
      expect(await databaseState()).toEqual(before);
    });

    it('names in any script, with emoji and their joiners, are fine', async () => {
      for (const name of ['Café ünïcode', 'Чайник', '茶壶', '👩‍💻 mug', 'x']) {
        const created = await http.post('/products').send({ name, stock: 1 }).expect(201);
        await http.get(`/products/${created.body.id}`).expect(200, { id: created.body.id, name, stock: 1, lastToken: 0 });
      }
    });
  });

  describe('stock stays inside its column', () => {
    it('a restock that would take the stock past 2147483647: 400 saying how much fits, stock unchanged', async () => {
      const id = await newProduct(0);
      await app.get<Database>(DATABASE).query('UPDATE products SET stock = $2 WHERE id = $1', [id, MAX_STOCK - 5]);
      const before = await databaseState();
      const response = await http.post(`/products/${id}/restock`).send({ quantity: 6 }).expect(400);
      expect(response.body).toEqual({
        statusCode: 400,
        error: 'Bad Request',
        code: 'STOCK_LIMIT',
        message: `Restocking product ${id} by 6 would take its stock from ${MAX_STOCK - 5} past ${MAX_STOCK}, the most it can hold; at most 5 more fit.`,
        productId: id,
        stock: MAX_STOCK - 5,
        requested: 6,
        limit: MAX_STOCK,
      });
      expect(await databaseState()).toEqual(before);

      // Up to the limit itself is fine.
      const full = await http.post(`/products/${id}/restock`).send({ quantity: 5 }).expect(200);
      expect(full.body).toMatchObject({ id, stock: MAX_STOCK });
      await http.post(`/products/${id}/restock`).send({ quantity: 1 }).expect(400);
      await http.post(`/products/${id}/purchase`).send({ quantity: 1 }).expect(201);
    });

    it.each([2 ** 31, 2 ** 53, 1e300, '99999999999999999999'])('restock quantity %p: 400, stock unchanged', async (quantity) => {
      const id = await newProduct(5);
      const before = await databaseState();
      const response = await http.post(`/products/${id}/restock`).send({ quantity }).expect(400);
      expect(response.body.message).toBe(`quantity must be a whole number from 1 to 1000000, got ${JSON.stringify(quantity)}.`);
      expect(await databaseState()).toEqual(before);
    });
  });

  describe('a body that is not a JSON object', () => {
    const routes = (id: number) => [
      `/products/${id}/purchase/unsafe`,
      `/products/${id}/purchase`,
      `/products/${id}/purchase/atomic`,
      `/products/${id}/restock`,
      '/products',
    ];

    it.each(['[1]', '[{"quantity": 1}]', '[]', '[{"name": "x", "stock": 1}]'])(
      '%s on every route that takes a body: 400, nothing sold or stored',
      async (body) => {
        const id = await newProduct(5);
        const before = await databaseState();
        for (const route of routes(id)) {
          const response = await http.post(route).set('content-type', 'application/json').send(body);
          expect({ route, status: response.status, body: response.body }).toEqual({
            route,
            status: 400,
            body: {
              statusCode: 400,
              error: 'Bad Request',
              message: 'The request body must be a JSON object, such as {"quantity": 1}; got an array.',
            },
          });
        }
        expect(await databaseState()).toEqual(before);
      },
    );

    it('no body at all still means the defaults (one item)', async () => {
      const id = await newProduct(5);
      await http.post(`/products/${id}/purchase`).expect(201);
      await http.post(`/products/${id}/purchase/atomic`).send({}).expect(201);
    });
  });

  describe('an unknown product', () => {
    it('answers 404 before taking its lock: nothing left behind in the lock backend', async () => {
      const tryAcquire = jest.spyOn(app.get<LockBackend>(LockBackend), 'tryAcquire');
      try {
        const unknown = 1_000_000 + Math.floor(Math.random() * 1_000_000_000);
        for (const path of ['purchase', 'restock']) {
          await http.post(`/products/${unknown}/${path}`).send({ quantity: 1 }).expect(404);
        }
        expect(tryAcquire).not.toHaveBeenCalled();
        expect(await backing.locksLeftFor(unknown)).toEqual([]);

        // A known product still sells under its lock.
        const id = await newProduct(1);
        await http.post(`/products/${id}/purchase`).send({ quantity: 1 }).expect(201);
        expect(tryAcquire).toHaveBeenCalledWith([`lock:product:${id}`], expect.any(String), expect.any(Number), expect.anything());
      } finally {
        tryAcquire.mockRestore();
      }
    });
  });
});
