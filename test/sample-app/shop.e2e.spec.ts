import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { LockBackend, LockService } from 'nest-distributed-lock';
import { mkdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Browser } from 'playwright-core';
import { launchChromium } from '../support/chromium.js';
import request from 'supertest';
import { runDemo, type DemoEvent, type DemoSummary } from '../../sample-app/demo.runner.js';
import { ProductsRepository } from '../../sample-app/products.repository.js';
import { baseUrl, createShopApp } from '../../sample-app/shop.app.js';
import { until } from '../support/wait.js';

const SCREENSHOTS = resolve(import.meta.dirname, '../../.tmp');

/**
 * The shop in this process on its embedded defaults: PGlite in memory, in-process locks, with the
 * page's demo route switched on. One app for the whole file: starting the embedded database is the
 * slow part.
 */
describe('the shop, one process, embedded PostgreSQL', () => {
  let app: INestApplication;
  let http: ReturnType<typeof request>;

  beforeAll(async () => {
    app = await createShopApp({ demo: true }, false);
    await app.listen(0, '127.0.0.1');
    http = request(app.getHttpServer());
  }, 60_000);

  afterAll(async () => {
    await app?.close();
  });

  const newProduct = async (stock: number): Promise<number> => {
    const response = await http.post('/products').send({ name: 'test product', stock }).expect(201);
    return response.body.id;
  };

  describe('500 concurrent buyers of one item each, stock 100', () => {
    let summary: DemoSummary;
    const events: DemoEvent[] = [];
    const productIds: Record<string, number> = {};

    beforeAll(async () => {
      summary = await runDemo({
        baseUrls: [baseUrl(app)],
        buyers: 500,
        stock: 100,
        onEvent: (event) => {
          events.push(event);
          if (event.type === 'endpoint') productIds[event.endpoint] = event.productId;
        },
      });
    }, 60_000);

    it('unsafe (read, subtract, write back; no lock) oversells', () => {
      expect(summary.results.unsafe.oversold).toBeGreaterThan(0);
      expect(summary.results.unsafe.sold).toBeGreaterThan(100);
    });

    it('locked (@Locked + fenced write) sells exactly the stock, never more', () => {
      expect(summary.results.locked).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
    });

    it('atomic (the database decrements) sells exactly the stock, never more', () => {
      expect(summary.results.atomic).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
    });

    it('every sale the buyers were told about is an order in the database', async () => {
      const orders = app.get(ProductsRepository);
      for (const endpoint of ['unsafe', 'locked', 'atomic'] as const) {
        expect(await orders.orderCount(productIds[endpoint])).toBe(summary.results[endpoint].sold);
      }
    });

    it('reports progress while it runs, and every buyer got an answer that is a sale or "out of stock"', () => {
      const results = events.filter((e) => e.type === 'result');
      expect(results.map((e) => e.type === 'result' && [e.endpoint, e.failed, e.sold + e.outOfStock])).toEqual([
        ['unsafe', 0, 500],
        ['locked', 0, 500],
        ['atomic', 0, 500],
      ]);
      expect(events.filter((e) => e.type === 'progress').length).toBeGreaterThanOrEqual(3);
    });
  });

  describe('products', () => {
    it('has the seeded products and shows one by id', async () => {
      const list = await http.get('/products').expect(200);
      expect(list.body.map((p: { name: string }) => p.name)).toEqual(expect.arrayContaining(['Limited-edition vinyl', 'Signed poster']));
      const id = await newProduct(7);
      await http.get(`/products/${id}`).expect(200, { id, name: 'test product', stock: 7, lastToken: 0 });
    });

    it('sells through each endpoint, then answers 409 "out of stock" with a clear body', async () => {
      for (const path of ['purchase/unsafe', 'purchase', 'purchase/atomic']) {
        const id = await newProduct(2);
        const sale = await http.post(`/products/${id}/${path}`).send({ quantity: 2 }).expect(201);
        expect(sale.body).toMatchObject({ productId: id, quantity: 2, stockLeft: 0 });
        const refused = await http.post(`/products/${id}/${path}`).send({ quantity: 1 }).expect(409);
        expect(refused.body).toEqual({
          statusCode: 409,
          error: 'Conflict',
          code: 'OUT_OF_STOCK',
          message: `Out of stock: product ${id} has 0 left, 1 requested.`,
          productId: id,
          stock: 0,
          requested: 1,
        });
      }
    });

    it('a locked sale carries a fencing token, newer than the last one written', async () => {
      const id = await newProduct(5);
      const first = await http.post(`/products/${id}/purchase`).send({}).expect(201);
      const second = await http.post(`/products/${id}/purchase`).send({ quantity: 1 }).expect(201);
      expect(second.body.fencingToken).toBeGreaterThan(first.body.fencingToken);
      const product = await http.get(`/products/${id}`).expect(200);
      expect(product.body).toMatchObject({ stock: 3, lastToken: second.body.fencingToken });
    });

    it('restocks under the lock', async () => {
      const id = await newProduct(0);
      const restocked = await http.post(`/products/${id}/restock`).send({ quantity: 3 }).expect(200);
      expect(restocked.body).toMatchObject({ id, stock: 3 });
      expect(restocked.body.lastToken).toBeGreaterThan(0);
      await http.post(`/products/${id}/purchase`).send({ quantity: 3 }).expect(201);
    });
  });

  describe('bad input is refused', () => {
    it.each([0, -1, 1.5, 'two', '', null, 1_001, [1], { n: 1 }])('quantity %p: 400, nothing sold', async (quantity) => {
      const id = await newProduct(5);
      for (const path of ['purchase/unsafe', 'purchase', 'purchase/atomic']) {
        const response = await http.post(`/products/${id}/${path}`).send({ quantity }).expect(400);
        expect(response.body.message).toBe(`quantity must be a whole number from 1 to 1000, got ${JSON.stringify(quantity)}.`);
      }
      await http
        .get(`/products/${id}`)
        .expect(200)
        .expect((r) => expect(r.body.stock).toBe(5));
    });

    it.each([0, -5, 2.5, 'ten', 1_000_001, undefined])('restock quantity %p: 400, stock unchanged', async (quantity) => {
      const id = await newProduct(5);
      await http.post(`/products/${id}/restock`).send({ quantity }).expect(400);
      await http
        .get(`/products/${id}`)
        .expect(200)
        .expect((r) => expect(r.body.stock).toBe(5));
    });

    it.each(['abc', '0', '-3', '1.5', '99999999999'])('product id %p: 400', async (id) => {
      const response = await http.post(`/products/${id}/purchase`).send({ quantity: 1 }).expect(400);
      expect(response.body.message).toMatch(/^Product id must be a whole number/);
      await http.get(`/products/${id}`).expect(400);
    });

    it('an unknown product: 404 on every endpoint', async () => {
      for (const path of ['purchase/unsafe', 'purchase', 'purchase/atomic', 'restock']) {
        const response = await http.post(`/products/424242/${path}`).send({ quantity: 1 }).expect(404);
        expect(response.body).toEqual({
          statusCode: 404,
          error: 'Not Found',
          message: 'Product 424242 does not exist.',
          productId: 424242,
        });
      }
      await http.get('/products/424242').expect(404);
    });

    it('a body that is not JSON, and a product without a name: 400', async () => {
      const id = await newProduct(5);
      await http.post(`/products/${id}/purchase`).set('content-type', 'application/json').send('{"quantity": ').expect(400);
      await http.post('/products').send({ name: ' ', stock: 1 }).expect(400);
      await http.post('/products').send({ name: 'x', stock: -1 }).expect(400);
    });
  });

  describe('fencing: a holder whose lease ended cannot overwrite a newer sale', () => {
    /** The next readStock of `productId` returns its result only once `open()` is called. */
    function stallNextRead(productId: number) {
      const repository = app.get(ProductsRepository);
      const original = repository.readStock.bind(repository);
      let reached = false;
      let open!: () => void;
      const opened = new Promise<void>((resolve) => (open = resolve));
      repository.readStock = async (id: number) => {
        const stock = await original(id);
        if (id === productId) {
          repository.readStock = original;
          reached = true;
          await opened;
        }
        return stock;
      };
      return { reached: () => reached, open: () => open() };
    }

    /**
     * A holder paused past its lease (a long GC pause), in one process: a holder reads the stock and stalls; its lease ends
     * under it (here the backend drops it, as expiry during a long pause or a Redis failover would);
     * a second buyer takes the lock and sells; then the first one's write arrives.
     * shop-processes.e2e.spec.ts tells it with a real paused process (SIGSTOP) and a lapsed lease.
     */
    it('the stale holder gets 409 STALE_FENCING_TOKEN; only the newer sale is in the database', async () => {
      const id = await newProduct(10);
      const key = `lock:product:${id}`;
      const backend = app.get<LockBackend>(LockBackend);
      const stall = stallNextRead(id);

      const stale = http
        .post(`/products/${id}/purchase`)
        .send({ quantity: 1 })
        .then((r) => r);
      await until(stall.reached, 5_000, 'the first buyer to read the stock under the lock');
      const lease = await backend.inspect(key);
      expect(lease).toBeDefined();
      await backend.release([key], lease!.owner);
      expect(await app.get(LockService).isLocked(`product:${id}`)).toBe(false);

      const fresh = await http.post(`/products/${id}/purchase`).send({ quantity: 1 }).expect(201);
      expect(fresh.body.stockLeft).toBe(9);

      stall.open();
      const refused = await stale;
      expect(refused.status).toBe(409);
      expect(refused.body).toMatchObject({
        code: 'STALE_FENCING_TOKEN',
        productId: id,
        fencingToken: lease!.fencingToken,
        lastToken: fresh.body.fencingToken,
      });
      expect(refused.body.fencingToken).toBeLessThan(fresh.body.fencingToken);
      expect(refused.body.message).toMatch(/nothing was sold/);

      // Without the fence the stale write would land: stock 9 again, and two orders for one item.
      await http.get(`/products/${id}`).expect(200, { id, name: 'test product', stock: 9, lastToken: fresh.body.fencingToken });
      expect(await app.get(ProductsRepository).orderCount(id)).toBe(1);
    });

    it('the same stall on the unsafe endpoint loses a sale: what the fence prevents', async () => {
      const id = await newProduct(10);
      const stall = stallNextRead(id);
      const slow = http
        .post(`/products/${id}/purchase/unsafe`)
        .send({ quantity: 1 })
        .then((r) => r);
      await until(stall.reached, 5_000, 'the first buyer to read the stock');
      await http.post(`/products/${id}/purchase/unsafe`).send({ quantity: 1 }).expect(201);
      stall.open();
      expect((await slow).status).toBe(201);
      await http
        .get(`/products/${id}`)
        .expect(200)
        .expect((r) => expect(r.body.stock).toBe(9));
      expect(await app.get(ProductsRepository).orderCount(id)).toBe(2);
    });
  });

  describe('the page at /, in headless Chromium', () => {
    let browser: Browser;

    beforeAll(async () => {
      browser = await launchChromium();
    }, 60_000);

    afterAll(async () => {
      await browser?.close();
    });

    it('lists the products with their stock, runs the demo from its button and shows each result as it comes in', async () => {
      const { body: lamp } = await http.post('/products').send({ name: 'Desk lamp', stock: 12 }).expect(201);
      const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
      await page.goto(baseUrl(app));
      await expect(page.title()).resolves.toBe('Shop · nest-distributed-lock demo');
      const row = page.locator('#products tr', { hasText: 'Desk lamp' });
      await row.waitFor({ timeout: 10_000 });
      expect(await row.locator('td').allTextContents()).toEqual([String(lamp.id), 'Desk lamp', '12', '–']);

      await page.click('#run');
      // Results arrive one endpoint at a time: the unsafe card is filled while the others still run.
      await page.locator('.card[data-endpoint="unsafe"].bad, .card[data-endpoint="unsafe"].good').waitFor({ timeout: 30_000 });
      await page.locator('#status[data-state="done"]').waitFor({ timeout: 60_000 });

      const field = (endpoint: string, name: string) =>
        page.locator(`.card[data-endpoint="${endpoint}"] [data-field="${name}"]`).textContent();
      expect(Number(await field('unsafe', 'oversold'))).toBeGreaterThan(0);
      await expect(page.locator('.card[data-endpoint="unsafe"]').getAttribute('class')).resolves.toContain('bad');
      for (const endpoint of ['locked', 'atomic']) {
        expect(await field(endpoint, 'sold')).toBe('100');
        expect(await field(endpoint, 'stockLeft')).toBe('0');
        expect(await field(endpoint, 'oversold')).toBe('0');
        await expect(page.locator(`.card[data-endpoint="${endpoint}"]`).getAttribute('class')).resolves.toContain('good');
      }
      // The demo's products are at the top of the list now, sold out.
      const newest = page.locator('#products tr:first-child', { hasText: '· atomic' });
      await newest.waitFor({ timeout: 10_000 });
      expect(await newest.locator('td').nth(2).textContent()).toBe('0');

      mkdirSync(SCREENSHOTS, { recursive: true });
      const screenshot = join(SCREENSHOTS, 'shop-page.png');
      await page.screenshot({ path: screenshot });
      expect(statSync(screenshot).size).toBeGreaterThan(10_000);
    }, 90_000);

    it('links to the lock board, which shows the locks live', async () => {
      const page = await browser.newPage({ viewport: { width: 1100, height: 600 } });
      await page.goto(baseUrl(app));
      await page.click('#lock-board');
      await page.locator('#status[data-state="live"]').waitFor({ timeout: 10_000 });
      await expect(page.title()).resolves.toBe('Locks · nest-distributed-lock');
      await expect(page.locator('#backend').textContent()).resolves.toBe('memory');
    }, 30_000);
  });
});
